"""Traces over OTLP (issue 25): a real OTLP/HTTP receiver gets the spans of real runs.

The pipeline rig (in-memory platform, real pipeline), the openai agent against the fake
LLM provider, and the proxy in front of it, with `telemetry.otlp_endpoint` set to the
receiver in `tests/fakes/otlp_receiver.py`. Spans are flushed with `force_flush` (in a
thread: the exporter's HTTP post is answered by this event loop), never waited for.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator

import aiohttp
import pytest
from pydantic import ValidationError

from gateway.agents.openai import OpenAIAgent
from gateway.app.errors import ConfigError
from gateway.config import OpenAIAgentConfig, TelemetryConfig, parse_config
from gateway.observability import tracing
from gateway.observability.telemetry import reset_tracing, setup_tracing
from tests.fakes.inmemory import InMemoryRoom, PipelineRig, rig_config
from tests.fakes.llm_upstream import FakeLLM, tool_call_response
from tests.fakes.otlp_receiver import OtlpReceiver, ReceivedSpan, children, root_of, tree
from tests.gateway.agents.agent_turns import SleepRecorder
from tests.gateway.proxy.proxy_helpers import MODEL, PROXY_KEY, running_proxy

SECRET_TEXT = "my card is 4111-1111"
CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"
TRACEPARENT = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"


async def _receiver(capture_content: bool = False) -> AsyncIterator[OtlpReceiver]:
    async with OtlpReceiver() as receiver:
        config = TelemetryConfig(otlp_endpoint=receiver.endpoint, capture_content=capture_content)
        setup_tracing(config, "loopwarden-test")
        try:
            yield receiver
        finally:
            await asyncio.to_thread(reset_tracing)


@pytest.fixture
async def receiver(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[OtlpReceiver]:
    # The test's own client calls the proxy from this process: its requests are not traced,
    # so the traceparent it sends is the one the proxy sees (another process's, in life).
    monkeypatch.setenv("OTEL_PYTHON_AIOHTTP_CLIENT_EXCLUDED_URLS", "/openai/v1/")
    async for received in _receiver():
        yield received


@pytest.fixture
async def content_receiver() -> AsyncIterator[OtlpReceiver]:
    async for received in _receiver(capture_content=True):
        yield received


async def flushed(receiver: OtlpReceiver) -> dict[str, list[ReceivedSpan]]:
    """Every span finished so far, exported and received; the traces by id."""
    assert await asyncio.to_thread(tracing.tracer().force_flush)
    return receiver.traces()


def guardrails(spans: list[ReceivedSpan]) -> list[tuple[object, ...]]:
    """(guard, code, result, shadow) of each apply_guardrail span, in order."""
    return [
        (
            span.attributes[tracing.GUARDRAIL_NAME],
            span.attributes[tracing.GUARDRAIL_CODE],
            span.attributes[tracing.GUARDRAIL_RESULT],
            span.attributes[tracing.GUARDRAIL_SHADOW],
        )
        for span in spans
        if span.name.startswith(tracing.APPLY_GUARDRAIL)
    ]


def no_text(spans: list[ReceivedSpan], text: str) -> bool:
    return not any(text in str(value) for span in spans for value in span.attributes.values())


async def test_issue25_an_admitted_message_is_one_trace_with_its_turn_under_it(
    receiver: OtlpReceiver,
) -> None:
    rig = PipelineRig(rig_config())
    await rig.start()
    connector = rig.connector()
    await connector.push(connector.message(SECRET_TEXT))
    traces = await flushed(receiver)
    assert connector.texts() == ["pong"]
    assert receiver.content_types == ["application/x-protobuf"]
    [spans] = traces.values()
    root = root_of(spans)
    assert root.is_root
    assert root.name == "message room"
    assert root.service == "loopwarden-test"
    assert {key: root.attributes[key] for key in (tracing.PLATFORM, tracing.ROOM, tracing.BOT)} == {
        tracing.PLATFORM: "room",
        tracing.ROOM: "room:C1",
        tracing.BOT: "parrot",
    }
    [turn] = [span for span in children(spans, root) if span.name.startswith("invoke_agent")]
    assert turn.name == "invoke_agent parrot"
    assert turn.attributes[tracing.OPERATION_NAME] == "invoke_agent"
    assert turn.attributes[tracing.AGENT_NAME] == "parrot"
    assert no_text(spans, SECRET_TEXT)
    assert not any(span.error for span in spans)


async def test_issue25_capture_content_puts_the_text_on_the_turn(
    content_receiver: OtlpReceiver,
) -> None:
    rig = PipelineRig(rig_config())
    await rig.start()
    connector = rig.connector()
    await connector.push(connector.message("hello there"))
    [spans] = (await flushed(content_receiver)).values()
    [turn] = [span for span in spans if span.name.startswith("invoke_agent")]
    assert "hello there" in str(turn.attributes[tracing.INPUT_MESSAGES])
    assert "pong" in str(turn.attributes[tracing.OUTPUT_MESSAGES])


PAIR_BUDGET = "policy: {bot_loop: {max_events_per_window: 3, max_consecutive_bot_turns: 0}}"


async def test_issue25_a_pair_budget_refusal_is_a_guardrail_span_of_that_message(
    receiver: OtlpReceiver,
) -> None:
    rig = PipelineRig(rig_config(PAIR_BUDGET, bots=("parrot", "echo")))
    await rig.start()
    room = InMemoryRoom(rig)
    await room.post("hi bots")
    await room.run(max_posts=20)
    traces = await flushed(receiver)
    refused = [
        spans
        for spans in traces.values()
        if ("bot_loop", "budget_exceeded", "refused", False) in guardrails(spans)
    ]
    assert refused
    spans = refused[0]
    root = root_of(spans)
    assert root.name == "message room"
    [cut] = [span for span in spans if span.name == "apply_guardrail bot_loop"]
    assert cut.parent_id == root.span_id
    assert not any(span.name.startswith("invoke_agent") for span in spans)
    # Each trace is one message to one bot: no span of another message's turn in it.
    assert all(len([s for s in spans if s.is_root]) == 1 for spans in traces.values())


async def test_issue25_a_shadow_decision_says_so(receiver: OtlpReceiver) -> None:
    shadow = "policy: {bot_loop: {mode: shadow, max_consecutive_bot_turns: 0}}"
    rig = PipelineRig(rig_config(shadow, bots=("parrot", "echo")))
    await rig.start()
    room = InMemoryRoom(rig)
    await room.post("hi bots")
    await room.run(max_posts=25)
    traces = await flushed(receiver)
    shadowed = [
        spans
        for spans in traces.values()
        if ("bot_loop", "budget_exceeded", "shadow_refused", True) in guardrails(spans)
    ]
    assert shadowed
    # The turn went on: the same trace holds the agent's turn.
    assert any(span.name in {"invoke_agent echo", "invoke_agent parrot"} for span in shadowed[0])


async def test_issue25_a_loop_guard_halt_traces_the_model_calls_tools_and_the_halt(
    receiver: OtlpReceiver,
) -> None:
    async with FakeLLM() as server:
        server.responder = lambda _: tool_call_response(("get_status", {"service": "db"}))
        config = OpenAIAgentConfig.model_validate(
            {
                "kind": "openai",
                "base_url": server.base_url,
                "model": "test-model",
                "tools": ["tests.gateway.agents.tools_for_tests:get_status"],
                "max_tool_rounds": 20,
            }
        )
        agent = OpenAIAgent("helper", config, sleep=SleepRecorder())
        try:
            rig = PipelineRig(rig_config(), {"parrot": agent})
            await rig.start()
            connector = rig.connector()
            await connector.push(connector.message("is the db up?"))
        finally:
            await agent.aclose()
        traceparents = [request.headers.get("traceparent", "") for request in server.requests]
    [spans] = (await flushed(receiver)).values()
    root = root_of(spans)
    [turn] = children(spans, root)[-1:]
    assert turn.name == "invoke_agent parrot"
    chats = [span for span in spans if span.name == "chat test-model"]
    tools = [span for span in spans if span.name == "execute_tool get_status"]
    assert len(chats) == len(server.requests) == 9
    assert len(tools) == 9
    assert all(span.parent_id == turn.span_id for span in chats + tools)
    chat = chats[0]
    assert chat.attributes[tracing.REQUEST_MODEL] == "test-model"
    assert chat.attributes[tracing.PROVIDER_NAME] == "openai"
    assert chat.attributes[tracing.CALL_OUTCOME] == "forwarded"
    assert (
        chat.attributes[tracing.USAGE_INPUT_TOKENS],
        chat.attributes[tracing.USAGE_OUTPUT_TOKENS],
    ) == (10, 5)
    # The model provider sees the HTTP client span of each call, under the call's own span.
    _, trace_id, parent_id, _ = traceparents[0].split("-")
    [http] = [span for span in spans if span.span_id == parent_id]
    assert (trace_id, http.parent_id) == (chat.trace_id, chat.span_id)
    assert http.name == "POST"
    assert [span.attributes[tracing.TOOL_ACTION] for span in tools][-2:] == ["block", "halt"]
    assert tools[-1].attributes[tracing.TOOL_CODE] == "no_progress_halt"
    halt = [span for span in children(spans, turn) if span.name == "apply_guardrail tool_loop"]
    assert [span.attributes[tracing.GUARDRAIL_CODE] for span in halt] == ["no_progress_halt"]
    assert halt[0].attributes[tracing.GUARDRAIL_RESULT] == "refused"
    assert "\n".join(tree(spans, root)).count("execute_tool") == 9


async def test_issue25_the_proxy_continues_the_clients_trace_to_a_loop_detected_refusal(
    receiver: OtlpReceiver,
) -> None:
    async with running_proxy("call_loop: {max_repeats: 2}") as rig:
        body = {"model": MODEL, "messages": [{"role": "user", "content": SECRET_TEXT}]}
        headers = {"Authorization": f"Bearer {PROXY_KEY}", "traceparent": TRACEPARENT}
        statuses = []
        async with aiohttp.ClientSession() as session:
            for _ in range(3):
                url = f"{rig.url}/openai/v1/chat/completions"
                async with session.post(url, json=body, headers=headers) as response:
                    statuses.append(response.status)
        upstream_parents = [r.headers.get("traceparent", "") for r in rig.upstream.requests]
    assert statuses == [200, 200, 429]
    traces = await flushed(receiver)
    spans = traces[CLIENT_TRACE]
    chats = [span for span in spans if span.name == f"chat {MODEL}"]
    assert len(chats) == 3
    assert all(span.parent_id == CLIENT_SPAN for span in chats)
    assert all(span.attributes[tracing.AGENT_NAME] == "billing-bot" for span in chats)
    forwarded, _, refused = chats
    _, trace_id, parent_id, _ = upstream_parents[0].split("-")
    [http] = [span for span in spans if span.span_id == parent_id]
    assert (trace_id, http.parent_id) == (CLIENT_TRACE, forwarded.span_id)
    assert forwarded.attributes[tracing.HTTP_STATUS] == 200
    assert refused.error
    assert refused.attributes[tracing.ERROR_TYPE] == "loop_detected"
    [why] = children(spans, refused)
    assert why.name == "apply_guardrail call_loop"
    assert guardrails([why]) == [("call_loop", "loop_detected", "refused", False)]
    assert no_text(spans, SECRET_TEXT)
    assert not any(span.attributes.get("authorization") for span in spans)


def test_issue25_telemetry_off_imports_nothing_of_the_opentelemetry_sdk() -> None:
    script = (
        "import sys\n"
        "import gateway.cli.main, gateway.app.runtime, gateway.proxy.app\n"
        "from gateway.config import TelemetryConfig\n"
        "from gateway.observability.telemetry import setup_tracing\n"
        "tracer = setup_tracing(TelemetryConfig(), 'x')\n"
        "assert not tracer.enabled\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry.sdk')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("endpoint", "reason"),
    [
        ("ftp://collector:4318", "http:// or https://"),
        ("http://user:pw@collector:4318", "credentials"),
        ("http://collector:4318/?token=x", "query"),
        ("http://collector:4318\x1b[2J", "control characters"),
        ("http://collector:99999", "port"),
    ],
)
def test_issue25_a_bad_otlp_endpoint_is_refused_naming_the_field(
    endpoint: str, reason: str
) -> None:
    with pytest.raises((ConfigError, ValidationError)) as raised:
        parse_config(f"telemetry: {{otlp_endpoint: {json.dumps(endpoint)}}}\n", env={})
    assert "telemetry.otlp_endpoint" in str(raised.value)
    assert reason in str(raised.value)
    assert "pw@" not in str(raised.value)


def test_issue25_the_endpoint_names_the_traces_path() -> None:
    config = parse_config("telemetry: {otlp_endpoint: 'http://127.0.0.1:4318/'}\n", env={})
    assert config.telemetry.traces_url == "http://127.0.0.1:4318/v1/traces"
    assert parse_config("", env={}).telemetry.traces_url is None


async def test_issue25_an_export_posts_up_to_2048_spans(monkeypatch: pytest.MonkeyPatch) -> None:
    # No scheduled export during the test: only a full batch or the flush posts.
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "3600000")
    async for receiver in _receiver():
        active = tracing.tracer()
        for n in range(600):
            with active.span(f"{tracing.MESSAGE} room", {tracing.MESSAGE_ID: str(n)}, root=True):
                pass
        traces = await flushed(receiver)
        # The SDK's own batch of 512 would have posted twice.
        assert len(receiver.content_types) == 1
        assert len(traces) == 600


async def test_issue25_a_span_is_current_in_its_block_and_an_escaping_error_marks_it(
    receiver: OtlpReceiver,
) -> None:
    active = tracing.tracer()
    with pytest.raises(KeyError):
        _failing_turn(active)
    with active.span("message later", {}, root=True):
        pass
    traces = await flushed(receiver)
    [failed, later] = traces.values()
    root = root_of(failed)
    [turn_span] = children(failed, root)
    assert turn_span.attributes[tracing.AGENT_NAME] == "parrot"
    assert turn_span.attributes[tracing.CONVERSATION_ID] == "room:C1"
    assert [span.attributes.get(tracing.ERROR_TYPE) for span in (turn_span, root)] == [
        "KeyError",
        "KeyError",
    ]
    assert turn_span.error
    assert root.error
    assert no_text(failed, "a user's text")
    assert [span.name for span in later] == ["message later"]
    assert active.current() is tracing.NO_SPAN


def _failing_turn(active: tracing.Tracer) -> None:
    """A turn that fails with a KeyError quoting a user's text, inside its message's span."""
    with active.span("message room", {}, root=True), active.span("invoke_agent parrot", {}) as turn:
        turn.set_attribute(tracing.AGENT_NAME, "parrot")
        active.current().set_attribute(tracing.CONVERSATION_ID, "room:C1")
        raise KeyError("a user's text")
