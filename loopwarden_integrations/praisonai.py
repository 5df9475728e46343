"""Put loopwarden's LoopGuard in charge of a praisonaiagents `Agent`'s tool calls.

`guard_agent(agent, config=None)` is the whole adapter; `agent._loop_guard.get_stats()`
then reads loopwarden's counts of the agent's latest turn, as PraisonAI's reads its own.

Assigning `agent._loop_guard = LoopGuard()` is not enough: praisonaiagents 1.7 reaches
its guard through `Agent._ensure_loop_guard()`, which inside a chat turn builds a fresh
guard of its own class from `agent._loop_guard.config` and keeps it in the turn's context,
so the object assigned is never asked. `guard_agent` replaces that method on the agent
(every tool path, sync `chat`, async `achat`, streams and workflows, goes through it) and
keeps a loopwarden guard in that same per-turn slot: each turn starts with fresh counts,
and overlapping turns on a shared agent keep theirs apart, as PraisonAI's guards do.

`TurnGuard` speaks PraisonAI's guard protocol: `check(name, args, is_pre_execution=...)`
answers with a decision holding PraisonAI's own `GuardAction` (their code compares against
it), `record(name, args, success, result=...)`, `mark_progress`, `reset_turn`,
`get_stats`. PraisonAI acts on a pre-check itself: WARN logs, BLOCK skips the tool with the
block result, HALT raises its `ToolExecutionError`, which ends `chat()` / `achat()`. A
post-check verdict only annotates the result the model sees (PraisonAI does not raise there,
and its async path would turn an exception into an error result), so a HALT is kept for the
rest of the turn: the next tool call's pre-check is that HALT, and the turn ends there.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from guards.loop_guard import (
    GuardAction,
    LoopGuard,
    LoopGuardConfig,
    LoopGuardDecision,
    LoopGuardStats,
)
from loopwarden_integrations.extras import missing_extra

try:
    from praisonaiagents import Agent
    from praisonaiagents.agent.chat_mixin import _turn_loop_guard
    from praisonaiagents.escalation import loop_guard as praison_guard
except ImportError as exc:
    raise missing_extra(
        "loopwarden_integrations.praisonai", "praisonaiagents 1.7", "praisonai"
    ) from exc


def _theirs(decision: LoopGuardDecision) -> Any:
    """A loopwarden decision as PraisonAI's `LoopGuardDecision`, with their `GuardAction`."""
    return praison_guard.LoopGuardDecision(
        action=praison_guard.GuardAction(decision.action.value),
        code=decision.code,
        message=decision.message,
        metadata=dict(decision.metadata),
    )


class TurnGuard:
    """One turn's loopwarden LoopGuard behind PraisonAI's loop-guard protocol."""

    def __init__(self, guard: LoopGuard) -> None:
        self._guard = guard
        # The turn's HALT, once decided: PraisonAI only stops on a pre-check HALT.
        self._halt: LoopGuardDecision | None = None

    @property
    def guard(self) -> LoopGuard:
        """The loopwarden guard deciding this turn's calls."""
        return self._guard

    @property
    def config(self) -> LoopGuardConfig:
        """The thresholds in force (PraisonAI reads `config` off its guard)."""
        return self._guard.config

    @property
    def halted(self) -> LoopGuardDecision | None:
        """The HALT that ended this turn, if one did (`achat` reports it only as None)."""
        return self._halt

    def check(self, tool_name: str, args: object, is_pre_execution: bool = True) -> Any:
        """PraisonAI's `check`: loopwarden's decision, or the turn's HALT once there is one."""
        decision = (
            self._halt
            if self._halt is not None
            else self._guard.check(tool_name, args, pre=is_pre_execution)
        )
        if decision.action is GuardAction.HALT:
            self._halt = decision
        return _theirs(decision)

    def record(self, tool_name: str, args: object, success: bool, result: object = None) -> None:
        """PraisonAI's `record`: PraisonAI asks for the post-check with `check` next."""
        decision = self._guard.record(tool_name, args, success=success, result=result)
        if decision.action is GuardAction.HALT:
            self._halt = decision

    def mark_progress(self, marker: str) -> None:
        """A real checkpoint: later calls start new streaks (a HALT stays)."""
        self._guard.mark_progress(marker)

    def reset_turn(self) -> None:
        """Start the turn over: counts, streaks and any HALT are cleared."""
        self._halt = None
        self._guard.reset_turn()

    def get_stats(self) -> LoopGuardStats:
        """The turn's counts, as a mapping read like PraisonAI's `get_stats()` dict."""
        return self._guard.get_stats()


class AgentGuard:
    """What `guard_agent` installs as `agent._loop_guard`: a loopwarden guard per turn."""

    def __init__(
        self,
        agent: Any,
        config: LoopGuardConfig,
        clock: Callable[[], float] | None,
    ) -> None:
        self._agent = agent
        self._config = config
        self._clock = clock
        self._lock = threading.Lock()
        # Tool calls made outside any chat turn (a direct `agent.execute_tool`).
        self._outside = self._new_turn()
        self._latest = self._outside

    @property
    def config(self) -> LoopGuardConfig:
        """The thresholds every turn's guard enforces."""
        return self._config

    @property
    def latest(self) -> TurnGuard:
        """The guard of the agent's latest turn (the one `get_stats` reads)."""
        return self._latest

    def _new_turn(self) -> TurnGuard:
        """A guard for a turn starting now, with fresh counts."""
        return TurnGuard(LoopGuard(self._config, clock=self._clock))

    def current(self) -> TurnGuard:
        """The guard of the turn this call runs in; it replaces `agent._ensure_loop_guard`."""
        slot = _turn_loop_guard.get()
        if slot is None or slot[0] is not self._agent:
            return self._outside
        with self._lock:
            turn = slot[1]
            if not isinstance(turn, TurnGuard):
                turn = slot[1] = self._new_turn()
            self._latest = turn
            return turn

    def reset_turn(self) -> None:
        """PraisonAI's reset outside a chat turn: the outside guard starts over."""
        self._outside.reset_turn()
        self._latest = self._outside

    def get_stats(self) -> LoopGuardStats:
        """The latest turn's counts, read like PraisonAI's `get_stats()` dict."""
        return self._latest.get_stats()


def guard_agent(
    agent: Agent,
    config: LoopGuardConfig | None = None,
    *,
    clock: Callable[[], float] | None = None,
) -> AgentGuard:
    """Make loopwarden's LoopGuard (with `config`, else its defaults) decide `agent`'s tool calls.

    Returns the guard installed as `agent._loop_guard`. `clock` (monotonic seconds) is the
    guards' clock, for tests; the default is `time.monotonic`.
    """
    if not isinstance(agent, Agent):
        raise TypeError(f"guard_agent needs a praisonaiagents Agent, got {type(agent).__name__}")
    if config is not None and not isinstance(config, LoopGuardConfig):
        raise TypeError(
            f"config must be a guards.LoopGuardConfig or None, got {type(config).__name__}"
        )
    installed = AgentGuard(agent, config if config is not None else LoopGuardConfig(), clock)
    agent._loop_guard = installed
    # An instance attribute wins over the class's method, for this agent only.
    agent._ensure_loop_guard = installed.current
    return installed
