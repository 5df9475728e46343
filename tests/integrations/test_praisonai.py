"""loopwarden_integrations.praisonai: a real praisonaiagents Agent, fake chat-completions server.

The model is scripted to alternate between two stuck tools (the same arguments, the same
result every time): PraisonAI's own guard lets that run 19 times without a HALT; under
`guard_agent` loopwarden's cycle rule halts it after 5 laps (10 tool runs).
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import os
import warnings
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

# praisonaiagents phones home on import unless told not to; tests stay offline.
os.environ.setdefault("PRAISONAI_TELEMETRY_DISABLED", "true")
os.environ.setdefault("DO_NOT_TRACK", "1")

from tests.integrations.process_state import process_state_kept

with process_state_kept():
    from praisonaiagents import Agent
    from praisonaiagents.errors import ToolExecutionError as PraisonHalt
    from praisonaiagents.escalation import loop_guard as praison_guard
    from praisonaiagents.llm import openai_client as praison_openai

    from loopwarden_integrations.praisonai import AgentGuard, TurnGuard, guard_agent

from guards import GuardAction, LoopGuard, LoopGuardConfig
from tests.fakes.llm_upstream import (
    FakeLLM,
    FakeResponse,
    Received,
    Responder,
    text_response,
    tool_call_response,
)
from tests.integrations.missing_library import import_without

FROZEN: Callable[[], float] = lambda: 0.0  # noqa: E731 - no test depends on wall time


class StuckTools:
    """Two tools that never make progress, counting their runs."""

    def __init__(self) -> None:
        self.runs: list[str] = []

    def check_status(self, job: str) -> str:
        """Check a build job's status."""
        self.runs.append("check_status")
        return "pending"

    def list_jobs(self, queue: str) -> str:
        """List the jobs waiting in a queue."""
        self.runs.append("list_jobs")
        return "job-7"


def alternating(tool_calls: int) -> Responder:
    """The model calls check_status, list_jobs, check_status, … `tool_calls` times, then answers."""
    count = itertools.count(1)

    def respond(_: Received) -> FakeResponse:
        n = next(count)
        if n > tool_calls:
            return text_response("done")
        if n % 2:
            return tool_call_response(("check_status", {"job": "7"}))
        return tool_call_response(("list_jobs", {"queue": "builds"}))

    return respond


@pytest.fixture
async def fake(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The fake model server, which PraisonAI's OpenAI client is pointed at."""
    async with FakeLLM() as server:
        for name in ("OPENAI_API_BASE", "OPENAI_MODEL_NAME"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-secret")
        yield server


@pytest.fixture(autouse=True)
async def _praisonai_sandbox(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[None]:
    """Keep PraisonAI's files under tmp_path, its logging and warnings changes to the test,
    and close the connections it leaves open.

    Its sync `chat` makes each model call in a throwaway event loop with a new AsyncOpenAI
    client and never closes the last one; its `aclose()` drops the client without closing it.
    """
    monkeypatch.setenv("PRAISONAI_HOME", str(tmp_path / "praisonai"))
    with process_state_kept():
        yield
    client = praison_openai._global_client
    if client is not None:
        leftover, client._async_client = client._async_client, None
        if leftover is not None and client._async_client_loop is asyncio.get_running_loop():
            await leftover.close()
    with warnings.catch_warnings():
        # The connections of loops already closed can only be collected.
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()


@pytest.fixture
def tools() -> StuckTools:
    return StuckTools()


def make_agent(tools: StuckTools) -> Any:
    return Agent(
        name="builder",
        instructions="Watch the build queue.",
        model="gpt-4o-mini",
        tools=[tools.check_status, tools.list_jobs],
    )


async def test_issue15_praisonai_own_guard_and_assigned_guard_let_the_loop_run(
    fake: FakeLLM, tools: StuckTools
) -> None:
    fake.responder = alternating(19)
    agent = make_agent(tools)
    assigned = LoopGuard(clock=FROZEN)
    agent._loop_guard = assigned

    answer = await asyncio.to_thread(agent.chat, "Is build 7 done?")

    assert answer == "done"
    assert len(tools.runs) == 19
    # PraisonAI built its own guard for the turn from `assigned.config`; ours was never asked.
    assert assigned.get_stats().tool_counts == {}


async def test_issue15_guard_agent_halts_sync_chat_within_12_tool_runs(
    fake: FakeLLM, tools: StuckTools
) -> None:
    fake.responder = alternating(19)
    agent = make_agent(tools)
    installed = guard_agent(agent, clock=FROZEN)

    with pytest.raises(PraisonHalt, match=r"\[loop-guard\] The same 2 tool calls") as caught:
        await asyncio.to_thread(agent.chat, "Is build 7 done?")

    assert not caught.value.is_retryable
    assert len(tools.runs) == 10
    assert agent._loop_guard is installed
    stats = agent._loop_guard.get_stats()
    assert stats["tool_counts"] == {"check_status": 5, "list_jobs": 5}
    halt = installed.latest.halted
    assert halt is not None
    assert halt.action is GuardAction.HALT
    # The post-check HALT reached the model as PraisonAI's annotation before the stop.
    last_result = fake.calls("/v1/chat/completions")[-1].tool_messages[-1]["content"]
    assert "[loop-guard]" in last_result


async def test_issue15_guard_agent_halts_async_achat(fake: FakeLLM, tools: StuckTools) -> None:
    fake.responder = alternating(19)
    agent = make_agent(tools)
    installed = guard_agent(agent, clock=FROZEN)

    answer = await agent.achat("Is build 7 done?")

    # PraisonAI's achat reports a HALT as a None answer; the loop stopped all the same.
    assert answer is None
    assert len(tools.runs) == 10
    halt = installed.latest.halted
    assert halt is not None
    assert halt.action is GuardAction.HALT
    assert halt.metadata["laps"] == 5


async def test_issue15_each_chat_turn_gets_fresh_counts(fake: FakeLLM, tools: StuckTools) -> None:
    agent = make_agent(tools)
    installed = guard_agent(agent, LoopGuardConfig(cycle_warn_laps=2, cycle_halt_laps=3))

    for turn in range(2):
        fake.responder = alternating(4)
        answer = await asyncio.to_thread(agent.chat, f"turn {turn}")
        assert answer == "done"
        stats = installed.get_stats()
        # Two laps each turn: three laps over both turns would have halted.
        assert stats["tool_counts"] == {"check_status": 2, "list_jobs": 2}
    assert len(tools.runs) == 8


def test_issue15_get_stats_reads_like_praisonais() -> None:
    theirs = praison_guard.LoopGuard()
    ours = TurnGuard(LoopGuard(clock=FROZEN))
    for guard in (theirs, ours):
        for job in ("1", "2", "1"):
            guard.check("check_status", {"job": job}, is_pre_execution=True)
            guard.record("check_status", {"job": job}, True, result="pending")
            guard.check("check_status", {"job": job}, is_pre_execution=False)
        guard.record("write_file", {"path": "a"}, False, result=None)

    their_stats, our_stats = theirs.get_stats(), ours.get_stats()
    assert our_stats["tool_counts"] == their_stats["tool_counts"]
    assert isinstance(our_stats["turn_elapsed"], float)
    for key in ("enabled", "idempotent_thresholds", "mutating_thresholds"):
        assert list_or_value(our_stats["config"], key) == list_or_value(their_stats["config"], key)


def list_or_value(config: Any, key: str) -> object:
    value = config[key]
    return list(value) if isinstance(value, tuple | list) else value


def praisonai_tool_call(turn: TurnGuard, name: str, args: dict[str, str]) -> list[Any]:
    """What PraisonAI asks its guard for one tool call; the actions it got back."""
    pre = turn.check(name, args, is_pre_execution=True)
    if pre.action == praison_guard.GuardAction.HALT:
        return [pre.action]  # PraisonAI raises its ToolExecutionError here
    blocked = pre.action == praison_guard.GuardAction.BLOCK
    result = {"error": f"[loop-guard] {pre.message}", "loop_blocked": True} if blocked else "ok"
    turn.record(name, args, not blocked, result=result)
    return [pre.action, turn.check(name, args, is_pre_execution=False).action]


def test_issue15_bridge_answers_with_praisonais_guard_action() -> None:
    turn = TurnGuard(LoopGuard(clock=FROZEN))
    args = {"path": "notes.txt", "text": "x"}
    actions: list[Any] = []
    while praison_guard.GuardAction.HALT not in actions:
        actions += praisonai_tool_call(turn, "write_file", args)

    assert all(isinstance(action, praison_guard.GuardAction) for action in actions)
    assert [a.value for a in dict.fromkeys(actions)] == ["allow", "warn", "block", "halt"]
    assert turn.halted is not None
    # The HALT holds for the rest of the turn, whatever is called next.
    assert praisonai_tool_call(turn, "read_file", {"path": "x"}) == [praison_guard.GuardAction.HALT]
    turn.reset_turn()
    assert turn.check("read_file", {"path": "x"}).action == praison_guard.GuardAction.ALLOW


def test_issue15_guard_agent_refuses_what_it_cannot_guard() -> None:
    with pytest.raises(TypeError, match="praisonaiagents Agent, got dict"):
        guard_agent({"name": "builder"})
    agent = make_agent(StuckTools())
    with pytest.raises(TypeError, match="LoopGuardConfig or None, got dict"):
        guard_agent(agent, {"cycle_halt_laps": 2})  # type: ignore[arg-type]
    assert isinstance(guard_agent(agent), AgentGuard)


def test_issue15_import_without_praisonai_names_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(ImportError, match=r"pip install 'loopwarden\[praisonai\]'"):
        import_without(monkeypatch, "loopwarden_integrations.praisonai", "praisonaiagents")
