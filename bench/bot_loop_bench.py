"""BotLoopGuard speed and memory, beside praisonaiagents' BotLoopGuard in the same run.

Four workloads, deterministic because time is injected (`now=`) and any randomness is
seeded:
- hot pairs: 1,000,000 `observe()` calls round-robin over 10,000 pairs (each pair sees
  an event every 10 s, well under the default budget of 20 per 60 s); best of 5 runs.
- churn: the same calls, but each pair sees one event every 120 s, so with the default
  60 s window and 60 s cooldown every pair has gone idle (and is forgotten) between its
  events: a room that wakes up, talks and goes quiet; best of 5 runs.
- idle million: 1,000,000 distinct pairs get one event each; the clock then jumps past
  window + cooldown and one live pair gets as many calls as there were idle pairs
  (`max_pairs` is raised above a million so that the sweep, not the cap, is measured).
  RSS growth (psutil) is read at the peak and after; each side runs in a fresh process
  so neither inherits the other's heap.

Targets: observe <= 1 us/call and no slower than praisonaiagents on hot pairs and on
both churns; idle million < 50 MB.
The per-call figures are CPU time of this process (other load on a shared machine does
not count) and include the driving loop, whose cost alone is printed too. Both sides are
driven by the same loop with the same keyword call, and take turns run by run, so a
change in the machine's load falls on both.

Run: `.venv/bin/python -m bench.bot_loop_bench [--quick]` (--quick: a tenth of the sizes).
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import platform
import random
import string
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import partial
from multiprocessing import get_context
from typing import Protocol

import psutil

from guards.bot_loop import BotLoopGuard, BotLoopPolicy

# praisonaiagents phones home on import unless told not to; benchmarks stay offline.
os.environ.setdefault("PRAISONAI_TELEMETRY_DISABLED", "true")
os.environ.setdefault("DO_NOT_TRACK", "1")

OBSERVE_TARGET_US = 1.0
IDLE_TARGET_MB = 50.0
MB = 1024 * 1024


class _Observer(Protocol):
    def __call__(self, *, self_bot_id: str, sender_bot_id: str, now: float) -> bool: ...


class _Guard(Protocol):
    def observe(self, *, self_bot_id: str, sender_bot_id: str, now: float) -> bool: ...


@dataclass(frozen=True)
class MemoryFigures:
    """RSS growth of the idle-million workload and the pairs still held at the end."""

    peak_mb: float
    after_mb: float
    pairs_held: int
    seconds: float


def _ours(max_pairs: int = 100_000) -> BotLoopGuard:
    return BotLoopGuard(BotLoopPolicy(), max_pairs=max_pairs)


def _theirs() -> _Guard:
    from praisonaiagents.bots import BotLoopGuard as TheirGuard

    guard: _Guard = TheirGuard()
    return guard


def _pairs_held(guard: object) -> int:
    """Pairs a guard holds: ours has `len`; theirs keeps two dicts."""
    if isinstance(guard, BotLoopGuard):
        return len(guard)
    return len(vars(guard)["_events"]) + len(vars(guard)["_cooldowns"])


def _praisonai_available() -> bool:
    try:
        _theirs()
    except ImportError:
        return False
    return True


# Seconds between two events of one pair: hot pairs stay under the budget; churning
# pairs go idle (past the 60 s window, 60 s cooldown) before their next event.
HOT_PERIOD = 10.0
CHURN_PERIOD = 120.0


# The random-gap churn: events over an hour, each of a pair drawn at random.
RANDOM_EVENTS = 300_000
RANDOM_PAIRS = 10_000
RANDOM_SPAN = 3600.0
ID_LENGTH = 15
_ID_CHARS = string.ascii_lowercase + string.digits

Event = tuple[str, str, float]
# Microseconds per call of one guard's `observe` over one workload.
Workload = Callable[[_Observer], float]


def random_gap_events(events: int, pairs: int, span: float, *, seed: int = 24) -> list[Event]:
    """`events` (self id, sender id, time) in time order over `span` seconds, pairs at random.

    A pair's events are then `span * pairs / events` seconds apart on average, at random
    (exponential-like) gaps. The ids are random strings of `ID_LENGTH` characters.
    """
    rng = random.Random(seed)

    def bot_id() -> str:
        return "".join(rng.choices(_ID_CHARS, k=ID_LENGTH))

    ids = [(bot_id(), bot_id()) for _ in range(pairs)]
    times = sorted(rng.uniform(0.0, span) for _ in range(events))
    return [(*ids[rng.randrange(pairs)], at) for at in times]


def _events_per_call_us(observe: _Observer, events: Sequence[Event]) -> float:
    """Microseconds per call of `observe` over the given events, in order."""
    start = time.process_time()
    for self_bot_id, sender_bot_id, now in events:
        observe(self_bot_id=self_bot_id, sender_bot_id=sender_bot_id, now=now)
    return (time.process_time() - start) / len(events) * 1e6


def _per_call_us(observe: _Observer, calls: int, pairs: int, period: float) -> float:
    """Microseconds per call of `observe` driven round-robin over `pairs` pairs."""
    ids = [(f"bot{i}", f"peer{i}") for i in range(pairs)]
    # Each pair sees one event every `period` seconds whatever the scale.
    step = period / pairs
    now = 0.0
    start = time.process_time()
    for i in range(calls):
        a, b = ids[i % pairs]
        observe(self_bot_id=a, sender_bot_id=b, now=now)
        now += step
    return (time.process_time() - start) / calls * 1e6


def _no_op(*, self_bot_id: str, sender_bot_id: str, now: float) -> bool:
    return True


def _best_per_call_us(
    makers: Sequence[Callable[[], _Guard]], workload: Workload, runs: int
) -> list[float]:
    """Each side's best of `runs` fresh-guard runs, the sides taking turns run by run.

    The best run is the one least disturbed by other processes; taking turns spreads any
    change in the machine's load over both sides instead of one.
    """
    best = [math.inf] * len(makers)
    for _ in range(runs):
        for side, make in enumerate(makers):
            best[side] = min(best[side], workload(make().observe))
    return best


def idle_million(which: str, pairs: int) -> MemoryFigures:
    """Fill a fresh guard with `pairs` one-off pairs, let them go idle, and drive a live pair."""
    # The cap is lifted so that the sweep, not the LRU cap, is what gives the memory back.
    guard: _Guard = _ours(max_pairs=2 * pairs) if which == "ours" else _theirs()
    process = psutil.Process()
    gc.collect()
    base = process.memory_info().rss
    started = time.perf_counter()
    now = 0.0
    for i in range(pairs):
        guard.observe(self_bot_id=f"bot{i}", sender_bot_id="peer", now=now)
        now += 1e-5
    peak = process.memory_info().rss
    policy = BotLoopPolicy()
    now += policy.window_seconds + policy.cooldown_seconds + 1.0
    for _ in range(pairs):
        guard.observe(self_bot_id="live", sender_bot_id="peer", now=now)
        now += 0.001
    gc.collect()
    after = process.memory_info().rss
    return MemoryFigures(
        peak_mb=(peak - base) / MB,
        after_mb=(after - base) / MB,
        pairs_held=_pairs_held(guard),
        seconds=time.perf_counter() - started,
    )


def _in_fresh_process(which: str, pairs: int) -> MemoryFigures:
    with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) as pool:
        return pool.submit(idle_million, which, pairs).result()


def _verdict(met: bool) -> str:
    return "met" if met else "NOT met"


def _compare(workload: Workload, runs: int, *, theirs_ok: bool) -> None:
    """Print one workload's per-call figures, ours beside theirs, with the ratio."""
    loop_us = workload(_no_op)
    print(f"  driving loop alone          {loop_us:6.3f} us/call")
    makers: list[Callable[[], _Guard]] = [_ours, _theirs] if theirs_ok else [_ours]
    ours_us, *theirs = _best_per_call_us(makers, workload, runs)
    print(
        f"  loopwarden                  {ours_us:6.3f} us/call   "
        f"target <= {OBSERVE_TARGET_US:g} us: {_verdict(ours_us <= OBSERVE_TARGET_US)}"
    )
    if not theirs:
        print("  praisonaiagents not installed; ratio skipped")
        return
    (theirs_us,) = theirs
    ratio = ours_us / theirs_us
    print(f"  praisonaiagents             {theirs_us:6.3f} us/call")
    print(f"  ratio ours/theirs           {ratio:6.2f}      target <= 1: {_verdict(ratio <= 1)}")


def main(argv: list[str] | None = None) -> None:
    """Run the workloads and print the figures, ratios and targets."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="a tenth of the sizes")
    args = parser.parse_args(argv)
    scale = 10 if args.quick else 1
    calls, pairs, idle_pairs, runs = 1_000_000 // scale, 10_000 // scale, 1_000_000 // scale, 5
    theirs_ok = _praisonai_available()

    print(f"python {platform.python_version()} on {platform.machine()}")
    for title, period in (("hot pairs", HOT_PERIOD), ("churn", CHURN_PERIOD)):
        print(
            f"\nobserve(), {title}: {calls:,} calls over {pairs:,} pairs, one event per pair "
            f"every {period:g} s, best of {runs}"
        )
        _compare(
            partial(_per_call_us, calls=calls, pairs=pairs, period=period),
            runs,
            theirs_ok=theirs_ok,
        )

    events = random_gap_events(RANDOM_EVENTS // scale, RANDOM_PAIRS // scale, RANDOM_SPAN)
    print(
        f"\nobserve(), random-gap churn: {len(events):,} events over {RANDOM_SPAN:g} s, each of "
        f"one of {RANDOM_PAIRS // scale:,} pairs drawn at random (ids of {ID_LENGTH} characters), "
        f"best of {runs}"
    )
    _compare(lambda observe: _events_per_call_us(observe, events), runs, theirs_ok=theirs_ok)

    print(f"\nidle pairs: {idle_pairs:,} distinct pairs, then idle and {idle_pairs:,} live calls")
    ours_mem = _in_fresh_process("ours", idle_pairs)
    print(
        f"  loopwarden       peak +{ours_mem.peak_mb:7.1f} MB, after idle +{ours_mem.after_mb:7.1f}"
        f" MB, pairs held {ours_mem.pairs_held:>9,} ({ours_mem.seconds:.1f} s)   "
        f"target < {IDLE_TARGET_MB:g} MB: {_verdict(ours_mem.after_mb < IDLE_TARGET_MB)}"
    )
    if theirs_ok:
        theirs_mem = _in_fresh_process("theirs", idle_pairs)
        print(
            f"  praisonaiagents  peak +{theirs_mem.peak_mb:7.1f} MB, after idle "
            f"+{theirs_mem.after_mb:7.1f} MB, pairs held {theirs_mem.pairs_held:>9,}"
            f" ({theirs_mem.seconds:.1f} s)"
        )
        after_ratio = ours_mem.after_mb / theirs_mem.after_mb if theirs_mem.after_mb > 0 else 0.0
        print(f"  ratio ours/theirs after idle {after_ratio:6.3f}")
    else:
        print("  praisonaiagents not installed; ratio skipped")


if __name__ == "__main__":
    main()
