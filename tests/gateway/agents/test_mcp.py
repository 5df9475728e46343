"""MCP tools of the openai agent against real MCP servers (stdio and streamable HTTP, issue 11).

The servers are `tests/fakes/mcp_servers.py` (the SDK's MCPServer) run as child processes,
and the model is the fake OpenAI-compatible server of `tests/fakes/llm_upstream.py`
scripted to call their tools. One stdio server is shared by the module; the tests that
need a server of their own (killed, not started yet, logging its listing) start one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web

from gateway.agents.mcp import (
    MAX_RESULT_BYTES,
    McpToolbox,
)
from gateway.agents.openai import OpenAIAgent
from gateway.app.types import AgentResult, Halt
from gateway.config import McpServerConfig, OpenAIAgentConfig, Policy, parse_config
from tests.fakes import mcp_servers
from tests.fakes.llm_upstream import (
    FakeLLM,
    Json,
    Received,
    text_response,
    tool_call_response,
)
from tests.fakes.loopback import LOOPBACK_HOST, serve_loopback
from tests.gateway.agents.agent_turns import make_turn
from tests.gateway.runtime_helpers import FakePlatform, gateway_for, human

pytestmark = pytest.mark.asyncio(loop_scope="module")

FAKE = str(Path(mcp_servers.__file__))
STDIO = (sys.executable, FAKE, "stdio")
FAST = {"backoff": (0.01, 0.05), "connect_timeout": 60.0}
STUCK = Policy.model_validate(
    # No-progress HALT out of the way, so the count thresholds of the bucket decide;
    # the call-loop guard out of the way too (every round's model call looks alike).
    {"tool_loop": {"no_progress_halt": 20}, "call_loop": {"max_repeats": 100}}
)


def stdio_server(name: str = "t", **fields: object) -> McpServerConfig:
    """The fake MCP server as a stdio child process."""
    return McpServerConfig.model_validate({"name": name, "command": STDIO, **fields})


async def connected(toolbox: McpToolbox) -> None:
    """Wait until the toolbox's one server is connected (bounded, not timed)."""
    (link,) = toolbox.links
    async with asyncio.timeout(60):
        await link.up.wait()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as shared:
        yield shared


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def shared_tools() -> AsyncIterator[McpToolbox]:
    toolbox = McpToolbox("helper", [stdio_server()], **FAST)  # type: ignore[arg-type]
    await toolbox.start()
    yield toolbox
    await toolbox.aclose()


@pytest_asyncio.fixture(loop_scope="module")
async def llm() -> AsyncIterator[FakeLLM]:
    async with FakeLLM() as fake:
        yield fake


AgentFor = Callable[[McpToolbox], OpenAIAgent]


@pytest.fixture
def agent_for(llm: FakeLLM, session: aiohttp.ClientSession) -> AgentFor:
    """An openai agent on the fake model with these MCP tools (the toolbox is the test's)."""
    config = OpenAIAgentConfig(kind="openai", base_url=llm.base_url, model="m", max_tool_rounds=20)
    return lambda toolbox: OpenAIAgent(
        "helper", config, mcp=toolbox, session_factory=lambda: session
    )


def _tool_messages(llm: FakeLLM) -> list[str]:
    """The tool results fed back to the model, in order, from the last request."""
    return [str(m["content"]) for m in llm.requests[-1].tool_messages]


def _offered(request: Received) -> dict[str, Json]:
    """The tools a request offered the model, by name."""
    tools = request.json().get("tools", [])
    return {tool["function"]["name"]: tool["function"] for tool in tools}


def _verdicts(result: AgentResult) -> list[tuple[str, str]]:
    return [(call.action, call.code) for call in result.tool_calls]


async def test_issue11_tools_are_offered_as_server_tool_and_answer(
    llm: FakeLLM, shared_tools: McpToolbox, agent_for: AgentFor
) -> None:
    llm.enqueue(tool_call_response(("t__run_query", {"key": "k1"})), text_response("done"))
    result = await agent_for(shared_tools).respond(make_turn("look", channel_id="offer"))
    assert result.text == "done"
    offered = _offered(llm.requests[0])
    assert offered["t__run_query"]["parameters"] == {
        "type": "object",
        "properties": {"key": {"title": "Key", "type": "string"}},
        "required": ["key"],
        "title": "run_queryArguments",
    }
    assert "t__dotted_name" in offered  # sanitised: '.' is not allowed in a function name
    assert "t__absurd" not in offered  # schema nested deeper than 32 levels
    assert not any(name.startswith("t__nnnn") for name in offered)  # longer than 64
    assert _tool_messages(llm) == ["value of k1"]
    assert _verdicts(result) == [("allow", "ok")]


async def test_issue11_stuck_read_only_tool_halts_at_the_idempotent_thresholds(
    llm: FakeLLM, shared_tools: McpToolbox, agent_for: AgentFor
) -> None:
    """`run_query` has a mutating verb, but readOnlyHint makes it idempotent: 5/8/12."""
    llm.responder = lambda _: tool_call_response(("t__run_query", {"key": "same"}))
    turn = make_turn("loop", channel_id="stuck-read", policy=STUCK)
    result = await agent_for(shared_tools).respond(turn)
    assert result.halt == Halt("tool_loop", "count_halt")
    actions = [action for action, _ in _verdicts(result)]
    assert actions == ["allow"] * 3 + ["warn"] * 4 + ["block"] * 4 + ["halt"]
    assert result.tool_calls[7].code == "count_block"  # idempotent_block_threshold: 8
    assert "t__run_query" in (result.text or "")


async def test_issue11_stuck_destructive_tool_halts_at_the_mutating_thresholds(
    llm: FakeLLM, shared_tools: McpToolbox, agent_for: AgentFor
) -> None:
    """`show_once` has a read verb, but destructiveHint makes it mutating: 3/5/7."""
    llm.responder = lambda _: tool_call_response(("t__show_once", {"token": "x"}))
    turn = make_turn("burn", channel_id="stuck-destroy", policy=STUCK)
    result = await agent_for(shared_tools).respond(turn)
    assert result.halt == Halt("tool_loop", "count_halt")
    assert _verdicts(result) == [
        ("allow", "ok"),
        ("allow", "ok"),
        ("warn", "count_warn"),
        ("warn", "no_progress_warn"),
        ("block", "count_block"),
        ("block", "count_block"),
        ("halt", "count_halt"),
    ]


async def test_issue11_is_error_results_build_the_failure_streak(
    llm: FakeLLM, shared_tools: McpToolbox, agent_for: AgentFor
) -> None:
    reasons = iter(range(100))
    llm.responder = lambda _: tool_call_response(("t__fail", {"reason": f"r{next(reasons)}"}))
    turn = make_turn("fail", channel_id="failing", policy=STUCK)
    result = await agent_for(shared_tools).respond(turn)
    assert result.halt == Halt("tool_loop", "failure_halt")
    verdicts = _verdicts(result)
    assert verdicts[:3] == [("allow", "ok"), ("allow", "ok"), ("warn", "failure_warn")]
    assert verdicts[-1] == ("halt", "failure_halt")
    assert len(verdicts) == 8
    first = json.loads(llm.requests[1].tool_messages[0]["content"])
    assert first == {"error": "McpToolError: Error executing tool fail: cannot do that: r0"}


async def test_issue11_huge_and_binary_results_reach_the_model_capped_and_summarised(
    llm: FakeLLM, shared_tools: McpToolbox, agent_for: AgentFor
) -> None:
    llm.enqueue(
        tool_call_response(("t__huge", {"size": 1_000_000}), ("t__picture", {})),
        text_response("seen"),
    )
    result = await agent_for(shared_tools).respond(make_turn("big", channel_id="big"))
    assert result.text == "seen"
    huge, picture = _tool_messages(llm)
    assert huge.startswith("x" * 1000)
    assert huge.endswith(f"\n[{1_000_000 - MAX_RESULT_BYTES} more bytes cut by loopwarden]")
    assert len(huge) < MAX_RESULT_BYTES + 100
    assert picture == "[image image/png, 32 bytes not shown]\na tiny picture"


async def test_issue11_a_server_killed_mid_turn_gives_the_model_an_error_and_comes_back(
    llm: FakeLLM, agent_for: AgentFor, caplog: pytest.LogCaptureFixture
) -> None:
    toolbox = McpToolbox("helper", [stdio_server("k")], **FAST)  # type: ignore[arg-type]
    agent = agent_for(toolbox)
    try:
        llm.enqueue(tool_call_response(("k__crash", {})), text_response("it broke"))
        result = await agent.respond(make_turn("crash", channel_id="crash"))
        assert result.text == "it broke"
        assert not result.halted
        (error,) = _tool_messages(llm)
        assert json.loads(error)["error"].startswith("McpUnavailable: MCP server k went away")
        assert "agent helper: MCP server k dropped" in caplog.text
        await connected(toolbox)  # started again
        llm.enqueue(tool_call_response(("k__run_query", {"key": "b"})), text_response("ok"))
        again = await agent.respond(make_turn("again", channel_id="crash"))
        assert again.text == "ok"
        assert _tool_messages(llm) == ["value of b"]
    finally:
        await toolbox.aclose()


async def test_issue11_bad_tools_are_logged_not_offered_and_env_reaches_the_server(
    llm: FakeLLM, agent_for: AgentFor, caplog: pytest.LogCaptureFixture
) -> None:
    server = stdio_server("e", env={"LW_TEST_TOKEN": "s3cret-token"})
    toolbox = McpToolbox("helper", [server], **FAST)  # type: ignore[arg-type]
    agent = agent_for(toolbox)
    try:
        with caplog.at_level(logging.INFO, logger="loopwarden.agents.mcp"):
            llm.enqueue(
                tool_call_response(("e__absurd", {}), ("e__read_env", {"name": "LW_TEST_TOKEN"})),
                text_response("fine"),
            )
            result = await agent.respond(make_turn("env", channel_id="env"))
        assert result.text == "fine"
        unknown, value = _tool_messages(llm)
        assert json.loads(unknown)["error"].startswith("LookupError: unknown tool 'e__absurd'")
        assert value == "s3cret-token"
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert (
            "agent helper: MCP server e: tool 'absurd' is not offered: "
            "its input schema nests deeper than 32 levels"
        ) in warnings
        assert any(f"tool {'n' * 70!r} is not offered" in w for w in warnings)
        assert "agent helper: MCP server e connected (attempt 1), 9 tools" in caplog.messages
        assert "s3cret" not in caplog.text
    finally:
        await toolbox.aclose()


@contextlib.contextmanager
def _reserved_port() -> Iterator[socket.socket]:
    """A bound loopback socket nobody listens on yet: connecting to it is refused."""
    sock = socket.socket()
    try:
        sock.bind((LOOPBACK_HOST, 0))
        yield sock
    finally:
        sock.close()


async def test_issue11_http_server_down_at_start_is_retried_and_its_tools_arrive(
    llm: FakeLLM, agent_for: AgentFor, caplog: pytest.LogCaptureFixture
) -> None:
    with _reserved_port() as sock:
        port = sock.getsockname()[1]
        server = McpServerConfig(name="web", url=f"http://{LOOPBACK_HOST}:{port}/mcp")
        toolbox = McpToolbox("helper", [server], **FAST)  # type: ignore[arg-type]
        agent = agent_for(toolbox)
        child: asyncio.subprocess.Process | None = None
        try:
            llm.enqueue(text_response("no tools yet"))
            first = await agent.respond(make_turn("hi", channel_id="web"))
            assert first.text == "no tools yet"
            assert "tools" not in llm.requests[-1].json()
            assert "agent helper: MCP server web unavailable (attempt 1" in caplog.text
            fd = sock.fileno()
            child = await asyncio.create_subprocess_exec(
                sys.executable, FAKE, "http", "--fd", str(fd), pass_fds=[fd]
            )
            await connected(toolbox)
            llm.responder = lambda _: tool_call_response(("web__show_once", {"token": "y"}))
            turn = make_turn("burn", channel_id="web", policy=STUCK)
            result = await agent.respond(turn)
            assert result.halt == Halt("tool_loop", "count_halt")
            assert len(result.tool_calls) == 7  # mutating_halt_threshold, over HTTP too
            assert "web__show_once" in _offered(llm.requests[-1])
        finally:
            await toolbox.aclose()
            if child is not None:
                child.kill()
                await child.wait()


async def test_issue11_headers_are_sent_and_never_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An HTTP server that refuses the connection: the header went out, the log hides it."""
    seen: list[str] = []

    async def refuse(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization", ""))
        return web.Response(status=500, text="no")

    app = web.Application()
    app.router.add_route("*", "/mcp", refuse)
    runner = web.AppRunner(app)
    port = await serve_loopback(runner)
    server = McpServerConfig.model_validate(
        {
            "name": "web",
            "url": f"http://{LOOPBACK_HOST}:{port}/mcp",
            "headers": {"Authorization": "Bearer s3cret-header"},
        }
    )
    toolbox = McpToolbox("helper", [server], **FAST)  # type: ignore[arg-type]
    try:
        await toolbox.start()
        assert toolbox.tools() == {}
        assert seen
        assert seen[0] == "Bearer s3cret-header"
        assert "agent helper: MCP server web unavailable" in caplog.text
        assert "s3cret" not in caplog.text
    finally:
        await toolbox.aclose()
        await runner.cleanup()


async def test_issue11_gateway_runs_ready_without_a_server_that_cannot_start(
    llm: FakeLLM,
) -> None:
    config = parse_config(
        "http: {host: 127.0.0.1, port: 0}\n"
        "agents:\n"
        f"  helper: {{kind: openai, base_url: '{llm.base_url}', model: m,\n"
        "           mcp_servers: [{name: gone, command: [/nonexistent/mcp-server]}]}\n"
        "bots: [{id: bot-a, platform: room, agent: helper}]\n",
        env={},
    )
    platform = FakePlatform()
    gateway = gateway_for(config, platform)
    llm.enqueue(text_response("still here"))
    await gateway.start()
    try:
        connector = platform.made["bot-a"]
        await connector.up.wait()
        reply = await connector.push(human("hello"))
        assert gateway.ready
        assert getattr(reply, "text", None) == "still here"
        assert "tools" not in llm.requests[-1].json()
    finally:
        await gateway.stop(drain_seconds=5)


async def test_issue11_a_server_answering_garbage_is_logged_and_the_turn_is_answered(
    llm: FakeLLM, agent_for: AgentFor, caplog: pytest.LogCaptureFixture
) -> None:
    garbage = (sys.executable, "-c", "print('{not json'); print('\\x00\\xff' * 1000)")
    server = McpServerConfig(name="junk", command=garbage)
    toolbox = McpToolbox("helper", [server], **FAST)  # type: ignore[arg-type]
    try:
        llm.enqueue(text_response("answered anyway"))
        result = await agent_for(toolbox).respond(make_turn("hi", channel_id="junk"))
        assert result.text == "answered anyway"
        assert "tools" not in llm.requests[-1].json()
        assert "agent helper: MCP server junk unavailable (attempt 1" in caplog.text
    finally:
        await toolbox.aclose()


async def test_issue11_mcp_servers_are_listed_when_the_gateway_starts(llm: FakeLLM) -> None:
    command = ", ".join(f"'{part}'" for part in STDIO)
    config = parse_config(
        "http: {host: 127.0.0.1, port: 0}\n"
        "agents:\n"
        f"  helper: {{kind: openai, base_url: '{llm.base_url}', model: m,\n"
        f"           mcp_servers: [{{name: t, command: [{command}]}}]}}\n"
        "bots: [{id: bot-a, platform: room, agent: helper}]\n",
        env={},
    )
    platform = FakePlatform()
    gateway = gateway_for(config, platform)
    await gateway.start()
    try:
        agent = gateway.agents["helper"]
        assert isinstance(agent, OpenAIAgent)
        assert agent.mcp is not None
        assert agent.mcp.tools(), "the tools are there before any turn"
        assert llm.requests == []
    finally:
        await gateway.stop(drain_seconds=5)
