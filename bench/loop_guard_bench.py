"""LoopGuard cost per tool call (check + record): a long varied turn, and a stuck streak.

Run: .venv/bin/python -m bench.loop_guard_bench [--quick] (--quick: a tenth of the sizes).

- varied turn: 100,000 calls of eight tools with varied arguments and results (mostly
  text of 20-400 characters, some dicts and lists, some nested arguments); every
  threshold raised so the turn runs to the end. Target: at most 5 us per call.
- stuck streak: 8,000 calls of one tool with the same arguments and the same result;
  block and halt thresholds raised so it runs (every call WARNs). The per-call time of
  the first 1,000 and the last 1,000 calls should be the same (ratio about 1): the
  guard keeps a counter and a ring of four fingerprints, it never scans the history.

Every call gets fresh argument and result objects (arguments parsed from JSON, as a
model's tool call is), so no hash is cached from an earlier run. The best of three runs
is reported, in CPU time of the running thread (time.thread_time) so that other load on
the machine does not count. When `praisonaiagents` is installed
(`pip install -e '.[bench]'`), its LoopGuard runs the same workloads in the same process
and the ratios are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from importlib import metadata

from guards.loop_guard import LoopGuard, LoopGuardConfig

Call = tuple[str, dict[str, object], object]
Step = Callable[[str, dict[str, object], object], None]

REPEATS = 3
TARGET_US = 5.0
NEVER = 10**9

TOOLS = (
    "read_file",
    "list_files",
    "search_docs",
    "get_weather",
    "fetch_url",
    "check_status",
    "write_file",
    "update_ticket",
)
CITIES = ("Paris", "Lima", "Oslo", "Pune", "Cairo", "Quito", "Perth", "Riga")
WORDS = ("alpha", "beta", "gamma", "delta", "error", "retry", "timeout", "deploy", "status")

VARIED = LoopGuardConfig(
    idempotent_warn_threshold=NEVER,
    idempotent_block_threshold=NEVER,
    idempotent_halt_threshold=NEVER,
    mutating_warn_threshold=NEVER,
    mutating_block_threshold=NEVER,
    mutating_halt_threshold=NEVER,
    no_progress_warn=NEVER,
    no_progress_halt=NEVER,
    cycle_warn_laps=NEVER,
    cycle_halt_laps=NEVER,
    no_progress_similar_warn=NEVER,
    no_progress_similar_halt=NEVER,
    max_time_per_turn=1e9,
)
# Warn thresholds stay at their defaults: a stuck streak WARNs on every call, as in life.
STUCK = replace(
    LoopGuardConfig(),
    idempotent_block_threshold=NEVER,
    idempotent_halt_threshold=NEVER,
    no_progress_halt=NEVER,
    cycle_halt_laps=NEVER,
    max_time_per_turn=1e9,
)


@dataclass(frozen=True, slots=True)
class Sizes:
    """How many calls each workload makes, and how many a timed segment holds."""

    turn_calls: int = 100_000
    streak_calls: int = 8_000
    segment: int = 1_000


@dataclass(frozen=True, slots=True)
class Figures:
    """Seconds per call for a whole workload and for its first and last segments."""

    per_call: float
    first: float
    last: float


def varied_turn(sizes: Sizes, seed: int = 7) -> list[Call]:
    """The varied workload: fresh objects, deterministic content."""
    rng = random.Random(seed)
    calls: list[Call] = []
    for n in range(sizes.turn_calls):
        tool = rng.choice(TOOLS)
        shape = rng.random()
        if tool == "get_weather":
            args_text = json.dumps({"city": rng.choice(CITIES), "units": "metric"})
        elif shape < 0.1:
            args_text = json.dumps(
                {"filter": {"tags": rng.sample(WORDS, 2), "since": "2024-01-01"}, "limit": 10}
            )
        else:
            args_text = json.dumps(
                {"path": f"src/mod_{rng.randrange(500)}.py", "offset": rng.randrange(50) * 100}
            )
        kind = rng.random()
        result: object
        if kind < 0.7:
            words = " ".join(rng.choices(WORDS, k=rng.randrange(3, 60)))
            result = f"{n}: {words}"
        elif kind < 0.9:
            result = {"status": rng.choice(WORDS), "items": rng.randrange(100), "call": n}
        else:
            result = [n, rng.choice(WORDS), rng.randrange(1000)]
        calls.append((tool, json.loads(args_text), result))
    return calls


def stuck_streak(sizes: Sizes) -> list[Call]:
    """The stuck workload: one call, same arguments and same error, as fresh objects."""
    args_text = json.dumps({"path": "config/missing.yaml"})
    error = "FileNotFoundError: [Errno 2] No such file or directory: "
    return [
        ("read_file", json.loads(args_text), error + "'config/missing.yaml'")
        for _ in range(sizes.streak_calls)
    ]


def timed(step: Step, calls: list[Call], segment: int) -> Figures:
    """Run every call through `step`, timing each segment of `segment` calls."""
    segments: list[float] = []
    for start in range(0, len(calls), segment):
        chunk = calls[start : start + segment]
        began = time.thread_time()
        for tool, args, result in chunk:
            step(tool, args, result)
        segments.append(time.thread_time() - began)
    return Figures(sum(segments) / len(calls), segments[0] / segment, segments[-1] / segment)


def best(runs: list[Figures]) -> Figures:
    return Figures(
        min(f.per_call for f in runs), min(f.first for f in runs), min(f.last for f in runs)
    )


def idle_step(_tool: str, _args: dict[str, object], _result: object) -> None:
    """The harness alone: what the loop and the step call cost without a guard."""


def loopwarden_step(config: LoopGuardConfig) -> Step:
    guard = LoopGuard(config)
    check, record = guard.check, guard.record

    def step(tool: str, args: dict[str, object], result: object) -> None:
        check(tool, args)
        record(tool, args, success=True, result=result)

    return step


def praison_step_factory() -> Callable[[LoopGuardConfig], Step] | None:
    """A step for praisonaiagents' LoopGuard (same thresholds), or None if not installed."""
    os.environ.setdefault("PRAISONAI_TELEMETRY_DISABLED", "true")
    try:
        from praisonaiagents.escalation import loop_guard as praison
    except ImportError:
        return None

    def factory(config: LoopGuardConfig) -> Step:
        guard = praison.LoopGuard(
            praison.LoopGuardConfig(
                idempotent_warn_threshold=config.idempotent_warn_threshold,
                idempotent_block_threshold=config.idempotent_block_threshold,
                idempotent_halt_threshold=config.idempotent_halt_threshold,
                mutating_warn_threshold=config.mutating_warn_threshold,
                mutating_block_threshold=config.mutating_block_threshold,
                mutating_halt_threshold=config.mutating_halt_threshold,
                max_time_per_turn=config.max_time_per_turn,
                no_progress_warn=config.no_progress_warn,
                no_progress_halt=config.no_progress_halt,
            )
        )

        def step(tool: str, args: dict[str, object], result: object) -> None:
            guard.check(tool, args, is_pre_execution=True)
            guard.record(tool, args, True, result=result)

        return step

    return factory


def measure(factory: Callable[[LoopGuardConfig], Step], sizes: Sizes) -> tuple[Figures, Figures]:
    """Best-of-REPEATS figures for the varied turn and the stuck streak."""
    turn = best([timed(factory(VARIED), varied_turn(sizes), sizes.segment) for _ in range(REPEATS)])
    stuck = best(
        [timed(factory(STUCK), stuck_streak(sizes), sizes.segment) for _ in range(REPEATS)]
    )
    return turn, stuck


def us(seconds: float) -> str:
    return f"{seconds * 1e6:.2f} us"


def report(name: str, sizes: Sizes, turn: Figures, stuck: Figures) -> None:
    segment = f"{sizes.segment:,}"
    print(f"{name}, per call (check + record), best of {REPEATS}:")
    print(f"  varied turn, {sizes.turn_calls:,} calls: {us(turn.per_call)}")
    print(
        f"  stuck streak, {sizes.streak_calls:,} identical calls: first {segment} "
        f"{us(stuck.first)}, last {segment} {us(stuck.last)}, "
        f"last/first {stuck.last / stuck.first:.2f} (flat = 1)"
    )


def main(argv: list[str] | None = None) -> None:
    """Run both workloads, for loopwarden and the baseline, and print figures and ratios."""
    parser = argparse.ArgumentParser(description="LoopGuard cost per tool call")
    parser.add_argument("--quick", action="store_true", help="a tenth of the sizes")
    sizes = Sizes(10_000, 800, 100) if parser.parse_args(argv).quick else Sizes()

    turn, stuck = measure(loopwarden_step, sizes)
    report("loopwarden LoopGuard", sizes, turn, stuck)
    harness = best([timed(idle_step, varied_turn(sizes), sizes.segment) for _ in range(REPEATS)])
    print(f"  (the harness alone, included in every figure: {us(harness.per_call)} per call)")
    verdict = "met" if turn.per_call * 1e6 <= TARGET_US else "MISSED"
    print(f"  target <= {TARGET_US:g} us per call: {verdict}")

    factory = praison_step_factory()
    if factory is None:
        print("praisonaiagents is not installed: baseline ratios skipped")
        print("  (install it with: .venv/bin/pip install -e '.[bench]')")
        return
    version = metadata.version("praisonaiagents")
    base_turn, base_stuck = measure(factory, sizes)
    report(f"praisonaiagents {version} LoopGuard (baseline)", sizes, base_turn, base_stuck)
    print("loopwarden vs baseline (baseline time / loopwarden time):")
    print(f"  varied turn: {base_turn.per_call / turn.per_call:.1f}x")
    print(f"  stuck streak, last {sizes.segment:,} calls: {base_stuck.last / stuck.last:.1f}x")


if __name__ == "__main__":
    main()
