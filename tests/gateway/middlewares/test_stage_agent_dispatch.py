"""The stages one by one through the whole pipeline: self filter, admission, errors, dispatch."""

from __future__ import annotations

import asyncio
import logging

import pytest

from gateway.context import TurnContext
from gateway.messages import TIMEOUT_NOTICE
from gateway.middlewares.channel_policy import PolicyCache
from gateway.pipeline import Handler, build_pipeline
from gateway.types import AgentResult, Reply
from tests.fakes.inmemory import ConstantAgent, InMemoryConnector, PipelineRig, rig_config


class FailingAgent:
    """Raises from inside the agent, with the user's text in the message."""

    async def respond(self, turn: TurnContext) -> AgentResult:
        raise ValueError(f"cannot handle {turn.message.text}")

    async def aclose(self) -> None:
        """Nothing to close."""


class StuckAgent:
    """Never answers; `started` is set once a turn is inside the agent."""

    def __init__(self) -> None:
        self.started = asyncio.Event()

    async def respond(self, turn: TurnContext) -> AgentResult:
        self.started.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        """Nothing to close."""


async def rig_with(
    yaml_text: str = "", agent: object | None = None
) -> tuple[PipelineRig, ConstantAgent]:
    constant = ConstantAgent("hi")
    rig = PipelineRig(rig_config(yaml_text), {"parrot": agent or constant})  # type: ignore[dict-item]
    await rig.start()
    return rig, constant


async def test_self_filter_by_author_id_not_name() -> None:
    rig, agent = await rig_with()
    connector = rig.connector()
    await connector.push(connector.message("me", sender_id=connector.bot_user_id, sender_name="x"))
    await connector.push(connector.message("not me", sender_id="U_OTHER", sender_name="parrot"))
    assert [m.text for m in agent.turns] == ["not me"]
    assert rig.metrics.value("refusals_total", stage="self_filter", reason="self") == 1


@pytest.mark.parametrize(
    ("mode", "message", "answered"),
    [
        ("all", {}, True),
        ("none", {"mentions_bot": True}, False),
        ("mentions", {}, False),
        ("mentions", {"mentions_bot": True}, True),
        ("mentions", {"reply_to_bot": True}, True),
        ("mentions", {"is_direct": True}, True),
    ],
)
async def test_respond_to_humans(mode: str, message: dict[str, bool], answered: bool) -> None:
    rig, agent = await rig_with(f"policy: {{respond_to: {{humans: {mode}}}}}")
    connector = rig.connector()
    await connector.push(connector.message("hello", **message))  # type: ignore[arg-type]
    assert bool(agent.turns) is answered


@pytest.mark.parametrize(
    ("mode", "message", "answered"),
    [
        ("all", {}, True),
        ("none", {"mentions_bot": True}, False),
        ("mentions", {}, False),
        ("mentions", {"mentions_bot": True}, True),
        ("mentions", {"is_direct": True}, True),
        # A platform's reply feature adds an automatic mention: not a mention from a bot.
        ("mentions", {"reply_to_bot": True}, False),
    ],
)
async def test_issue3_respond_to_bots_and_auto_reply_mention(
    mode: str, message: dict[str, bool], answered: bool
) -> None:
    rig, agent = await rig_with(f"policy: {{respond_to: {{bots: {mode}}}}}")
    connector = rig.connector()
    await connector.push(
        connector.message("hello", sender_id="U_B", sender_is_bot=True, **message)  # type: ignore[arg-type]
    )
    assert bool(agent.turns) is answered


async def test_issue3_unknown_botness_is_treated_as_bot() -> None:
    # On a platform that cannot tell bots from people, a sender reported as a person is
    # still treated as a bot (fail closed): the bot rules of admission apply to it.
    agent = ConstantAgent("hi")
    rig = PipelineRig(rig_config("policy: {respond_to: {bots: none}}"), {"parrot": agent})
    rig.connectors["parrot"] = connector = InMemoryConnector("parrot", knows_bots=False)
    await rig.start()
    await connector.push(connector.message("who am I", sender_id="U_UNKNOWN", is_direct=True))
    assert agent.turns == []
    assert rig.metrics.value("refusals_total", stage="admission", reason="bots_off") == 1
    # The connector's own word "bot" is kept on a platform that does tell.
    known, _ = await rig_with("policy: {respond_to: {bots: none}}")
    told = known.connector()
    await told.push(told.message("beep", sender_id="U_BOT", sender_is_bot=True))
    assert known.metrics.value("refusals_total", stage="admission", reason="bots_off") == 1


async def test_issue3_unknown_botness_charges_the_pair_budget_and_gets_no_notice() -> None:
    agent = ConstantAgent(None)
    config = rig_config("policy: {bot_loop: {max_events_per_window: 1}}")
    rig = PipelineRig(config, {"parrot": agent})
    rig.connectors["parrot"] = connector = InMemoryConnector("parrot", knows_bots=False)
    await rig.start()
    for _ in range(2):
        await connector.push(connector.message("hey @parrot", mentions_bot=True))
    # The first is a bot turn: its silence gets no notice (a person's would). The second
    # is over the pair budget: the only thing posted is the cooldown notice.
    assert [turn.sender_is_bot for turn in agent.turns] == [True]
    [posted] = connector.texts()
    assert posted.startswith("Loop guard: pausing replies between parrot and alice")


async def test_admission_refusals_feed_recent_refusals() -> None:
    rig, _ = await rig_with("policy: {respond_to: {humans: mentions}}")
    connector = rig.connector()
    await connector.push(connector.message("hello"))
    [refusal] = rig.recent.recent("room:C1")
    assert (refusal.stage, refusal.code) == ("admission", "not_addressed")


async def test_issue3_agent_that_raises_does_not_crash(caplog: pytest.LogCaptureFixture) -> None:
    rig, _ = await rig_with(agent=FailingAgent())
    connector = rig.connector()
    with caplog.at_level(logging.INFO):
        result = await connector.push(connector.message("private words"))
    assert result is None
    assert connector.sent == []
    assert rig.metrics.value("errors_total", stage="agent_dispatch") == 1
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1
    line = errors[0].getMessage()
    assert "ValueError" in line
    assert "agent_dispatch" in line
    assert "private words" not in line
    assert errors[0].exc_info is None
    # The gateway keeps working afterwards.
    rig.agents["parrot"] = ConstantAgent("fine")
    await connector.push(connector.message("again"))
    assert connector.texts() == ["fine"]


async def test_issue3_agent_timeout_answers_with_notice() -> None:
    rig, _ = await rig_with("pipeline: {turn_timeout_seconds: 0.01}", agent=StuckAgent())
    connector = rig.connector()
    await connector.push(connector.message("hello"))
    assert connector.texts() == [TIMEOUT_NOTICE]
    assert rig.metrics.value("errors_total", stage="agent_dispatch") == 1


async def test_typing_indicator_shown_when_supported() -> None:
    rig = PipelineRig(rig_config(), {"parrot": ConstantAgent("hi")}, typing=True)
    await rig.start()
    connector = rig.connector()
    await connector.push(connector.message("hello"))
    await asyncio.sleep(0)
    assert connector.typing_calls == ["C1"]


async def test_typing_indicator_failure_ignored() -> None:
    rig = PipelineRig(rig_config(), {"parrot": ConstantAgent("hi")}, typing=True)
    await rig.start()
    connector = rig.connector()

    async def broken_typing(channel_id: str, thread_id: str | None) -> None:
        raise RuntimeError("typing endpoint down")

    connector.typing = broken_typing  # type: ignore[method-assign]
    await connector.push(connector.message("hello"))
    await asyncio.sleep(0)
    assert connector.texts() == ["hi"]


async def test_typing_indicator_off() -> None:
    rig = PipelineRig(
        rig_config("pipeline: {typing_indicator: false}"),
        {"parrot": ConstantAgent("hi")},
        typing=True,
    )
    await rig.start()
    connector = rig.connector()
    await connector.push(connector.message("hello"))
    await asyncio.sleep(0)
    assert connector.typing_calls == []


async def test_reply_threads_and_references_the_message() -> None:
    rig, _ = await rig_with()
    connector = rig.connector()
    await connector.push(connector.message("hello", thread_id="T7", message_id="M7"))
    [sent] = connector.sent
    assert (sent.channel_id, sent.reply.thread_id, sent.reply.reply_to) == ("C1", "T7", "M7")


async def test_result_and_policy_set_on_the_turn() -> None:
    rig, _ = await rig_with(
        "channels: [{match: {channel: 'C9'}, policy: {bot_loop: {max_events_per_window: 3}}}]"
    )
    connector = rig.connector()
    await connector.push(connector.message("hello", channel_id="C9"))
    turn = rig.turns[-1]
    assert turn.result == AgentResult("hi")
    assert turn.policy.bot_loop.max_events_per_window == 3


async def test_issue3_metrics_expose_every_family_the_issue_names() -> None:
    rig, _ = await rig_with("policy: {respond_to: {humans: mentions}}")
    connector = rig.connector()
    connector.rate_limit_next(2.0)
    await connector.push(connector.message("hello", mentions_bot=True))
    await connector.push(connector.message("not for you"))
    await connector.push(connector.message("beep", sender_id="U_B", sender_is_bot=True))
    exposition = rig.metrics.render().decode()
    for sample in (
        'messages_in_total{platform="room"} 3.0',
        'replies_out_total{platform="room"} 2.0',
        'refusals_total{reason="not_addressed",stage="admission"} 1.0',
        'guard_decisions_total{code="ok",guard="bot_loop"} 1.0',
        'guard_decisions_total{code="sent",guard="silence"} 2.0',
        'delivery_retries_total{platform="room"} 1.0',
    ):
        assert sample in exposition, sample


async def test_messages_counted_in() -> None:
    rig, _ = await rig_with()
    connector = rig.connector()
    for _ in range(3):
        await connector.push(connector.message("hello"))
    assert rig.metrics.value("messages_in_total", platform="room") == 3
    assert rig.metrics.value("replies_out_total", platform="room") == 3
    assert b'messages_in_total{platform="room"} 3.0' in rig.metrics.render()


def test_policy_cache_shares_one_policy_per_source() -> None:
    config = rig_config(
        "channels: [{match: {channel: 'C9*'}, policy: {bot_loop: {max_events_per_window: 3}}}]"
    )
    cache = PolicyCache(config, max_rooms=2)
    default = cache.resolve("room", "A", None, {})
    assert default.policy is config.policy
    ruled = [cache.resolve("room", f"C9{i}", None, {}) for i in range(5)]
    assert all(entry is ruled[0] for entry in ruled)
    assert ruled[0].bot_loop.max_events_per_window == 3
    assert cache.derived(ruled[0].policy) is ruled[0]
    overridden = cache.resolve("room", "C91", None, {"bot_loop.max_events_per_window": 7})
    assert overridden.bot_loop.max_events_per_window == 7
    assert cache.resolve("room", "C91", None, {}) is ruled[0]


async def test_delivery_wraps_admin_so_acks_are_chunked_too() -> None:
    rig = PipelineRig(rig_config("admins: {room: [U_ALICE]}"), max_message_length=120)
    await rig.start()
    connector = rig.connector()
    await connector.push(connector.message("/loop help"))
    assert len(connector.sent) > 1
    assert all(len(text) <= 120 for text in connector.texts())


async def test_build_pipeline_is_an_onion() -> None:
    order: list[str] = []

    class Layer:
        def __init__(self, name: str) -> None:
            self.name = name

        async def __call__(self, ctx: TurnContext, call_next: Handler) -> Reply | None:
            order.append(f"{self.name} in")
            reply = await call_next(ctx)
            order.append(f"{self.name} out")
            return reply

    handler = build_pipeline([Layer("outer"), Layer("inner")])
    rig, _ = await rig_with()
    assert await handler(_turn(rig)) is None
    assert order == ["outer in", "inner in", "inner out", "outer out"]


async def test_issue3_a_middleware_short_circuits_by_not_calling_next() -> None:
    order: list[str] = []

    async def outer(ctx: TurnContext, call_next: Handler) -> Reply | None:
        order.append("outer in")
        reply = await call_next(ctx)
        order.append(f"outer out: {reply.text if reply else None}")
        return reply

    async def stop(ctx: TurnContext, call_next: Handler) -> Reply | None:
        order.append("stop")
        return Reply("stopped here")

    async def never(ctx: TurnContext, call_next: Handler) -> Reply | None:
        order.append("never")
        return await call_next(ctx)

    handler = build_pipeline([outer, stop, never])
    rig, agent = await rig_with()
    assert await handler(_turn(rig)) == Reply("stopped here")
    assert order == ["outer in", "stop", "outer out: stopped here"]
    assert agent.turns == []


def _turn(rig: PipelineRig) -> TurnContext:
    connector = rig.connector()
    return TurnContext(
        message=connector.message("x"),
        policy=rig.config.policy,
        state=rig.state,
        config=rig.config,
        bot=rig.config.bot("parrot"),
        connector=connector,
        agent=rig.agents["parrot"],
    )


class SwallowingAgent:
    """Ignores cancellation and answers late: a badly behaved agent."""

    async def respond(self, turn: TurnContext) -> AgentResult:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            return AgentResult("late answer")
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        """Nothing to close."""


async def test_cancelling_a_turn_from_outside_is_not_a_timeout() -> None:
    agent = StuckAgent()
    rig, _ = await rig_with(agent=agent)
    connector = rig.connector()
    turn = asyncio.create_task(connector.push(connector.message("hello")))
    await agent.started.wait()  # cancel inside the agent, where the deadline is kept
    turn.cancel()
    with pytest.raises(asyncio.CancelledError):
        await turn
    assert connector.texts() == []
    assert rig.metrics.value("errors_total", stage="agent_dispatch") == 0


async def test_agent_swallowing_the_timeout_leaves_the_task_clean() -> None:
    rig, _ = await rig_with("pipeline: {turn_timeout_seconds: 0.01}", agent=SwallowingAgent())
    connector = rig.connector()

    async def turn() -> int:
        await connector.push(connector.message("hello"))
        task = asyncio.current_task()
        assert task is not None
        return task.cancelling()

    assert await asyncio.create_task(turn()) == 0
    assert connector.texts() == ["late answer"]
