"""`policy.spend` for the gateway's openai agents, `/loop spend`, the notice and `/loop status`.

Real parts throughout: the Gateway runtime with its pipeline, an openai agent against the
fake LLM server on loopback, memory, SQLite and Redis state, and an injected wall clock.
The fake model reports 11 input and 7 output tokens a call; `m` costs $1 per 1,000 tokens
either way, so every answered call is charged 18 tokens, $0.018.
"""

from __future__ import annotations

import itertools
import logging
import re
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import pytest

from gateway.agents.completion_stream import read_completion
from gateway.agents.openai import OpenAIAgent
from gateway.agents.spend import AgentBudgets
from gateway.app import messages
from gateway.app.errors import ConfigError
from gateway.app.runtime import Gateway
from gateway.app.types import InboundMessage
from gateway.calls.store import MemoryCallStore
from gateway.cli.main import main
from gateway.config import Config, OpenAIAgentConfig, Policy, SpendSettings, parse_config
from gateway.delivery.sender import Delivery
from gateway.delivery.streaming import ReplyStream
from tests.fakes.editing_room import EditingRoom
from tests.fakes.inmemory import FakeClock
from tests.fakes.llm_upstream import INPUT_TOKENS, OUTPUT_TOKENS, FakeLLM
from tests.gateway.agents.agent_turns import make_turn
from tests.gateway.runtime_helpers import FakeConnector, FakePlatform

TOKEN = "spend-admin-token-0123456789"
START = datetime(2026, 3, 10, 12, 0, tzinfo=UTC).timestamp()
NEXT_DAY = datetime(2026, 3, 11, 0, 0, 1, tzinfo=UTC).timestamp()
CALL_TOKENS = INPUT_TOKENS + OUTPUT_TOKENS
CHAT = "/v1/chat/completions"
_ids = itertools.count(1)


def spend_config(llm: FakeLLM, spend: str | None, *, state: str = "") -> Config:
    """Two room bots on one openai agent, room memory off (every request the same size)."""
    policy = "" if spend is None else f"policy: {{spend: {spend}}}"
    text = f"""
http: {{host: 127.0.0.1, port: 0, admin_token: {TOKEN}}}
{state}
agents: {{helper: {{kind: openai, base_url: '{llm.base_url}', model: m}}}}
bots:
  - {{id: alpha, platform: room, agent: helper}}
  - {{id: beta, platform: room, agent: helper}}
admins: {{room: [u-admin]}}
pipeline: {{transcript: {{max_messages: 0}}}}
proxy: {{default_output_tokens: 10, prices: {{m: {{input_per_1k: 1.0, output_per_1k: 1.0}}}}}}
{policy}
"""
    return parse_config(text, env={})


def said(
    text: str, *, bot: str = "alpha", channel: str = "lobby", sender: str = "u-human"
) -> InboundMessage:
    """A message to one hosted bot; from `u-bot…` it comes from another bot."""
    return InboundMessage(
        platform="room",
        bot_id=bot,
        channel_id=channel,
        thread_id=None,
        message_id=f"m{next(_ids)}",
        sender_id=sender,
        sender_name=sender,
        sender_is_bot=sender.startswith("u-bot"),
        text=text,
        mentions_bot=True,
        bot_user_id=bot,
    )


def question(n: int) -> str:
    """Questions of one length, all different (the call guard sees no repeats)."""
    return f"question {n:03d}"


@asynccontextmanager
async def running(
    config: Config, clock: Callable[[], float], *, memory: bool = True
) -> AsyncIterator[tuple[Gateway, FakePlatform]]:
    """A started Gateway on the fake platform whose budgets run on `clock`."""
    platform = FakePlatform()
    calls = MemoryCallStore(clock=clock, wall_clock=clock) if memory else None
    gateway = Gateway(
        config,
        calls=calls,
        clock=clock,
        wall_clock=clock,
        connector_factory=platform,
        connect_timeout=5.0,
        start_backoff=(0.01, 0.05),
    )
    await gateway.start()
    try:
        yield gateway, platform
    finally:
        await gateway.stop(1.0)


def sent(connector: FakeConnector) -> list[str]:
    """What a bot posted, in order."""
    return [reply.text for _, reply in connector.sent]


def notices(connector: FakeConnector) -> list[str]:
    """The budget notices a bot posted."""
    return [text for text in sent(connector) if "model budget" in text]


async def until_refused(connector: FakeConnector, llm: FakeLLM, *, channel: str = "lobby") -> int:
    """Ask the bot until a question is not sent to the model; the model calls it took."""
    for n in range(20):
        before = len(llm.calls(CHAT))
        await connector.push(said(question(n), bot=connector.bot_id, channel=channel))
        if len(llm.calls(CHAT)) == before:
            return before
    raise AssertionError("the budget never refused a call")


async def command(connector: FakeConnector, text: str, channel: str = "lobby") -> str:
    """Run an admin command in the room; the bot's answer."""
    before = len(connector.sent)
    await connector.push(said(text, bot=connector.bot_id, channel=channel, sender="u-admin"))
    return "\n".join(reply.text for _, reply in connector.sent[before:])


@pytest.fixture
async def llm() -> AsyncIterator[FakeLLM]:
    async with FakeLLM() as fake:
        yield fake


async def test_issue14_spend_over_the_limit_refuses_and_tells_humans_once(llm: FakeLLM) -> None:
    clock = FakeClock(START)
    config = spend_config(llm, "{limit_tokens: 60}")
    async with running(config, clock) as (gateway, platform):
        alpha = platform.made["alpha"]
        calls = await until_refused(alpha, llm)
        assert 1 <= calls < 20
        assert notices(alpha) == [
            messages.spend_notice(per=("room",), limit="60 tokens", ends="2026-03-11 00:00 UTC")
        ]
        answered = len(alpha.sent)
        await alpha.push(said(question(50), sender="u-bot-other"))
        await alpha.push(said(question(51)))
        assert len(alpha.sent) == answered  # a bot gets nothing, a human no second notice
        assert len(llm.calls(CHAT)) == calls

        spend = await command(alpha, "/loop spend")
        assert f"room=room:lobby: {calls * CALL_TOKENS} tokens of 60 tokens" in spend
        assert "period ends 2026-03-11 00:00 UTC" in spend
        status = await command(alpha, "/loop status")
        assert "spend budget_exceeded (budget gateway:room:day:UTC room=room:lobby" in status
        assert "in 12 h" in status
        assert f"Spend: room=room:lobby: {calls * CALL_TOKENS} tokens of 60 tokens" in status
        refusals = gateway.metrics.value("refusals_total", stage="spend", reason="budget_exceeded")
        assert refusals == 3


async def test_issue14_a_bot_is_refused_in_silence_and_the_human_still_gets_the_notice(
    llm: FakeLLM, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="loopwarden.decision")
    clock = FakeClock(START)
    async with running(spend_config(llm, "{limit_tokens: 40}"), clock) as (_, platform):
        alpha = platform.made["alpha"]
        for n in range(20):
            before = len(llm.calls(CHAT))
            await alpha.push(said(question(n), sender="u-bot-other"))
            if len(llm.calls(CHAT)) == before:
                break
        assert notices(alpha) == []
        await alpha.push(said(question(90)))
        await alpha.push(said(question(91)))
        assert len(notices(alpha)) == 1
    refusals = [r for r in caplog.records if getattr(r, "stage", None) == "spend"]
    assert len(refusals) == 3
    line = refusals[0].getMessage()
    assert line.startswith("room:lobby spend refused budget_exceeded (budget gateway:room:day:UTC")
    assert "of 40 tokens" in line or "limit 40 tokens reached" in line
    assert "resets 2026-03-11 00:00 UTC, in 12 h" in line
    assert line.endswith("bot=alpha sender=u-bot-other")


async def test_issue14_the_next_period_admits_again_and_notices_again(llm: FakeLLM) -> None:
    clock = FakeClock(START)
    async with running(spend_config(llm, "{limit_usd: 0.04}"), clock) as (_, platform):
        alpha = platform.made["alpha"]
        first = await until_refused(alpha, llm)
        assert "$0.0400" in notices(alpha)[0]
        clock.now = NEXT_DAY
        second = await until_refused(alpha, llm)
        assert second > first
        assert len(notices(alpha)) == 2
        spend = await command(alpha, "/loop spend")
        assert f"${(second - first) * CALL_TOKENS / 1000:.4f} of $0.0400" in spend
        assert "period ends 2026-03-12 00:00 UTC" in spend


async def test_issue14_failed_calls_cost_nothing(llm: FakeLLM) -> None:
    clock = FakeClock(START)
    async with running(spend_config(llm, "{limit_tokens: 1000}"), clock) as (_, platform):
        alpha = platform.made["alpha"]
        llm.fail_next(400)
        await alpha.push(said(question(1)))
        assert sent(alpha) == [messages.PROVIDER_DOWN]
        llm.fail_next(500, 2, retry_after=0)
        await alpha.push(said(question(2)))
        assert len(llm.calls(CHAT)) == 4
        spend = await command(alpha, "/loop spend")
        assert f"room=room:lobby: {CALL_TOKENS} tokens of 1000 tokens" in spend


async def test_issue14_per_room_the_room_shares_one_group(llm: FakeLLM) -> None:
    clock = FakeClock(START)
    async with running(spend_config(llm, "{limit_tokens: 60}"), clock) as (_, platform):
        alpha, beta = platform.made["alpha"], platform.made["beta"]
        await until_refused(alpha, llm)
        before = len(llm.calls(CHAT))
        await beta.push(said(question(1), bot="beta"))
        assert len(llm.calls(CHAT)) == before
        assert notices(beta) == []  # the room was told once, by alpha
        await alpha.push(said(question(2), channel="hall"))
        assert len(llm.calls(CHAT)) == before + 1


async def test_issue14_per_bot_a_bot_carries_its_spend_across_rooms(llm: FakeLLM) -> None:
    clock = FakeClock(START)
    config = spend_config(llm, "{limit_tokens: 60, per: [bot]}")
    async with running(config, clock) as (_, platform):
        alpha, beta = platform.made["alpha"], platform.made["beta"]
        calls = await until_refused(alpha, llm)
        await alpha.push(said(question(1), channel="hall"))
        assert len(llm.calls(CHAT)) == calls
        assert len(notices(alpha)) == 2  # once in each room
        assert notices(alpha)[0].startswith("My model budget")
        await beta.push(said(question(2), bot="beta"))
        assert len(llm.calls(CHAT)) == calls + 1
        spend = await command(alpha, "/loop spend")
        assert f"bot=alpha: {calls * CALL_TOKENS} tokens of 60 tokens" in spend
        assert f"bot=beta: {CALL_TOKENS} tokens of 60 tokens" in spend


async def test_issue14_shadow_mode_sends_and_charges_what_it_would_refuse(llm: FakeLLM) -> None:
    clock = FakeClock(START)
    config = spend_config(llm, "{limit_tokens: 40, mode: shadow}")
    async with running(config, clock) as (_, platform):
        alpha = platform.made["alpha"]
        for n in range(4):
            await alpha.push(said(question(n)))
        assert len(llm.calls(CHAT)) == 4
        assert notices(alpha) == []
        spend = await command(alpha, "/loop spend")
        assert f"{4 * CALL_TOKENS} tokens of 40 tokens" in spend
        status = await command(alpha, "/loop status")
        assert re.search(r"spend: shadow: would have refused [1-9]", status)


@pytest.mark.parametrize("backend", ["sqlite", "redis"])
async def test_issue14_replicas_share_the_counters_and_the_notice(
    llm: FakeLLM, backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if backend == "sqlite":
        state = f"state: {{backend: sqlite, path: '{tmp_path / 'state.sqlite3'}'}}"
    else:
        url = request.getfixturevalue("redis_url")
        state = f"state: {{backend: redis, url: '{url}', key_prefix: 'spend-{uuid.uuid4().hex}:'}}"
    clock = FakeClock(START)
    config = spend_config(llm, "{limit_tokens: 60}", state=state)
    async with AsyncExitStack() as stack:
        _, one = await stack.enter_async_context(running(config, clock, memory=False))
        _, two = await stack.enter_async_context(running(config, clock, memory=False))
        first, second = one.made["alpha"], two.made["alpha"]
        await first.push(said(question(1)))
        spend = f"room=room:lobby: {CALL_TOKENS} tokens of 60 tokens"
        assert spend in await command(second, "/loop spend")
        calls = 1
        for n in range(2, 20):
            replica = first if n % 2 else second
            await replica.push(said(question(n), bot="alpha"))
            if len(llm.calls(CHAT)) == calls:
                break
            calls += 1
        assert len(notices(first)) + len(notices(second)) == 1
        await first.push(said(question(40)))
        await second.push(said(question(41)))
        assert len(notices(first)) + len(notices(second)) == 1
        assert len(llm.calls(CHAT)) == calls
        spend = f"room=room:lobby: {calls * CALL_TOKENS} tokens of 60 tokens"
        assert spend in await command(first, "/loop spend")
        assert spend in await command(second, "/loop spend")


async def test_issue14_loop_set_gives_a_room_a_budget_bounded_like_the_config(
    llm: FakeLLM,
) -> None:
    clock = FakeClock(START)
    async with running(spend_config(llm, None), clock) as (_, platform):
        alpha = platform.made["alpha"]
        assert await command(alpha, "/loop spend") == messages.NO_SPEND_LIMIT
        for value, reason in [
            ("inf", "finite number"),
            ("1e308", "less than or equal to 1000000"),
            ("-1", "greater than or equal to 0"),
            ("9" * 400, "valid number"),
            ("9" * 5000, "longer than 500 characters"),
            ("\uff15", "look-alike"),
        ]:
            answer = await command(alpha, f"/loop set spend.limit_usd {value}")
            assert answer.startswith("Can't set spend.limit_usd"), answer
            assert reason in answer, answer
        answer = await command(alpha, "/loop set spend.period year")
        assert answer.startswith("Can't set spend.period")
        assert "Set spend.limit_tokens" in await command(alpha, "/loop set spend.limit_tokens 40")
        calls = await until_refused(alpha, llm)
        assert calls >= 1
        assert "tokens of 40 tokens" in await command(alpha, "/loop spend")


async def test_issue14_admin_api_answers_the_room_spend(llm: FakeLLM) -> None:
    clock = FakeClock(START)
    config = spend_config(llm, "{limit_usd: 1, limit_tokens: 1000, per: [room, bot]}")
    async with running(config, clock) as (gateway, platform):
        await platform.made["alpha"].push(said(question(1)))
        url = f"http://127.0.0.1:{gateway.port}/admin/spend"
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with aiohttp.ClientSession(headers=headers) as http:
            async with http.get(url, params={"room": "room:lobby"}) as response:
                assert response.status == 200
                body = await response.json()
            for params, status, needle in [
                ({}, 400, "room"),
                ({"room": "lobby"}, 400, "room"),
                ({"room": "room:lobby", "by": "agent"}, 400, "by"),
            ]:
                async with http.get(url, params=params) as refused:
                    assert refused.status == status
                    assert needle in (await refused.json())["error"]
        async with aiohttp.ClientSession() as anonymous:
            response = await anonymous.get(url, params={"room": "room:lobby"})
            assert response.status == 401
            response.release()
    assert body["ok"] is True
    assert (
        "room=room:lobby bot=alpha: $0.0180 and 18 tokens of $1.0000 and 1000 tokens"
        in (body["result"])
    )
    groups = {group["group"]: group for group in body["groups"]}
    assert groups["room=room:lobby bot=alpha"] == {
        "group": "room=room:lobby bot=alpha",
        "spent_usd": 0.018,
        "spent_tokens": CALL_TOKENS,
        "limit_usd": 1.0,
        "limit_tokens": 1000,
        "percent": pytest.approx(1.8),
        "ends_at": datetime(2026, 3, 11, tzinfo=UTC).timestamp(),
    }
    assert groups["room=room:lobby bot=beta"]["spent_tokens"] == 0


@pytest.mark.parametrize(
    ("spend", "field", "reason"),
    [
        ("{limit_usd: -1}", "policy.spend.limit_usd", "greater than or equal to 0"),
        ("{limit_usd: .inf}", "policy.spend.limit_usd", "finite number"),
        ("{limit_usd: 1e308}", "policy.spend.limit_usd", "less than or equal to 1000000"),
        (f"{{limit_usd: {'9' * 5000}.5}}", "policy.spend.limit_usd", "finite number"),
        (f"{{limit_tokens: '{'9' * 5000}'}}", "policy.spend.limit_tokens", ""),
        ("{limit_tokens: 10000000000001}", "policy.spend.limit_tokens", "less than or equal"),
        ("{limit_usd: 1, period: year}", "policy.spend.period", "'day', 'week' or 'month'"),
        ("{limit_usd: 1, timezone: Mars/Olympus}", "policy.spend.timezone", "unknown time zone"),
        ("{limit_usd: 1, per: [channel]}", "policy.spend.per.0", "'room' or 'bot'"),
        ("{limit_usd: 1, per: [bot, bot]}", "policy.spend.per", "lists a field twice"),
        ("{period: week}", "policy.spend", "needs limit_usd, limit_tokens or both"),
        ("{limit_usd: 1, mode: Shadow}", "policy.spend.mode", "exactly enforce or shadow"),
        ("{limit_usd: 1, budget: 5}", "policy.spend.budget", "unknown field"),
    ],
)
def test_issue14_check_config_names_the_spend_field(spend: str, field: str, reason: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(f"policy: {{spend: {spend}}}", env={})
    assert caught.value.path == field
    assert reason in caught.value.reason


def test_issue14_check_config_names_a_channel_rules_spend_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "spend.yaml"
    path.write_text(
        "channels: [{match: {channel: C1}, policy: {spend: {limit_usd: -5}}}]\n", encoding="utf-8"
    )
    assert main(["check-config", str(path)]) == 2
    assert "channels.0.policy.spend.limit_usd" in capsys.readouterr().err
    path.write_text(
        "policy: {spend: {limit_tokens: 100}}\n"
        "channels: [{match: {channel: C1}, policy: {spend: {per: [bot]}}}]\n",
        encoding="utf-8",
    )
    assert main(["check-config", str(path)]) == 0


async def test_issue14_a_streamed_answer_carries_its_usage_chunk() -> None:
    async def lines() -> AsyncIterator[bytes]:
        yield b'data: {"choices": [{"index": 0, "delta": {"content": "hi"}}]}\n'
        yield b"\n"
        yield b'data: {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}\n'
        yield b"\n"
        yield b'data: {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}\n'
        yield b"\n"
        yield b"data: [DONE]\n"

    async def ignore(piece: str) -> None:
        """The text is not what this test reads."""

    completion = await read_completion(lines(), ignore)
    assert completion["usage"] == {"prompt_tokens": 3, "completion_tokens": 2}


async def test_issue14_a_streamed_call_asks_for_its_usage_and_is_charged_it(llm: FakeLLM) -> None:
    clock = FakeClock(START)
    store = MemoryCallStore(clock=clock, wall_clock=clock)
    config = OpenAIAgentConfig(kind="openai", base_url=llm.base_url, model="m", stream=True)
    agent = OpenAIAgent("helper", config, calls=store, budgets=AgentBudgets(wall_clock=clock))
    turn = make_turn("hi", policy=Policy(spend=SpendSettings(limit_tokens=1000)))
    turn.stream = ReplyStream(Delivery(), EditingRoom(), "c1", thread_id=None, reply_to="m1")
    try:
        result = await agent.respond(turn)
    finally:
        await agent.aclose()
    assert result.text
    [request] = llm.calls(CHAT)
    assert request.json()["stream_options"] == {"include_usage": True}
    [(_, group)] = await store.spend_groups()
    assert group.spent.tokens == CALL_TOKENS
    assert group.held.tokens == 0
