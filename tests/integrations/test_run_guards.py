"""loopwarden_integrations.run_guards: one LoopGuard turn per agent run, from guard or factory."""

from __future__ import annotations

import gc

import pytest

from guards import LoopGuard
from loopwarden_integrations.run_guards import RunGuards


class Run:
    """Stands for one agent run (any object that lives as long as the run)."""


def call(guard: LoopGuard) -> None:
    guard.check("check_status", {"job": "7"})
    guard.record("check_status", {"job": "7"}, success=True, result="pending")


def test_issue15_factory_makes_one_guard_per_run_and_forgets_finished_runs() -> None:
    made: list[LoopGuard] = []

    def factory() -> LoopGuard:
        made.append(LoopGuard(clock=lambda: 0.0))
        return made[-1]

    runs = RunGuards(factory)
    first, second = Run(), Run()
    assert runs.of(first) is runs.of(first)
    assert runs.of(second) is not runs.of(first)
    assert len(made) == 2

    del first
    gc.collect()
    assert len(runs._runs) == 1
    # The class itself is a factory.
    assert isinstance(RunGuards(LoopGuard).of(second), LoopGuard)


def test_issue15_shared_guard_starts_a_new_turn_for_each_new_run() -> None:
    guard = LoopGuard(clock=lambda: 0.0)
    runs = RunGuards(guard)
    first, second = Run(), Run()

    call(runs.of(first))
    call(runs.of(first))
    assert guard.get_stats()["tool_counts"] == {"check_status": 2}
    call(runs.of(second))
    assert guard.get_stats()["tool_counts"] == {"check_status": 1}


def test_issue15_run_guards_refuses_what_is_not_a_guard() -> None:
    with pytest.raises(TypeError, match="LoopGuard or a zero-argument function .* got str"):
        RunGuards("strict")  # type: ignore[arg-type]
    runs = RunGuards(lambda: "strict")  # type: ignore[arg-type, return-value]
    with pytest.raises(TypeError, match="factory must return a LoopGuard, got str"):
        runs.of(Run())
