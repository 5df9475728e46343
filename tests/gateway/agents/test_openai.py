"""The openai agent against the local fake LLM provider (real HTTP on loopback)."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator, Iterator

import aiohttp
import pytest

from gateway.agents.openai import OpenAIAgent, parse_retry_after, tool_spec
from gateway.app import messages
from gateway.app.errors import ConfigError
from gateway.app.messages import SILENCE_NOTICE, format_duration
from gateway.app.types import Halt
from gateway.config import OpenAIAgentConfig, Policy
from guards.call_loop import CallLoopGuard, CallLoopPolicy
from tests.fakes.inmemory import PipelineRig, rig_config
from tests.fakes.llm_upstream import (
    FakeLLM,
    FakeResponse,
    Received,
    error_response,
    hang_response,
    text_response,
    tool_call_response,
)
from tests.gateway.agents.agent_turns import SleepRecorder, make_turn
from tests.gateway.agents.tools_for_tests import search_orders

TOOLS = "tests.gateway.agents.tools_for_tests"


@pytest.fixture
async def server() -> AsyncIterator[FakeLLM]:
    async with FakeLLM() as fake:
        yield fake


@pytest.fixture
def sleep() -> SleepRecorder:
    return SleepRecorder()


def _call_loop(**fields: object) -> Policy:
    """The default policy with these `call_loop` fields."""
    return Policy.model_validate({"call_loop": fields})


def _config(server: FakeLLM, *tools: str, **fields: object) -> OpenAIAgentConfig:
    data: dict[str, object] = {
        "kind": "openai",
        "base_url": server.base_url,
        "model": "test-model",
        "tools": [f"{TOOLS}:{tool}" for tool in tools],
        **fields,
    }
    return OpenAIAgentConfig.model_validate(data)


@contextlib.asynccontextmanager
async def _agent(
    config: OpenAIAgentConfig,
    sleep: SleepRecorder,
    *,
    call_guard: CallLoopGuard | None = None,
    clock: Iterator[float] | None = None,
) -> AsyncIterator[OpenAIAgent]:
    agent = OpenAIAgent(
        "helper",
        config,
        sleep=sleep,
        call_guard=call_guard,
        clock=(lambda: next(clock)) if clock is not None else None,
    )
    try:
        yield agent
    finally:
        await agent.aclose()


def _last_tool_content(request: Received) -> str:
    content = request.tool_messages[-1]["content"]
    assert isinstance(content, str)
    return content


async def test_plain_answer(server: FakeLLM, sleep: SleepRecorder) -> None:
    server.enqueue(text_response("Hello Alice!"))
    config = _config(server, api_key="sk-test-key", system_prompt="Be brief.", temperature=0.2)
    async with _agent(config, sleep) as agent:
        result = await agent.respond(make_turn("hello", sender_name="Alice"))
    assert result.text == "Hello Alice!"
    assert result.tool_calls == ()
    assert not result.halted
    (request,) = server.requests
    assert request.path == "/v1/chat/completions"
    assert request.headers["Authorization"] == "Bearer sk-test-key"
    assert request.json()["model"] == "test-model"
    assert request.json()["temperature"] == 0.2
    assert "tools" not in request.json()
    assert request.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Alice: hello"},
    ]


async def test_no_key_sends_no_authorization(server: FakeLLM, sleep: SleepRecorder) -> None:
    server.enqueue(text_response("ok"))
    async with _agent(_config(server), sleep) as agent:
        await agent.respond(make_turn("hi"))
    assert "Authorization" not in server.requests[0].headers


async def test_model_answering_no_reply_is_returned_as_is(
    server: FakeLLM, sleep: SleepRecorder
) -> None:
    server.enqueue(text_response("NO_REPLY"))
    async with _agent(_config(server), sleep) as agent:
        result = await agent.respond(make_turn("bots chatting"))
    assert result.text == "NO_REPLY"
    assert not result.halted


def test_tool_schema_from_signature() -> None:
    spec = tool_spec(search_orders)
    assert spec.name == "search_orders"
    assert spec.description == "Search orders by text."
    assert spec.parameters == {
        "type": "object",
        "properties": {
            "query": {"type": "string"},
            "limit": {"type": "integer"},
            "min_total": {"type": "number"},
            "include_closed": {"type": "boolean"},
            "tags": {"type": "array"},
            "filters": {"type": "object"},
            "note": {},
        },
        "required": ["query"],
    }


async def test_tools_are_described_to_the_model(server: FakeLLM, sleep: SleepRecorder) -> None:
    server.enqueue(text_response("nothing to look up"))
    async with _agent(_config(server, "search_orders", "lookup_order"), sleep) as agent:
        await agent.respond(make_turn("hi"))
    tools = server.requests[0].json()["tools"]
    assert [t["function"]["name"] for t in tools] == ["search_orders", "lookup_order"]
    assert tools[1] == {
        "type": "function",
        "function": {
            "name": "lookup_order",
            "description": "Look an order up (an async tool).",
            "parameters": {
                "type": "object",
                "properties": {"order_id": {"type": "integer"}},
                "required": ["order_id"],
            },
        },
    }


def test_missing_tool_is_a_config_error(server: FakeLLM) -> None:
    with pytest.raises(ConfigError, match="has no attribute 'nope'") as caught:
        OpenAIAgent("helper", _config(server, "get_status", "nope"))
    assert caught.value.path == "agents.helper.tools.1"


async def test_polling_tool_that_progresses_is_never_blocked(
    server: FakeLLM, sleep: SleepRecorder
) -> None:
    def responder(request: Received) -> FakeResponse:
        tools = request.tool_messages
        if tools and tools[-1]["content"] == "COMPLETE":
            return text_response("Job 7 is complete.")
        return tool_call_response(("get_job_status", {"job_id": "poll-progress-7"}))

    server.responder = responder
    async with _agent(_config(server, "get_job_status"), sleep) as agent:
        result = await agent.respond(make_turn("is job 7 done?"))
    assert result.text == "Job 7 is complete."
    assert not result.halted
    assert [c.action for c in result.tool_calls] == ["allow"] * 4
    assert [c.arguments for c in result.tool_calls] == ['{"job_id": "poll-progress-7"}'] * 4
    contents = [_last_tool_content(r) for r in server.requests[1:]]
    assert contents == ["IN_PROGRESS", "IN_PROGRESS", "IN_PROGRESS", "COMPLETE"]
    assert not any("loop_blocked" in c or "loop-guard" in c for c in contents)


async def test_stuck_tool_warns_then_blocks_then_halts(
    server: FakeLLM, sleep: SleepRecorder
) -> None:
    server.responder = lambda _: tool_call_response(("get_status", {"service": "db"}))
    config = _config(server, "get_status", max_tool_rounds=20)
    async with _agent(config, sleep) as agent:
        result = await agent.respond(make_turn("is the db up?"))

    assert result.halt == Halt("tool_loop", "no_progress_halt")
    assert result.text == messages.TOOL_LOOP_STOP.format(tool="get_status")
    assert result.text == "I stopped: I was calling get_status over and over without progress."
    actions = [c.action for c in result.tool_calls]
    assert actions == ["allow"] * 3 + ["warn"] * 4 + ["block", "halt"]
    assert result.tool_calls[-2].code == "count_block"
    assert result.tool_calls[-1].code == "no_progress_halt"
    # Calls 1-3 went back plain, 4-7 with the WARN annotation, 8 replaced by the block.
    fed_back = [json.loads(_last_tool_content(r)) for r in server.requests[1:]]
    assert len(fed_back) == 8
    assert all("_loop_guard" not in f for f in fed_back[:3])
    assert all(f["_loop_guard"]["action"] == "warn" for f in fed_back[3:7])
    assert fed_back[7]["loop_blocked"] is True
    assert fed_back[7]["error"].startswith("[loop-guard]")
    assert "loop_blocked" in _last_tool_content(server.requests[-1])


async def test_tool_loop_policy_comes_from_the_turn(server: FakeLLM, sleep: SleepRecorder) -> None:
    server.responder = lambda _: tool_call_response(("get_status", {"service": "db"}))
    policy = Policy.model_validate({"tool_loop": {"no_progress_warn": 2, "no_progress_halt": 3}})
    async with _agent(_config(server, "get_status"), sleep) as agent:
        result = await agent.respond(make_turn("status?", policy=policy))
    assert result.halted
    # The third identical result reaches no_progress_halt in the post-check of call 3.
    assert [c.action for c in result.tool_calls] == ["allow", "warn", "halt"]


async def test_turn_time_limit_ends_the_turn(server: FakeLLM, sleep: SleepRecorder) -> None:
    server.responder = lambda _: tool_call_response(("get_job_status", {"job_id": "slow-1"}))
    policy = Policy.model_validate({"tool_loop": {"max_time_per_turn": 5}})
    ticks = iter(range(0, 1000, 3))
    async with _agent(_config(server, "get_job_status"), sleep, clock=map(float, ticks)) as agent:
        result = await agent.respond(make_turn("wait for it", policy=policy))
    assert result.halted
    assert result.text == messages.TURN_TOO_LONG
    assert result.tool_calls[-1].code == "time_exceeded"


async def test_tool_errors_go_back_to_the_model(server: FakeLLM, sleep: SleepRecorder) -> None:
    server.enqueue(
        tool_call_response(
            ("read_broken", {"path": "/etc/x"}),
            ("no_such_tool", {}),
            ("lookup_order", "{not json"),
            ("lookup_order", {"order_id": 12}),
        ),
        text_response("Order 12 shipped."),
    )
    async with _agent(_config(server, "read_broken", "lookup_order"), sleep) as agent:
        result = await agent.respond(make_turn("where is order 12?"))
    assert result.text == "Order 12 shipped."
    contents = [m["content"] for m in server.requests[1].tool_messages]
    assert json.loads(contents[0]) == {"error": "OSError: cannot read /etc/x"}
    assert "LookupError: unknown tool 'no_such_tool'" in json.loads(contents[1])["error"]
    assert "TypeError: arguments must be a JSON object" in json.loads(contents[2])["error"]
    assert json.loads(contents[3]) == {"order_id": 12, "status": "shipped"}
    ids = [m["tool_call_id"] for m in server.requests[1].tool_messages]
    assert ids == [c["id"] for c in server.requests[1].messages[-5]["tool_calls"]]
    assert [c.name for c in result.tool_calls] == [
        "read_broken",
        "no_such_tool",
        "lookup_order",
        "lookup_order",
    ]


async def test_tool_rounds_are_bounded(server: FakeLLM, sleep: SleepRecorder) -> None:
    counter = iter(range(1000))
    server.responder = lambda _: tool_call_response(("lookup_order", {"order_id": next(counter)}))
    async with _agent(_config(server, "lookup_order", max_tool_rounds=2), sleep) as agent:
        result = await agent.respond(make_turn("look up everything"))
    assert result.halted
    assert result.text == messages.TOO_MANY_ROUNDS.format(rounds=2)
    assert len(server.requests) == 3
    assert len(result.tool_calls) == 2


async def test_429_is_retried_after_retry_after(server: FakeLLM, sleep: SleepRecorder) -> None:
    server.enqueue(error_response(429, retry_after=7), text_response("made it"))
    # max_repeats=1: had the failed attempt been counted, the retry would be refused.
    async with _agent(_config(server), sleep) as agent:
        result = await agent.respond(make_turn("hi", policy=_call_loop(max_repeats=1)))
    assert result.text == "made it"
    assert len(server.requests) == 2
    assert sleep.waits == [7.0]


async def test_5xx_retried_with_backoff_then_apology_without_the_key(
    server: FakeLLM, sleep: SleepRecorder, caplog: pytest.LogCaptureFixture
) -> None:
    key = "sk-secret-do-not-log"
    server.responder = lambda _: error_response(500, message=f"upstream broke for key {key}")
    caplog.set_level(logging.WARNING, logger="loopwarden.agents.openai")
    async with _agent(_config(server, api_key=key), sleep) as agent:
        result = await agent.respond(make_turn("hi"))
    assert result.text == messages.PROVIDER_DOWN
    assert not result.halted
    assert len(server.requests) == 4
    assert sleep.waits == [0.5, 1.0, 2.0]
    assert "HTTP 500" in caplog.text
    assert key not in caplog.text


async def test_other_4xx_is_not_retried(server: FakeLLM, sleep: SleepRecorder) -> None:
    server.enqueue(error_response(400, message="bad request"))
    async with _agent(_config(server), sleep) as agent:
        result = await agent.respond(make_turn("hi"))
    assert result.text == messages.PROVIDER_DOWN
    assert len(server.requests) == 1
    assert sleep.waits == []


async def test_retry_after_too_long_is_not_waited_for(
    server: FakeLLM, sleep: SleepRecorder
) -> None:
    server.enqueue(error_response(429, retry_after=3600))
    async with _agent(_config(server), sleep) as agent:
        result = await agent.respond(make_turn("hi"))
    assert result.text == messages.PROVIDER_DOWN
    assert len(server.requests) == 1
    assert sleep.waits == []


async def test_timeout_is_retried(server: FakeLLM, sleep: SleepRecorder) -> None:
    server.enqueue(hang_response(), text_response("late but fine"))
    async with _agent(_config(server, timeout=0.2), sleep) as agent:
        result = await agent.respond(make_turn("hi"))
    assert result.text == "late but fine"
    assert len(server.requests) == 2
    assert sleep.waits == [0.5]


async def test_identical_calls_are_stopped_before_the_provider(
    server: FakeLLM, sleep: SleepRecorder
) -> None:
    server.responder = lambda _: text_response("hi!")
    now = [0.0]
    guard = CallLoopGuard(CallLoopPolicy(), clock=lambda: now[0])
    async with _agent(_config(server), sleep, call_guard=guard) as agent:
        for _ in range(5):
            assert (await agent.respond(make_turn("hi"))).text == "hi!"
            now[0] += 1.0
        sixth = await agent.respond(make_turn("hi"))
        assert len(server.requests) == 5
        assert sixth.halted
        assert sixth.text == messages.CALL_LOOP_STOP.format(pause=format_duration(300))
        # While paused, even a different message on this circuit is not sent; a human is
        # told, a bot gets silence. Another room is a different circuit.
        human = await agent.respond(make_turn("something else"))
        assert human.halted
        assert human.text is not None
        assert human.text.startswith("I'm paused in this conversation")
        bot_turn = make_turn("something else", sender_is_bot=True)
        assert (await agent.respond(bot_turn)).text is None
        assert len(server.requests) == 5
        other_room = await agent.respond(make_turn("hi", channel_id="c2"))
        assert other_room.text == "hi!"
        other_thread = await agent.respond(make_turn("hi", thread_id="t1"))
        assert other_thread.text == "hi!"
        assert len(server.requests) == 7
        assert [p.circuit for p in guard.paused()] == ["helper/session=room%3Ac1"]


async def test_repeated_requests_inside_one_turn_are_stopped(
    server: FakeLLM, sleep: SleepRecorder
) -> None:
    server.responder = lambda _: tool_call_response(("get_status", {"service": "db"}))
    async with _agent(_config(server, "get_status"), sleep) as agent:
        result = await agent.respond(make_turn("is the db up?", policy=_call_loop(max_repeats=2)))
    # Requests 2 and 3 carry the same last two messages; the third such one is refused.
    assert len(server.requests) == 3
    assert result.halt == Halt("call_loop", "loop_detected")
    assert result.text == messages.CALL_LOOP_STOP.format(pause=format_duration(300))
    assert [c.action for c in result.tool_calls] == ["allow"] * 3


async def test_one_session_created_lazily_and_closed(server: FakeLLM) -> None:
    created: list[aiohttp.ClientSession] = []

    def factory() -> aiohttp.ClientSession:
        session = aiohttp.ClientSession()
        created.append(session)
        return session

    server.responder = lambda _: text_response("ok")
    agent = OpenAIAgent("helper", _config(server), session_factory=factory)
    assert created == []
    await agent.respond(make_turn("one"))
    await agent.respond(make_turn("two"))
    assert len(created) == 1
    await agent.aclose()
    assert created[0].closed


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"retry-after-ms": "1500"}, 1.5),
        ({"Retry-After": "2"}, 2.0),
        ({"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}, 0.0),
        ({"Retry-After": "soon"}, None),
        ({}, None),
    ],
)
def test_parse_retry_after(headers: dict[str, str], expected: float | None) -> None:
    assert parse_retry_after(headers) == expected


async def _hosted(agent: OpenAIAgent, yaml_text: str = "") -> PipelineRig:
    """The real pipeline around the agent, as the hosted bot `parrot` of a room."""
    rig = PipelineRig(rig_config(yaml_text), {"parrot": agent})
    await rig.start()
    return rig


async def test_issue3_halt_is_a_short_message_in_the_room_and_is_counted(
    server: FakeLLM, sleep: SleepRecorder, caplog: pytest.LogCaptureFixture
) -> None:
    server.responder = lambda _: tool_call_response(("get_status", {"service": "db"}))
    async with _agent(_config(server, "get_status", max_tool_rounds=20), sleep) as agent:
        rig = await _hosted(agent)
        connector = rig.connector()
        with caplog.at_level(logging.INFO, logger="loopwarden.decision"):
            await connector.push(connector.message("is the db up?"))
    assert connector.texts() == [messages.TOOL_LOOP_STOP.format(tool="get_status")]
    counted = {
        code: rig.metrics.value("guard_decisions_total", guard="tool_loop", code=code)
        for code in ("ok", "no_progress_warn", "count_block", "no_progress_halt")
    }
    assert counted == {"ok": 3, "no_progress_warn": 4, "count_block": 1, "no_progress_halt": 1}
    assert "room:C1 tool_loop halted the agent's turn (no_progress_halt)" in caplog.messages
    assert rig.metrics.value("errors_total", stage="agent_dispatch") == 0


async def test_issue3_call_loop_halt_is_counted_under_its_guard(
    server: FakeLLM, sleep: SleepRecorder
) -> None:
    server.responder = lambda _: tool_call_response(("get_status", {"service": "db"}))
    async with _agent(_config(server, "get_status"), sleep) as agent:
        rig = await _hosted(agent, "policy: {call_loop: {max_repeats: 2}}")
        connector = rig.connector()
        await connector.push(connector.message("is the db up?"))
    assert connector.texts() == [messages.CALL_LOOP_STOP.format(pause=format_duration(300))]
    assert rig.metrics.value("guard_decisions_total", guard="call_loop", code="loop_detected") == 1


@pytest.mark.parametrize(("addressed", "posted"), [(False, []), (True, [SILENCE_NOTICE])])
async def test_issue3_model_answering_no_reply_never_reaches_the_room(
    server: FakeLLM, sleep: SleepRecorder, addressed: bool, posted: list[str]
) -> None:
    server.responder = lambda _: text_response("NO_REPLY")
    async with _agent(_config(server), sleep) as agent:
        rig = await _hosted(agent)
        connector = rig.connector()
        await connector.push(connector.message("thanks all", mentions_bot=addressed))
    assert len(server.requests) == 1
    assert connector.texts() == posted


@pytest.mark.parametrize(
    "arguments",
    ["[" * 50_000 + "]" * 50_000, '{"order_id": ' + "9" * 5_000 + "}", '{"x": NaN}', "{"],
)
async def test_issue9_hostile_tool_arguments_fail_the_call_not_the_turn(
    server: FakeLLM, sleep: SleepRecorder, arguments: str
) -> None:
    server.enqueue(tool_call_response(("lookup_order", arguments)), text_response("sorted"))
    async with _agent(_config(server, "lookup_order"), sleep) as agent:
        result = await agent.respond(make_turn("where is my order?"))
    assert result.text == "sorted"
    assert "arguments" in _last_tool_content(server.requests[-1])
