"""The gateway's own openai agents write every model call to the request log (issue 12).

Real parts throughout: the Gateway runtime with its pipeline (the agent alone for a
streamed reply), an openai agent against the fake LLM server on loopback, memory and
SQLite call stores, the admin API over HTTP and the `loopwarden calls export` command.
The fake model reports 11 input and 7 output tokens a call; `m` costs $1 per 1,000
tokens either way, so an answered call costs $0.018.
"""

from __future__ import annotations

import asyncio
import csv
import io
import math
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest

from gateway.agents.openai import OpenAIAgent
from gateway.app.runtime import Gateway
from gateway.app.types import InboundMessage
from gateway.calls.entry import CallLogEntry
from gateway.calls.query import CallFilter
from gateway.calls.store import MemoryCallStore
from gateway.cli.main import main
from gateway.config import Config, OpenAIAgentConfig, parse_config
from gateway.delivery.sender import Delivery
from gateway.delivery.streaming import ReplyStream
from gateway.proxy.pricing import PriceTable
from gateway.proxy.request_log import RequestLog
from guards.call_loop import circuit_key
from tests.fakes.editing_room import EditingRoom
from tests.fakes.inmemory import FakeClock
from tests.fakes.llm_upstream import INPUT_TOKENS, OUTPUT_TOKENS, FakeLLM, tool_call_response
from tests.gateway.agents.agent_turns import make_turn
from tests.gateway.runtime_helpers import FakeConnector, FakePlatform

TOKEN = "calls-admin-token-0123456789"
START = 1_800_000_000.0
CHAT = "/v1/chat/completions"
TOOL = "tests.gateway.agents.tools_for_tests:get_status"
ROOM = "room:lobby"
CIRCUIT = circuit_key("helper", ROOM)


def config_yaml(llm: FakeLLM, extra: str = "") -> str:
    """One room bot on an openai agent whose model `m` is priced; room memory off."""
    return f"""
http: {{host: 127.0.0.1, port: 0, admin_token: {TOKEN}}}
agents:
  helper: {{kind: openai, base_url: '{llm.base_url}', model: m, tools: ['{TOOL}'],
           max_tool_rounds: 20}}
bots: [{{id: alpha, platform: room, agent: helper}}]
pipeline: {{transcript: {{max_messages: 0}}}}
proxy: {{default_output_tokens: 10, prices: {{m: {{input_per_1k: 1.0, output_per_1k: 1.0}}}}}}
{extra}
"""


def log_config(llm: FakeLLM, extra: str = "") -> Config:
    """`config_yaml`, parsed."""
    return parse_config(config_yaml(llm, extra), env={})


def said(text: str) -> InboundMessage:
    """A person's message to the bot in the lobby."""
    return InboundMessage(
        platform="room",
        bot_id="alpha",
        channel_id="lobby",
        thread_id=None,
        message_id=f"m-{text}",
        sender_id="u-human",
        sender_name="u-human",
        sender_is_bot=False,
        text=text,
        mentions_bot=True,
        bot_user_id="alpha",
    )


@asynccontextmanager
async def running(
    config: Config, clock: Callable[[], float] | None = None
) -> AsyncIterator[tuple[Gateway, FakeConnector]]:
    """A started Gateway on the fake platform (a memory call store on `clock` when given)."""
    platform = FakePlatform()
    calls = None if clock is None else MemoryCallStore(clock=clock, wall_clock=clock)
    gateway = Gateway(
        config,
        calls=calls,
        clock=clock,
        connector_factory=platform,
        wall_clock=clock or time.time,
        connect_timeout=5.0,
    )
    await gateway.start()
    try:
        yield gateway, platform.made["alpha"]
    finally:
        await gateway.stop(1.0)


async def logged(gateway: Gateway) -> list[CallLogEntry]:
    """Every call the gateway's request log has written, oldest first."""
    await gateway.request_log.settle()
    return await gateway.calls.calls_since(math.inf)


@pytest.fixture
async def llm() -> AsyncIterator[FakeLLM]:
    async with FakeLLM() as fake:
        yield fake


async def test_issue12_a_forwarded_call_is_logged_with_its_usage_and_cost(llm: FakeLLM) -> None:
    clock = FakeClock(START)
    async with running(log_config(llm), clock) as (gateway, alpha):
        await alpha.push(said("is the db up?"))
        [entry] = await logged(gateway)
    assert entry == CallLogEntry(
        at=START,
        provider="openai",
        agent="helper",
        session=ROOM,
        circuit=CIRCUIT,
        model="m",
        outcome="forwarded",
        status=200,
        input_tokens=INPUT_TOKENS,
        output_tokens=OUTPUT_TOKENS,
        cost=entry.cost,
        estimated=False,
        fingerprint=entry.fingerprint,
        retry=0,
        duration_ms=entry.duration_ms,
        fields={"room": ROOM, "bot": "alpha"},
    )
    assert entry.cost == pytest.approx((INPUT_TOKENS + OUTPUT_TOKENS) / 1000)
    assert entry.fingerprint
    assert entry.duration_ms >= 0


async def test_issue12_a_call_refused_loop_detected_is_logged_with_its_estimate(
    llm: FakeLLM,
) -> None:
    # The model asks for the same tool call forever: the call guard sees one call repeated.
    llm.responder = lambda _: tool_call_response(("get_status", {"service": "db"}))
    config = log_config(llm, "policy: {call_loop: {max_repeats: 2}}")
    async with running(config, FakeClock(START)) as (gateway, alpha):
        await alpha.push(said("is the db up?"))
        entries = await logged(gateway)
        totals = await gateway.calls.call_totals(CallFilter(agent="helper"))
    assert [entry.outcome for entry in entries] == ["forwarded"] * 3 + ["loop_detected"]
    refused = entries[-1]
    assert (refused.status, refused.estimated, refused.circuit) == (None, True, CIRCUIT)
    # Input: the unsent request's size / 4, larger than the last one sent; output: the
    # average the forwarded calls reported.
    last_sent = llm.calls(CHAT)[-1]
    assert refused.input_tokens is not None
    assert refused.input_tokens > math.ceil(len(last_sent.body) / 4)
    answered = entries[0].output_tokens
    assert answered is not None
    assert refused.output_tokens == answered
    assert refused.cost == pytest.approx((refused.input_tokens + answered) / 1000)
    assert totals.refused == 1
    assert totals.cost_saved == pytest.approx(refused.cost)


async def test_issue12_an_upstream_500_is_logged_upstream_error_and_costs_nothing(
    llm: FakeLLM,
) -> None:
    llm.fail_next(500, retry_after=0)  # retried at once: the second attempt is answered
    async with running(log_config(llm), FakeClock(START)) as (gateway, alpha):
        await alpha.push(said("is the db up?"))
        failed, answered = await logged(gateway)
    assert (failed.outcome, failed.status, failed.retry) == ("upstream_error", 500, 0)
    assert (failed.input_tokens, failed.output_tokens, failed.cost) == (0, 0, 0.0)
    assert not failed.estimated
    assert (answered.outcome, answered.status, answered.retry) == ("forwarded", 200, 1)
    assert failed.fingerprint == answered.fingerprint


async def test_issue12_a_call_the_budget_refuses_is_logged_budget_exceeded(llm: FakeLLM) -> None:
    config = log_config(llm, "policy: {spend: {limit_tokens: 150}}")
    async with running(config, FakeClock(START)) as (gateway, alpha):
        for n in range(10):
            await alpha.push(said(f"question {n}"))
        entries = await logged(gateway)
    sent = len(llm.calls(CHAT))
    assert 1 <= sent < 10
    assert [entry.outcome for entry in entries] == ["forwarded"] * sent + ["budget_exceeded"] * (
        10 - sent
    )
    refused = entries[-1]
    assert refused.estimated
    assert refused.output_tokens == OUTPUT_TOKENS  # the average of the answered calls
    assert refused.cost == pytest.approx(((refused.input_tokens or 0) + OUTPUT_TOKENS) / 1000)


async def test_issue12_the_admin_api_lists_the_agents_calls_by_agent(llm: FakeLLM) -> None:
    async with running(log_config(llm), FakeClock(START)) as (gateway, alpha):
        await alpha.push(said("is the db up?"))
        await gateway.request_log.settle()
        headers = {"Authorization": f"Bearer {TOKEN}"}
        base = f"http://127.0.0.1:{gateway.port}/admin/calls"
        async with aiohttp.ClientSession(headers=headers) as http:
            async with http.get(base, params={"agent": "helper"}) as response:
                assert response.status == 200
                mine = await response.json()
            async with http.get(base, params={"agent": "someone-else"}) as response:
                others = await response.json()
    [call] = mine["calls"]
    assert (call["agent"], call["session"], call["outcome"]) == ("helper", ROOM, "forwarded")
    assert call["fields"] == {"room": ROOM, "bot": "alpha"}
    assert mine["totals"]["cost"] == pytest.approx(0.018)
    assert others["calls"] == []


async def test_issue12_calls_export_reads_the_agents_calls_from_sqlite(
    llm: FakeLLM, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = f"state: {{backend: sqlite, path: '{tmp_path / 'state.sqlite3'}'}}"
    async with running(log_config(llm, state)) as (_, alpha):
        await alpha.push(said("is the db up?"))
    # Stopping the gateway drained its request log into the file.
    path = tmp_path / "loopwarden.yaml"
    path.write_text(config_yaml(llm, state))
    capsys.readouterr()
    # The command runs its own event loop, as from a shell.
    assert await asyncio.to_thread(main, ["calls", "export", "--csv", "--config", str(path)]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [(row["agent"], row["session"], row["outcome"]) for row in rows] == [
        ("helper", ROOM, "forwarded")
    ]


async def test_issue12_a_streamed_call_is_logged_with_its_usage_chunk(llm: FakeLLM) -> None:
    clock = FakeClock(START)
    store = MemoryCallStore(clock=clock, wall_clock=clock)
    request_log = RequestLog(store, PriceTable.for_config(log_config(llm).proxy), wall_clock=clock)
    config = OpenAIAgentConfig(kind="openai", base_url=llm.base_url, model="m", stream=True)
    agent = OpenAIAgent("helper", config, calls=store, request_log=request_log)
    turn = make_turn("hi")  # no budget: the stream still asks for its usage, for the log
    turn.stream = ReplyStream(Delivery(), EditingRoom(), "c1", thread_id=None, reply_to="m1")
    try:
        assert (await agent.respond(turn)).text
    finally:
        await agent.aclose()
    await request_log.settle()
    [request] = llm.calls(CHAT)
    assert request.json()["stream_options"] == {"include_usage": True}
    [entry] = await store.calls_since(math.inf)
    assert (entry.outcome, entry.input_tokens, entry.output_tokens) == (
        "forwarded",
        INPUT_TOKENS,
        OUTPUT_TOKENS,
    )
    assert entry.cost == pytest.approx(0.018)
    assert not entry.estimated
