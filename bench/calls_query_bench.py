"""The console's Calls page over 100,000 logged calls: filtered page + totals, SQLite and Redis.

A SQLite state file gets 100,000 request-log entries (20 agents, 100 customers, 3 models,
four in five calls forwarded), appended through `SqliteCallStore.log_calls` in the
proxy's batches of 128. Then, timed
(median of 15 after a warm-up):
- the Calls page's JSON with one filter (agent + outcome: a first page of 50 and the
  filter's totals) end to end: `GET /admin/calls` through the real admin route on an
  aiohttp test server, JSON decoded by the client;
- the same through the store alone (`query_calls` + `call_totals`), and with a customer
  (JSON field) filter, no filter, and the day's cost series;
- the baseline of the ratios, in the same run: the unfiltered `calls_since` read of the
  whole log (what `loopwarden calls export` reads).
The log's appends are timed with the query indexes and, on a second file, without them
(the cost the indexes add to every logged call). With `redis-server` on PATH the same
log goes into Redis (its appends timed too: one script call per batch, with the hours'
sums, gateway/calls/query_redis.py) and the same figures are measured there.
Target: the endpoint's answer in <= 200 ms on SQLite and on Redis, and on Redis the
day's cost series too.

Run: `.venv/bin/python -m bench.calls_query_bench [--quick]` (--quick: 10,000 calls).
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import shutil
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import MappingProxyType

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer
from pydantic import SecretStr

from gateway.admin.access import AdminAccess
from gateway.admin.calls import calls_admin_routes
from gateway.admin.service import AdminService
from gateway.calls.entry import OUTCOMES, CallLogEntry
from gateway.calls.query import CallFilter
from gateway.calls.query_sqlite import INDEXES
from gateway.calls.redis_store import RedisCallStore
from gateway.calls.sqlite_store import SqliteCallStore
from gateway.calls.store import CallStore
from gateway.config import parse_config
from gateway.state.memory import MemoryStateStore
from tests.fakes.redis_server import RedisServer

TARGET_MS = 200.0
RUNS = 15
BATCH = 128  # entries per write, as the proxy's request log batches them
TOKEN = "bench-admin-token-0123456789"
NOW = time.time()
FILTERED = CallFilter(agent="agent-3", outcome="forwarded")


def _entry(n: int, calls: int) -> CallLogEntry:
    """The n-th logged call: spread over the last day, newest last."""
    refused = n % 5 == 4
    return CallLogEntry(
        at=NOW - 86_400.0 * (calls - n) / calls,
        provider="openai",
        agent=f"agent-{n % 20}",
        session=f"run-{n % 500}",
        circuit=f"agent-{n % 20}/session=run-{n % 500}",
        model=("gpt-4o-mini", "gpt-4o", "claude-3-haiku")[n % 3],
        outcome=OUTCOMES[1 + n % 4] if refused else "forwarded",
        status=None if refused else 200,
        input_tokens=300 + n % 700,
        output_tokens=50 + n % 200,
        cost=0.0004 + (n % 13) * 0.0001,
        estimated=refused,
        fingerprint=f"{n % 997:064x}",
        fields=MappingProxyType({"customer": f"cust-{n % 100}", "step": f"s{n % 7}"}),
    )


async def _fill(store: CallStore, numbers: range, calls: int) -> float:
    """Append these calls of the log in batches, as the proxy writes; microseconds per call."""
    started = time.perf_counter()
    for first in range(numbers.start, numbers.stop, BATCH):
        last = min(first + BATCH, numbers.stop)
        await store.log_calls([_entry(n, calls) for n in range(first, last)])
    return (time.perf_counter() - started) / max(1, len(numbers)) * 1e6


async def _median_ms(work: Callable[[], Awaitable[object]], runs: int = RUNS) -> float:
    """The median wall time of `work`, in milliseconds, after one warm-up run."""
    await work()
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        await work()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


async def _page_and_totals(store: CallStore, where: CallFilter) -> None:
    await store.query_calls(where, 50)
    await store.call_totals(where)


async def _endpoint_ms(store: CallStore) -> float:
    """`GET /admin/calls?agent=agent-3&outcome=forwarded` through the real admin route."""
    config = parse_config("agents: {}\nbots: []\n", env={})
    state = MemoryStateStore()
    app = web.Application()
    app.add_routes(
        calls_admin_routes(
            AdminService(config, state, calls=store),
            state,
            AdminAccess(SecretStr(TOKEN)),
            store=store,
            proxy=None,
        )
    )
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {TOKEN}"}) as http:
            url = str(server.make_url("/admin/calls"))
            params = {"agent": "agent-3", "outcome": "forwarded"}

            async def fetch() -> None:
                async with http.get(url, params=params) as response:
                    body = await response.json()
                    if response.status != 200 or len(body["calls"]) != 50:
                        raise RuntimeError(f"unexpected answer {response.status}")

            return await _median_ms(fetch)
    finally:
        await server.close()


async def _store_figures(name: str, store: CallStore) -> tuple[float, float]:
    """Print the store's query figures against its unfiltered read; the read's, the series' ms."""
    baseline = await _median_ms(lambda: store.calls_since(10 * 86_400.0))
    print(f"  {name:6} calls_since (whole log, unfiltered)  {baseline:8.1f} ms   (baseline)")
    cases: list[tuple[str, Callable[[], Awaitable[object]]]] = [
        ("page + totals, agent + outcome", lambda: _page_and_totals(store, FILTERED)),
        ("page + totals, customer", lambda: _page_and_totals(store, CallFilter(customer="cust-7"))),
        ("page + totals, no filter", lambda: _page_and_totals(store, CallFilter())),
        (
            "cost series, day per hour",
            lambda: store.cost_series(CallFilter(), NOW - 86_400.0, NOW, 3_600.0),
        ),
    ]
    figures: dict[str, float] = {}
    for label, work in cases:
        figures[label] = ms = await _median_ms(work)
        print(f"  {name:6} {label:34} {ms:8.1f} ms   ratio {ms / baseline:6.3f}")
    return baseline, figures["cost series, day per hour"]


async def _endpoint_figures(name: str, store: CallStore, baseline: float) -> float:
    """Print the Calls page's JSON time against the store's unfiltered read; its ms."""
    endpoint = await _endpoint_ms(store)
    print(
        f"  {name:6} GET /admin/calls (agent + outcome, JSON)  {endpoint:8.1f} ms   "
        f"ratio {endpoint / baseline:6.3f}"
    )
    return endpoint


def _verdict(what: str, ms: float) -> None:
    verdict = "met" if ms <= TARGET_MS else "MISSED"
    print(f"  target <= {TARGET_MS:.0f} ms for {what}: {verdict}")


async def _run(calls: int, workdir: Path) -> None:
    store = SqliteCallStore(workdir / "calls.sqlite3", log_keep=calls)
    bare = SqliteCallStore(workdir / "bare.sqlite3", log_keep=calls)
    await store.start()
    await bare.start()
    try:
        db = sqlite3.connect(workdir / "bare.sqlite3")
        for statement in INDEXES:  # "CREATE INDEX IF NOT EXISTS <name> ON ..."
            db.execute(f"DROP INDEX {statement.split()[5]}")
        db.close()
        sample = range(min(calls, 20_000))
        bare_us = await _fill(bare, sample, calls)
        indexed_us = await _fill(store, sample, calls)
        await _fill(store, range(len(sample), calls), calls)
        print(
            f"  sqlite log_calls: {indexed_us:.1f} us per call with the query indexes, "
            f"{bare_us:.1f} us without (ratio {indexed_us / bare_us:.2f})"
        )
        baseline, _ = await _store_figures("sqlite", store)
        endpoint = await _endpoint_figures("sqlite", store, baseline)
        _verdict("the Calls page's JSON on sqlite", endpoint)
    finally:
        await store.aclose()
        await bare.aclose()
    if shutil.which("redis-server") is None:
        print("  redis: redis-server not on PATH, skipped")
        return
    with RedisServer(workdir / "redis") as server:
        redis = RedisCallStore(server.url, key_prefix="bench:", log_keep=calls)
        await redis.start()
        try:
            redis_us = await _fill(redis, range(calls), calls)
            print(f"  redis log_calls: {redis_us:.1f} us per call (batches of {BATCH})")
            baseline, series = await _store_figures("redis", redis)
            endpoint = await _endpoint_figures("redis", redis, baseline)
            _verdict("the Calls page's JSON on redis", endpoint)
            _verdict("the day's cost series on redis", series)
        finally:
            await redis.aclose()


def main(argv: list[str] | None = None) -> int:
    """Fill the log, time the Calls page's queries and print the figures and the target."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="10,000 logged calls")
    args = parser.parse_args(argv)
    calls = 10_000 if args.quick else 100_000
    python = f"python {platform.python_version()} on {platform.machine()}"
    print(f"{python}, sqlite {sqlite3.sqlite_version}")
    print(f"request log: {calls:,} calls; median of {RUNS} runs")
    with tempfile.TemporaryDirectory(prefix="lw-calls-bench-") as workdir:
        asyncio.run(_run(calls, Path(workdir)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
