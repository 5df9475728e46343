"""The openai agent runs on the room's `policy.call_loop`: per channel rule and by `/loop set`."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from gateway.agents.openai import OpenAIAgent
from gateway.app import messages
from gateway.app.types import Halt
from gateway.config import OpenAIAgentConfig
from tests.fakes.inmemory import PipelineRig, rig_config
from tests.fakes.llm_upstream import FakeLLM, tool_call_response

TOOL = "tests.gateway.agents.tools_for_tests:get_status"
ADMIN = "U_ADMIN"
STRICT_CHANNEL = "C9"


@pytest.fixture
async def server() -> AsyncIterator[FakeLLM]:
    async with FakeLLM() as fake:
        # The model asks for the same tool call forever: every request after the first
        # carries the same last two messages, so the call guard sees one call repeated.
        fake.responder = lambda _: tool_call_response(("get_status", {"service": "db"}))
        yield fake


async def _sleep(seconds: float) -> None:
    """No provider failure is waited for here."""


@pytest.fixture
async def hosted(server: FakeLLM) -> AsyncIterator[PipelineRig]:
    """The openai agent as the hosted bot `parrot`, with a strict rule for channel C9."""
    config = OpenAIAgentConfig(
        kind="openai", base_url=server.base_url, model="m", tools=(TOOL,), max_tool_rounds=20
    )
    agent = OpenAIAgent("helper", config, sleep=_sleep)
    rig = PipelineRig(
        rig_config(
            f"admins: {{room: [{ADMIN}]}}\n"
            f"channels: [{{match: {{channel: {STRICT_CHANNEL}}}, "
            "policy: {call_loop: {max_repeats: 2, pause_seconds: 90}}}]"
        ),
        {"parrot": agent},
    )
    await rig.start()
    try:
        yield rig
    finally:
        await agent.aclose()


async def _requests_for_one_turn(rig: PipelineRig, server: FakeLLM, channel: str) -> int:
    """How many model requests one human message in `channel` led to."""
    before = len(server.requests)
    connector = rig.connector()
    await connector.push(connector.message("is the db up?", channel_id=channel))
    return len(server.requests) - before


def _halt(rig: PipelineRig) -> Halt | None:
    """The halt that ended the last turn's agent run."""
    result = rig.turns[-1].result
    assert result is not None
    return result.halt


async def test_issue10_a_channel_rule_sets_the_agents_call_loop_policy(
    hosted: PipelineRig, server: FakeLLM
) -> None:
    # The first request, then max_repeats identical ones; the next is refused unsent.
    assert await _requests_for_one_turn(hosted, server, STRICT_CHANNEL) == 1 + 2
    assert _halt(hosted) == Halt("call_loop", "loop_detected")
    assert hosted.connector().texts()[-1] == messages.CALL_LOOP_STOP.format(
        pause=messages.format_duration(90)
    )
    # Another channel runs on the default policy: five repeats.
    # Another channel runs on the default policy (five repeats): the tool-call guard,
    # whose warnings change what the model is sent, ends that turn instead.
    assert await _requests_for_one_turn(hosted, server, "C1") > 1 + 2
    assert _halt(hosted) == Halt("tool_loop", "no_progress_halt")


async def test_issue10_loop_set_call_loop_max_repeats_reaches_the_agent(
    hosted: PipelineRig, server: FakeLLM
) -> None:
    connector = hosted.connector()
    await connector.push(
        connector.message("/loop set call_loop.max_repeats 2", channel_id="C2", sender_id=ADMIN)
    )
    assert connector.texts()[-1] == messages.set_ack("call_loop.max_repeats", 2)
    assert await _requests_for_one_turn(hosted, server, "C2") == 1 + 2
    assert _halt(hosted) == Halt("call_loop", "loop_detected")
    # The override is the room's: a room without it keeps the default.
    await _requests_for_one_turn(hosted, server, "C3")
    assert _halt(hosted) == Halt("tool_loop", "no_progress_halt")
