"""Shadow mode of the openai agent's tool-call and LLM-call guards, against the fake provider."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from pydantic import SecretStr

from gateway.agents.openai import OpenAIAgent
from gateway.agents.spend import AgentBudgets
from gateway.app.types import AgentResult, Halt
from gateway.calls.factory import build_call_store
from gateway.calls.store import CallStore
from gateway.config import OpenAIAgentConfig, Policy, StateConfig
from gateway.config.proxy import ProxyConfig
from gateway.delivery.sender import Delivery
from gateway.delivery.streaming import ReplyStream
from tests.fakes.editing_room import EditingRoom
from tests.fakes.inmemory import PipelineRig, rig_config
from tests.fakes.llm_upstream import FakeLLM, tool_call_response
from tests.gateway.agents.agent_turns import make_turn

TOOLS = "tests.gateway.agents.tools_for_tests"
ROUNDS = 12
CHAT = "/v1/chat/completions"
PRICE = {"input_per_1k": 1.0, "output_per_1k": 1.0}
BACKENDS = ["memory", "sqlite", pytest.param("redis", marks=pytest.mark.redis)]
_prefixes = itertools.count()


@pytest.fixture
async def server() -> AsyncIterator[FakeLLM]:
    async with FakeLLM() as fake:
        fake.responder = lambda _: tool_call_response(("get_status", {"service": "db"}))
        yield fake


@pytest.fixture
async def agent(server: FakeLLM) -> AsyncIterator[OpenAIAgent]:
    config = OpenAIAgentConfig.model_validate(
        {
            "kind": "openai",
            "base_url": server.base_url,
            "model": "test-model",
            "tools": [f"{TOOLS}:get_status"],
            "max_tool_rounds": ROUNDS,
        }
    )

    async def no_sleep(seconds: float) -> None:
        """Retries never wait in these tests."""

    built = OpenAIAgent("helper", config, sleep=no_sleep)
    try:
        yield built
    finally:
        await built.aclose()


def _fed_back(server: FakeLLM) -> list[object]:
    """What each tool message sent back to the model said, in order."""
    return [json.loads(str(r.tool_messages[-1]["content"])) for r in server.requests[1:]]


async def test_issue13_tool_loop_shadow_runs_every_call_and_feeds_back_real_results(
    server: FakeLLM, agent: OpenAIAgent
) -> None:
    policy = Policy.model_validate(
        {"tool_loop": {"mode": "shadow"}, "call_loop": {"max_repeats": 100}}
    )
    result = await agent.respond(make_turn("is the db up?", policy=policy))
    # Enforce mode halts on the 9th call (see test_openai); shadow runs every round.
    assert result.halt == Halt("agent", "max_tool_rounds")
    assert len(result.tool_calls) == ROUNDS
    assert all(call.shadow for call in result.tool_calls)
    actions = [call.action for call in result.tool_calls]
    assert actions[:9] == ["allow"] * 3 + ["warn"] * 4 + ["block", "halt"]
    # Every result went back to the model as the tool returned it: no annotation, no block.
    assert _fed_back(server) == [{"service": "db", "state": "pending"}] * ROUNDS


async def test_issue13_call_loop_shadow_sends_every_call_and_reports_the_refusals(
    server: FakeLLM, agent: OpenAIAgent, caplog: pytest.LogCaptureFixture
) -> None:
    policy = Policy.model_validate(
        {"tool_loop": {"mode": "shadow"}, "call_loop": {"max_repeats": 2, "mode": "shadow"}}
    )
    with caplog.at_level(logging.INFO, logger="loopwarden.agents.openai"):
        result = await agent.respond(make_turn("is the db up?", policy=policy))
    assert len(server.requests) == ROUNDS + 1
    assert result.halt == Halt("agent", "max_tool_rounds")
    # Requests 2 to 13 share their last two messages (call ids aside): the 4th is the
    # third such one, refused, and pauses the circuit, so every later call is
    # `loop_paused` (as in enforce mode), and each one was sent all the same.
    assert result.shadowed == (
        Halt("call_loop", "loop_detected"),
        *[Halt("call_loop", "loop_paused")] * (ROUNDS + 1 - 4),
    )
    assert [p.circuit for p in await agent.calls.paused()] == ["helper/session=room%3Ac1"]
    assert any("shadow: would have refused the model call" in m for m in caplog.messages)


async def test_issue13_shadow_verdicts_are_counted_and_shown_in_status(
    server: FakeLLM, agent: OpenAIAgent
) -> None:
    rig = PipelineRig(
        rig_config(
            "policy: {tool_loop: {mode: shadow}, call_loop: {mode: shadow, max_repeats: 2}}"
        ),
        {"parrot": agent},
    )
    await rig.start()
    connector = rig.connector()
    await connector.push(connector.message("is the db up?"))
    value = rig.metrics.value
    assert value("guard_decisions_total", guard="tool_loop", shadow="false") == 0
    assert value("guard_decisions_total", guard="tool_loop", code="ok", shadow="true") == 3
    blocked = value("guard_decisions_total", guard="tool_loop", code="count_block", shadow="true")
    halted = value(
        "guard_decisions_total", guard="tool_loop", code="no_progress_halt", shadow="true"
    )
    assert blocked + halted == ROUNDS - 7
    detected = value(
        "guard_decisions_total", guard="call_loop", code="loop_detected", shadow="true"
    )
    assert detected == 1
    paused = value("guard_decisions_total", guard="call_loop", code="loop_paused", shadow="true")
    assert paused == ROUNDS + 1 - 4
    status = (await rig.admin.status("room:C1")).splitlines()
    assert f"tool_loop: shadow: would have refused {ROUNDS - 7}" in status
    assert f"call_loop: shadow: would have refused {ROUNDS + 1 - 3}" in status
    assert not any(line.startswith("bot_loop: shadow") for line in status)


@pytest.fixture(params=BACKENDS)
async def call_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[CallStore]:
    """The gateway's call store on one backend, on data of its own."""
    backend: str = request.param
    if backend == "memory":
        state = StateConfig()
    elif backend == "sqlite":
        state = StateConfig(backend="sqlite", path=str(tmp_path / "calls.sqlite3"))
    else:
        url = SecretStr(request.getfixturevalue("redis_url"))
        state = StateConfig(backend="redis", url=url, key_prefix=f"agent{next(_prefixes)}:")
    store = build_call_store(state)
    await store.start()
    try:
        yield store
    finally:
        await store.aclose()


class _Decided:
    """Counts the turns whose model call was sent or refused; `all` is set at `expected`."""

    def __init__(self, expected: int) -> None:
        self.count = 0
        self.expected = expected
        self.all = asyncio.Event()

    def add(self) -> None:
        self.count += 1
        if self.count >= self.expected:
            self.all.set()


class _SentStream(ReplyStream):
    """A turn's reply stream that counts its call as decided once the model answers it."""

    def __init__(self, decided: _Decided) -> None:
        super().__init__(Delivery(), EditingRoom(), "c1", thread_id=None, reply_to="m1")
        self.decided = decided
        self.sent = False

    def restart(self) -> None:
        super().restart()
        if not self.sent:
            self.sent = True
            self.decided.add()


async def test_issue20_a_shadow_call_guard_does_not_unlock_the_rooms_budget(
    call_store: CallStore,
) -> None:
    gate = asyncio.Event()
    async with FakeLLM(gate=gate) as llm:
        config = OpenAIAgentConfig(kind="openai", base_url=llm.base_url, model="m", stream=True)
        # Priced, so a hold has dollars as well as tokens (a Redis charge of an unpriced
        # hold among others fails: HINCRBY by "-0").
        prices = ProxyConfig.model_validate({"prices": {"m": PRICE}})
        agent = OpenAIAgent("helper", config, calls=call_store, budgets=AgentBudgets(prices))

        async def ask(limit_tokens: int, decided: _Decided) -> AgentResult:
            policy = Policy.model_validate(
                {"call_loop": {"mode": "shadow"}, "spend": {"limit_tokens": limit_tokens}}
            )
            turn = make_turn("Is the export done?", policy=policy)
            stream = turn.stream = _SentStream(decided)
            result = await agent.respond(turn)
            if not stream.sent:
                decided.add()
            return result

        try:
            # The first call, held by the gate, shows what one call holds: its estimate.
            probe = _Decided(1)
            first = asyncio.create_task(ask(10**9, probe))
            async with asyncio.timeout(30):
                await probe.all.wait()
            [(_, group)] = await call_store.spend_groups()
            estimate = group.held.tokens
            # 49 more identical calls at once, on a room budget that holds ten estimates.
            decided = _Decided(49)
            rest = [asyncio.create_task(ask(10 * estimate, decided)) for _ in range(49)]
            async with asyncio.timeout(30):
                await decided.all.wait()
            gate.set()
            results = [await first, *await asyncio.gather(*rest)]
        finally:
            await agent.aclose()
    # Five calls the circuit admits and five it would refuse, each holding its estimate.
    assert len(llm.calls(CHAT)) == 10
    refused = [(r.halt.guard, r.halt.code) for r in results if r.halt is not None]
    assert refused == [("spend", "budget_exceeded")] * 40
    assert sum(1 for r in results if r.shadowed) == 5
    [(_, group)] = await call_store.spend_groups()
    assert group.held.tokens == 0
