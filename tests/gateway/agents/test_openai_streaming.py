"""The openai agent with `stream: true` against the fake LLM (real SSE over loopback)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from gateway.agents.openai import OpenAIAgent
from gateway.app import messages
from gateway.app.context import TurnContext
from gateway.app.errors import ConfigError
from gateway.app.types import Reply
from gateway.config import OpenAIAgentConfig, parse_config
from gateway.delivery.sender import Delivery
from gateway.delivery.streaming import ReplyStream
from tests.connectors.stream_cases import ManualClock
from tests.fakes.editing_room import EditingRoom
from tests.fakes.llm_upstream import FakeLLM, FakeResponse, text_response, tool_call_response
from tests.gateway.agents.agent_turns import make_turn

TOOLS = "tests.gateway.agents.tools_for_tests"


@dataclass
class Streamed:
    """A turn whose reply streams into an `EditingRoom`, on a manual clock."""

    turn: TurnContext
    stream: ReplyStream
    room: EditingRoom
    clock: ManualClock


@pytest.fixture
async def server() -> AsyncIterator[FakeLLM]:
    async with FakeLLM(chunks=6) as fake:
        yield fake


def streamed_turn(text: str = "hello") -> Streamed:
    clock = ManualClock(tick=1.0)  # each update of the room may follow the last
    room = EditingRoom()
    turn = make_turn(text)
    stream = ReplyStream(
        Delivery(sleep=clock.sleep, clock=clock), room, "c1", thread_id=None, reply_to="m1"
    )
    turn.stream = stream
    return Streamed(turn, stream, room, clock)


def agent_for(server: FakeLLM, *tools: str, **fields: object) -> OpenAIAgent:
    config = OpenAIAgentConfig.model_validate(
        {
            "kind": "openai",
            "base_url": server.base_url,
            "model": "test-model",
            "tools": [f"{TOOLS}:{tool}" for tool in tools],
            "stream": True,
            "stream_edit_seconds": 0.5,
            **fields,
        }
    )
    return OpenAIAgent("helper", config, sleep=ManualClock().sleep)


async def respond(agent: OpenAIAgent, streamed: Streamed) -> str | None:
    """The agent's answer, its stream finished as the delivery stage finishes it."""
    try:
        result = await agent.respond(streamed.turn)
    finally:
        await agent.aclose()
    await streamed.stream.finish(None if result.text is None else Reply(result.text))
    return result.text


async def test_issue11_the_reply_is_posted_as_it_streams_and_ends_whole(server: FakeLLM) -> None:
    server.reply = "Hello there, this reply arrives in six pieces."
    streamed = streamed_turn()
    assert await respond(agent_for(server), streamed) == server.reply
    assert server.requests[0].json()["stream"] is True
    kinds = [kind for kind, _ in streamed.room.calls]
    assert kinds[0] == "send"
    assert kinds.count("send") == 1
    assert kinds.count("edit") >= 2, "the message was edited as the text arrived"
    assert list(streamed.room.texts.values()) == [server.reply]


async def test_issue11_tool_call_deltas_still_work_while_streaming(server: FakeLLM) -> None:
    server.enqueue(
        tool_call_response(("search_orders", {"query": "late parcels"})),
        text_response("Found the late parcels."),
    )
    streamed = streamed_turn("where are my parcels?")
    agent = agent_for(server, "search_orders")
    assert await respond(agent, streamed) == "Found the late parcels."
    first, second = server.requests
    assert first.json()["stream"] is True
    assert second.json()["stream"] is True
    (tool_message,) = second.tool_messages
    assert "late parcels" in tool_message["content"]
    assert list(streamed.room.texts.values()) == ["Found the late parcels."]


async def test_issue11_text_of_a_tool_round_is_replaced_by_the_final_round(
    server: FakeLLM,
) -> None:
    asking = tool_call_response(("search_orders", {"query": "x"}))
    choice = {**asking.body["choices"][0]}
    choice["message"] = {**choice["message"], "content": "Let me look that up."}
    server.enqueue(
        FakeResponse(body={**asking.body, "choices": [choice]}), text_response("Nothing found.")
    )
    streamed = streamed_turn()
    assert await respond(agent_for(server, "search_orders"), streamed) == "Nothing found."
    assert ("edit", "Let me look that up.") in streamed.room.calls, "the tool round streamed"
    assert list(streamed.room.texts.values()) == ["Nothing found."]


async def test_issue11_no_streaming_where_the_platform_cannot_edit(server: FakeLLM) -> None:
    server.reply = "sent whole"
    turn = make_turn("hello")  # the web room: no `turn.stream`
    agent = agent_for(server)
    try:
        result = await agent.respond(turn)
    finally:
        await agent.aclose()
    assert result.text == "sent whole"
    assert "stream" not in server.requests[0].json()


async def test_issue11_a_stream_cut_short_is_retried_and_shown_once(server: FakeLLM) -> None:
    server.reply = "The whole answer, after one dropped stream."
    server.break_next_stream()
    streamed = streamed_turn()
    assert await respond(agent_for(server), streamed) == server.reply
    assert len(server.requests) == 2
    assert list(streamed.room.texts.values()) == [server.reply]


DEEP = b"[" * 5000 + b"]" * 5000


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"data: \xff\xfe{}\n\n", id="not-utf8"),
        pytest.param(b"data: {not json\n\n", id="not-json"),
        pytest.param(b'data: {"choices": [{"index": ' + b"9" * 5000 + b"}]}\n\n", id="5000-digits"),
        pytest.param(b"data: " + DEEP + b"\n\n", id="deep-nesting"),
        pytest.param(b'data: {"choices": [{"index": NaN}]}\n\n', id="nan"),
        pytest.param(b'data: {"choices": [{"delta": {"content": 1e999}}]}\n\n', id="inf"),
        pytest.param(b'data: {"choices": [{"delta": {"content": 42}}]}\n\n', id="wrong-type"),
        pytest.param(
            b'data: {"choices": [{"delta": {"tool_calls": [{"index": 1e308}]}}]}\n\n',
            id="tool-index-1e308",
        ),
        pytest.param(
            b'data: {"choices": [{"delta": {"tool_calls": [{"index": 100000}]}}]}\n\n',
            id="tool-index-too-big",
        ),
        pytest.param(b'data: {"error": {"message": "overloaded"}}\n\n', id="error-event"),
        pytest.param(b'data: {"choices": "\xd0\x9e\xd0\x9e"}\n\n', id="lookalike-choices"),
    ],
)
async def test_issue11_an_unreadable_stream_ends_the_turn_and_the_next_is_answered(
    server: FakeLLM, body: bytes
) -> None:
    server.stream_bodies.append(body)
    agent = agent_for(server)
    streamed = streamed_turn()
    result = await agent.respond(streamed.turn)
    assert result.text == messages.PROVIDER_DOWN
    assert streamed.room.calls == []
    server.reply = "and now a good answer"
    assert await respond(agent, streamed_turn()) == "and now a good answer"


AGENT_YAML = "agents: {{helper: {{kind: openai, model: m, {fields}}}}}\n"


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ("stream_edit_seconds: .inf", "finite"),
        ("stream_edit_seconds: 1e308", "366 days"),
        ("stream_edit_seconds: 0", "greater than 0"),
        ("stream_edit_seconds: -1", "greater than 0"),
        ("stream_edit_seconds: fast", "valid number"),
        ("stream: sometimes", "valid boolean"),
    ],
)
def test_issue11_check_config_names_a_bad_stream_field(fields: str, reason: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(AGENT_YAML.format(fields=fields), env={})
    assert caught.value.path == f"agents.helper.{fields.partition(':')[0]}"
    assert reason in caught.value.reason


def test_issue11_streaming_is_off_unless_asked() -> None:
    config = parse_config(AGENT_YAML.format(fields="base_url: http://127.0.0.1:9/v1"), env={})
    agent = config.agents["helper"]
    assert isinstance(agent, OpenAIAgentConfig)
    assert not agent.stream
    assert agent.stream_edit_seconds == 1.0


def test_issue11_a_5000_digit_edit_interval_is_refused_with_its_line() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(AGENT_YAML.format(fields="stream_edit_seconds: " + "9" * 5000), env={})
    assert "too many digits (line 1)" in str(caught.value)
