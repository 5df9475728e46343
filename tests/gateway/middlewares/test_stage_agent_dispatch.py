"""Agent dispatch: the turn timeout, the typing indicator, and the reply's threading."""

from __future__ import annotations

import asyncio

import pytest

from gateway.app.context import TurnContext
from gateway.app.messages import TIMEOUT_NOTICE
from gateway.app.types import AgentResult
from tests.fakes.inmemory import ConstantAgent, PipelineRig, rig_config
from tests.gateway.middlewares.stage_rig import rig_with


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
