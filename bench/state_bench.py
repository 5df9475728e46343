"""Pair decisions per second through the StateStore backends, Redis against memory.

One process drives `pair_decide` round-robin over 10,000 bot pairs (default policy: 20
events per 60 s, so most are admitted and some pairs cool down), through:
- memory: the in-process backend (the baseline of the ratio);
- redis, sequential: one decision awaited after the other, one script call (EVALSHA)
  and so one round trip each;
- redis, concurrent: the same decisions issued 64 at a time with asyncio.gather over
  the client's connection pool (each still one round trip, many in flight);
- sqlite, sequential and concurrent, for comparison.

The benchmark starts its own redis-server (`tests/fakes/redis_server.py`) on a free
loopback port and counts the commands Redis processed, to show one round trip per
decision. Target: >= 5,000 Redis-backed decisions/s from one process.

Run: `.venv/bin/python -m bench.state_bench [--quick]` (--quick: a tenth of the calls).
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from redis.asyncio import Redis

from gateway.state.base import StateStore
from gateway.state.memory import MemoryStateStore
from gateway.state.redis import RedisStateStore
from gateway.state.sqlite import SqliteStateStore
from guards.bot_loop import BotLoopPolicy
from tests.fakes.redis_server import RedisServer

TARGET_PER_SECOND = 5_000
PAIRS = 10_000
CONCURRENCY = 64
POLICY = BotLoopPolicy()


def _decision(store: StateStore, n: int) -> Awaitable[object]:
    """The n-th decision of the workload: pair n mod PAIRS in one of 100 rooms."""
    pair = n % PAIRS
    return store.pair_decide(
        scope=f"discord:{pair % 100}",
        self_bot_id=f"bot-{pair}",
        sender_bot_id="bot-x",
        policy=POLICY,
    )


async def _sequential(store: StateStore, calls: int) -> float:
    """Decisions per second, one awaited after the other."""
    started = time.perf_counter()
    for n in range(calls):
        await _decision(store, n)
    return calls / (time.perf_counter() - started)


async def _concurrent(store: StateStore, calls: int) -> float:
    """Decisions per second, CONCURRENCY in flight at a time."""
    started = time.perf_counter()
    for first in range(0, calls, CONCURRENCY):
        await asyncio.gather(
            *(_decision(store, n) for n in range(first, min(first + CONCURRENCY, calls)))
        )
    return calls / (time.perf_counter() - started)


async def _measure(
    build: Callable[[], StateStore], run: Callable[[StateStore, int], Awaitable[float]], calls: int
) -> float:
    """Best of two runs on a fresh store each, after a warm-up."""
    best = 0.0
    for _ in range(2):
        store = build()
        await store.start()
        try:
            await run(store, min(calls // 10, 1_000))
            best = max(best, await run(store, calls))
        finally:
            await store.aclose()
    return best


async def _evalsha_calls(url: str) -> int:
    """EVALSHA calls the Redis server has processed so far (the client's round trips)."""
    client = Redis.from_url(url, decode_responses=True)
    try:
        stats = await client.info("commandstats")
    finally:
        await client.aclose()
    evalsha = stats.get("cmdstat_evalsha", {"calls": 0})
    return int(evalsha["calls"])


async def _round_trips_per_decision(url: str, calls: int) -> float:
    """EVALSHA calls per decision, outside warm-up and start-up."""
    store = RedisStateStore(url, key_prefix="trips:")
    await store.start()
    try:
        await _decision(store, 0)
        before = await _evalsha_calls(url)
        await _sequential(store, calls)
        return (await _evalsha_calls(url) - before) / calls
    finally:
        await store.aclose()


def _verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


async def _run(calls: int, workdir: Path) -> None:
    memory = await _measure(MemoryStateStore, _sequential, calls)
    print(f"  memory   sequential   {memory:12,.0f} decisions/s   (baseline)")
    with RedisServer(workdir / "redis") as server:
        prefixes = iter(range(1_000))

        def redis() -> StateStore:
            return RedisStateStore(server.url, key_prefix=f"bench{next(prefixes)}:")

        sequential = await _measure(redis, _sequential, calls)
        concurrent = await _measure(redis, _concurrent, calls)
        trips = await _round_trips_per_decision(server.url, min(calls, 2_000))
    files = iter(range(1_000))

    def sqlite() -> StateStore:
        return SqliteStateStore(workdir / f"bench-{next(files)}.sqlite3")

    sqlite_sequential = await _measure(sqlite, _sequential, calls)
    sqlite_concurrent = await _measure(sqlite, _concurrent, calls)
    for name, rate in (
        ("redis    sequential", sequential),
        (f"redis    concurrent {CONCURRENCY:2}", concurrent),
        ("sqlite   sequential", sqlite_sequential),
        (f"sqlite   concurrent {CONCURRENCY:2}", sqlite_concurrent),
    ):
        print(f"  {name:20} {rate:12,.0f} decisions/s   ratio to memory {rate / memory:7.4f}")
    print(f"  redis EVALSHA calls per decision: {trips:.2f} (each one round trip)")
    best = max(sequential, concurrent)
    print(
        f"  target >= {TARGET_PER_SECOND:,} redis decisions/s from one process: "
        f"sequential {_verdict(sequential >= TARGET_PER_SECOND)}, "
        f"concurrent {_verdict(concurrent >= TARGET_PER_SECOND)} (best {best:,.0f}/s)"
    )


def main(argv: list[str] | None = None) -> int:
    """Measure every backend and print the figures, ratios and the target."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="a tenth of the calls")
    args = parser.parse_args(argv)
    calls = 2_000 if args.quick else 20_000
    print(f"python {platform.python_version()} on {platform.machine()}")
    print(f"pair_decide: {calls:,} calls over {PAIRS:,} pairs, best of 2")
    with tempfile.TemporaryDirectory(prefix="lw-state-bench-") as workdir:
        asyncio.run(_run(calls, Path(workdir)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
