"""guarded_call(shadow=True): the guard decides as in enforce, and nothing is acted on."""

from __future__ import annotations

import pytest

from guards.loop_guard import GuardAction, LoopGuard, LoopGuardConfig, LoopGuardDecision
from guards.tool_wrapper import guarded_call, guarded_call_sync, settling_decision
from tests.guards.test_tool_wrapper import ARGS, Tool

# A mutating tool that never progresses: WARN, then count BLOCKs, then a HALT.
STUCK = LoopGuardConfig(
    mutating_warn_threshold=2,
    mutating_block_threshold=3,
    mutating_halt_threshold=6,
    no_progress_warn=2,
    no_progress_halt=50,
)


def _stats(guard: LoopGuard) -> tuple[object, ...]:
    stats = guard.get_stats()
    return (dict(stats.tool_counts), stats.streak)


async def test_issue13_shadow_makes_the_decisions_enforce_makes_with_the_same_counts() -> None:
    enforced, shadowed = LoopGuard(STUCK), LoopGuard(STUCK)
    enforce_tool, shadow_tool = Tool("same"), Tool("same")
    for _ in range(5):  # enforce halts on the sixth call
        enforce_seen: list[LoopGuardDecision] = []
        shadow_seen: list[LoopGuardDecision] = []
        await guarded_call(
            enforced, "write_file", enforce_tool.acall, ARGS, on_decision=enforce_seen.append
        )
        result = await guarded_call(
            shadowed,
            "write_file",
            shadow_tool.acall,
            ARGS,
            on_decision=shadow_seen.append,
            shadow=True,
        )
        # The tool ran and its result came back untouched, whatever was decided.
        assert result == "same"
        assert shadow_seen[0] == enforce_seen[0]  # the pre-check
        assert settling_decision(shadow_seen) == settling_decision(enforce_seen)
        assert _stats(shadowed) == _stats(enforced)
    # Enforce skipped the blocked calls; shadow ran every one of them.
    assert shadow_tool.runs == 5
    assert enforce_tool.runs < 5


async def test_issue13_shadow_lets_a_halted_call_run_and_never_raises() -> None:
    guard = LoopGuard(STUCK)
    tool = Tool("same")
    settled: list[GuardAction] = []
    for _ in range(7):
        seen: list[LoopGuardDecision] = []
        result = await guarded_call(
            guard, "write_file", tool.acall, ARGS, on_decision=seen.append, shadow=True
        )
        assert result == "same"
        verdict = settling_decision(seen)
        assert verdict is not None
        settled.append(verdict.action)
    assert tool.runs == 7
    assert GuardAction.BLOCK in settled
    assert settled[-1] is GuardAction.HALT


def test_issue13_shadow_sync_failures_are_reraised_untouched() -> None:
    guard = LoopGuard(LoopGuardConfig(failure_warn=1, failure_halt=2))
    tool = Tool(error=OSError("disk full"))
    for _ in range(3):
        seen: list[LoopGuardDecision] = []
        with pytest.raises(OSError, match="disk full") as caught:
            guarded_call_sync(guard, "write_file", tool, ARGS, on_decision=seen.append, shadow=True)
        assert getattr(caught.value, "__notes__", []) == []
    assert tool.runs == 3
    assert settling_decision(seen) is not None
    assert seen[-1].action is GuardAction.HALT
