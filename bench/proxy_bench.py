"""What the LLM-call proxy adds: latency and requests/s through it against the upstream direct.

One process runs the fake provider (tests/fakes/llm_upstream.py), the proxy in front of
it, and aiohttp clients, all on loopback. The same chat-completions request (a ~1 KB
conversation; each one different, so the call guard admits them all) is sent
- sequentially, alternating direct and through the proxy, one request at a time: the
  latency of each, p50 and p99, and the difference (what the proxy adds: reading the
  body, fingerprinting, the CallStore decision, a second HTTP hop, relaying, the
  background log write);
- concurrently (32 in flight): requests per second, direct and through the proxy.
Both with the default memory state and with sqlite state (a transaction per call for
the decision, and one per batch of log entries, each on the event loop while the file's
lock is free; since the client shares that loop, the log writes count in its latency).
The proxy's upstream key and the client's proxy key are real config. The client, the
proxy and the provider share one event loop (one CPU), so requests/s through the proxy
also pay for the provider's and the client's work twice over: the ratio is a floor, the
added latency the figure to watch.

Each runs first on the event loop `loopwarden proxy` serves on (gateway/app/eventloop.py:
uvloop when installed), then on asyncio's standard loop, so the run also shows what
uvloop takes off; all of it ROUNDS times, since one run's p50 moves with the machine
by more than the figures differ. Targets (judged on the served loop, the median of the
rounds): <= 1 ms added latency at p50 with memory state, <= 0.5 ms with sqlite state.

Budgets (issue 14): in the same run, on memory, sqlite and redis state, two proxies on
one upstream, one without budgets and one with three (per agent a day, all calls a
month, per customer in tokens a day; limits far above what the run spends) and the
anomaly detector (its `min_usd` far above the run's spend, so it never fires), requests
alternating between them one at a time: the p50 difference is what they add (target
<= 0.2 ms on memory), and the ratio of the two p50s. On redis it also counts the script
calls per LLM call: every check of a call (budgets, circuit, rules) is one EVALSHA, its
charge (budgets and anomaly) one more, in the background.

Run: `.venv/bin/python -m bench.proxy_bench [--quick] [--budgets-only]` (--quick: a
fifth of the requests).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import platform
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from gateway.app import eventloop
from gateway.config import parse_config
from gateway.proxy.alerts import Alerter
from gateway.proxy.app import ProxyServer
from tests.fakes.llm_upstream import FakeLLM

TARGET_ADDED_P50_MS = 1.0
TARGET_BUDGETS_ADDED_P50_MS = 0.2
BUDGETS = """
  budgets:
    - {name: agent-daily, per: [agent], limit_usd: 100000, period: day}
    - {name: all-monthly, per: [], limit_usd: 500000, period: month}
    - {name: customer-tokens, per: [customer], limit_tokens: 900000000000, period: day}
  anomaly: {enabled: true, window: 1h, factor: 3.0, min_usd: 100000, action: alert}
"""
TARGET_SQLITE_ADDED_P50_MS = 0.5
CONCURRENCY = 32
ROUNDS = 3
PROXY_KEY = "lw-bench-key"
SYSTEM = "You are a careful billing assistant. " * 12


@dataclass(frozen=True, slots=True)
class Latencies:
    """Per-request latencies in milliseconds."""

    samples: list[float]

    def percentile(self, q: float) -> float:
        """The q-th percentile (0-100), nearest rank."""
        ordered = sorted(self.samples)
        index = min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))
        return ordered[index]


def _config(upstream: str, state: str, extra: str = "") -> str:
    return f"""
state: {state}
proxy:
  host: 127.0.0.1
  port: 0
  keys: {{{PROXY_KEY}: {{agent: bench-bot}}}}
  upstreams:
    openai: {{base_url: '{upstream}/v1', api_key: sk-bench-upstream-key}}
  prices: {{'gpt-4o*': {{input_per_1k: 0.0025, output_per_1k: 0.01}}}}
{extra}"""


def _body(n: int) -> dict[str, object]:
    return {
        "model": "gpt-4o-mini",
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"Summarise the invoice lines of batch {n % 9973}."},
        ],
    }


Send = Callable[[int], Awaitable[None]]


def _sender(http: aiohttp.ClientSession, url: str, headers: dict[str, str]) -> Send:
    async def send(n: int) -> None:
        async with http.post(url, json=_body(n), headers=headers) as response:
            await response.read()
            if response.status != 200:
                raise RuntimeError(f"HTTP {response.status} from {url}")

    return send


async def _sequential(direct: Send, proxied: Send, requests: int) -> tuple[Latencies, Latencies]:
    """Alternate direct and proxied requests, one at a time, timing each."""
    times: tuple[list[float], list[float]] = ([], [])
    pair = ((times[0], direct), (times[1], proxied))
    for n in range(requests):
        # Alternate which goes first, so neither always meets a warmer cache.
        for samples, send in pair if n % 2 else pair[::-1]:
            began = time.perf_counter()
            await send(n)
            samples.append((time.perf_counter() - began) * 1000)
    return Latencies(times[0]), Latencies(times[1])


async def _throughput(send: Send, requests: int) -> float:
    """Requests per second with CONCURRENCY requests in flight."""
    counter = iter(range(requests))

    async def worker() -> None:
        for n in counter:
            await send(n)

    began = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    return requests / (time.perf_counter() - began)


async def _measure(state: str, label: str, requests: int, *, table: bool = True) -> float:
    async with FakeLLM() as upstream:
        config = parse_config(_config(upstream.url, state), env={})
        proxy = ProxyServer(config, alerter=Alerter([]))
        await proxy.start()
        try:
            connector = aiohttp.TCPConnector(limit=CONCURRENCY * 2)
            async with aiohttp.ClientSession(connector=connector) as http:
                direct = _sender(http, f"{upstream.url}/v1/chat/completions", {})
                auth = {"Authorization": f"Bearer {PROXY_KEY}"}
                proxied = _sender(
                    http, f"http://127.0.0.1:{proxy.port}/openai/v1/chat/completions", auth
                )
                await _sequential(direct, proxied, max(50, requests // 10))  # warm-up
                gc.collect()
                plain, through = await _sequential(direct, proxied, requests)
                direct_rps = await _throughput(direct, requests)
                proxied_rps = await _throughput(proxied, requests)
        finally:
            await proxy.stop()
    added = through.percentile(50) - plain.percentile(50)
    if not table:
        print(f"  {label}: added p50 {added:.3f} ms ({plain.percentile(50):.3f} direct)")
        return added
    print(
        f"\n{label}: {requests:,} sequential requests each way, then {requests:,} at "
        f"{CONCURRENCY} in flight"
    )
    print(f"  {'':<14}{'p50 ms':>9}{'p99 ms':>9}{'mean ms':>9}{'req/s':>9}")
    for name, lat, rps in (("direct", plain, direct_rps), ("via proxy", through, proxied_rps)):
        print(
            f"  {name:<14}{lat.percentile(50):>9.3f}{lat.percentile(99):>9.3f}"
            f"{statistics.fmean(lat.samples):>9.3f}{rps:>9.0f}"
        )
    print(
        f"  added by the proxy: p50 {added:.3f} ms, "
        f"p99 {through.percentile(99) - plain.percentile(99):.3f} ms; "
        f"throughput ratio proxy/direct {proxied_rps / direct_rps:.2f}"
    )
    return added


async def _evalsha_calls(url: str) -> int:
    """Script calls Redis has served so far."""
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(url)
    try:
        stats = await client.info("commandstats")
    finally:
        await client.aclose()
    entry = stats.get("cmdstat_evalsha")
    return int(entry["calls"]) if isinstance(entry, dict) else 0


async def _budgets(state: str, label: str, requests: int, redis_url: str | None) -> float:
    """Budgets off against budgets and the anomaly detector on, alternating: the p50 they add."""
    async with FakeLLM() as upstream:
        proxies = [
            ProxyServer(
                parse_config(_config(upstream.url, state, extra), env={}), alerter=Alerter([])
            )
            for extra in ("", BUDGETS)
        ]
        for proxy in proxies:
            await proxy.start()
        try:
            async with aiohttp.ClientSession() as http:
                auth = {"Authorization": f"Bearer {PROXY_KEY}", "X-Loopwarden-Customer": "acme"}
                off, on = (
                    _sender(http, f"http://127.0.0.1:{p.port}/openai/v1/chat/completions", auth)
                    for p in proxies
                )
                await _sequential(off, on, max(50, requests // 10))  # warm-up
                gc.collect()
                before = await _evalsha_calls(redis_url) if redis_url else 0
                plain, budgeted = await _sequential(off, on, requests)
                scripts = (await _evalsha_calls(redis_url) - before) if redis_url else 0
        finally:
            for proxy in proxies:
                await proxy.stop()
    added = budgeted.percentile(50) - plain.percentile(50)
    print(f"\nbudgets, {label}: {requests:,} requests each, alternating")
    print(f"  {'':<22}{'p50 ms':>9}{'p99 ms':>9}")
    for name, lat in (("budgets off", plain), ("3 budgets + anomaly", budgeted)):
        print(f"  {name:<22}{lat.percentile(50):>9.3f}{lat.percentile(99):>9.3f}")
    ratio = budgeted.percentile(50) / plain.percentile(50)
    print(f"  added by the budgets and anomaly: p50 {added:.3f} ms (ratio on/off {ratio:.2f})")
    if redis_url:
        # Each request pair: one decide without budgets; one admit and one charge with them.
        per_call = (scripts - requests) / requests
        print(f"  redis script calls per budgeted call: {per_call:.2f} (all checks 1, charge 1)")
    return added


def _budget_runs(requests: int) -> list[tuple[str, float]]:
    """The budgets on/off comparison on memory, sqlite and (when installed) redis state."""
    from tests.fakes.redis_server import RedisServer, RedisServerMissing

    memory = _budgets("{backend: memory}", "memory", requests, None)
    figures = [("memory", eventloop.run(memory))]
    with tempfile.TemporaryDirectory(prefix="lw-proxy-bench-") as workdir:
        path = Path(workdir) / "budgets.sqlite3"
        sqlite = f"{{backend: sqlite, path: '{path}'}}"
        figures.append(("sqlite", eventloop.run(_budgets(sqlite, "sqlite", requests, None))))
        try:
            server = RedisServer(Path(workdir) / "redis")
        except RedisServerMissing as exc:
            print(f"\nbudgets, redis: skipped ({exc})")
            return figures
        with server:
            state = f"{{backend: redis, url: '{server.url}'}}"
            budgeted = _budgets(state, "redis", requests, server.url)
            figures.append(("redis", eventloop.run(budgeted)))
    return figures


def main(argv: list[str] | None = None) -> int:
    """Measure with memory and sqlite state; print figures, ratios and the targets."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="a fifth of the requests")
    parser.add_argument("--budgets-only", action="store_true", help="only budgets on/off")
    args, _ = parser.parse_known_args(argv)
    requests = 400 if args.quick else 2_000
    print(
        f"python {platform.python_version()} on {platform.machine()}, aiohttp {aiohttp.__version__}"
        f", {eventloop.loop_name()} loop (what `loopwarden proxy` runs on)"
    )
    budgets = _budget_runs(requests)
    for state, figure in budgets:
        verdict = "met" if figure <= TARGET_BUDGETS_ADDED_P50_MS else "NOT met"
        target = TARGET_BUDGETS_ADDED_P50_MS
        print(f"target <= {target:.1f} ms added by budgets at p50 ({state} state): {verdict}")
    if args.budgets_only:
        return 0
    served = eventloop.loop_name()
    loops = tuple(dict.fromkeys((served, "asyncio")))
    figures: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="lw-proxy-bench-") as workdir:
        # Rounds, each the loop `loopwarden proxy` runs on first, then the standard one:
        # a run's p50 moves with the machine by more than the figures differ, so the
        # verdict is on the median of the rounds. The first round prints its tables.
        for round_ in range(1, ROUNDS + 1):
            if round_ == 2:
                print()
            for loop in loops:
                path = Path(workdir) / f"{loop}-{round_}.sqlite3"
                for state, config in (
                    ("memory", "{backend: memory}"),
                    ("sqlite", f"{{backend: sqlite, path: '{path}'}}"),
                ):
                    label = f"{state} state, {loop} loop"
                    if round_ > 1:
                        label += f", round {round_}"
                    run = _measure(config, label, requests, table=round_ == 1)
                    figures.setdefault((loop, state), []).append(eventloop.run(run, choice=loop))
    medians = {key: statistics.median(values) for key, values in figures.items()}
    print(f"\nadded p50, median of {ROUNDS} rounds (range):")
    for (name, state), values in figures.items():
        print(
            f"  {state:<7}{name:<9}{medians[name, state]:.3f} ms "
            f"({min(values):.3f}-{max(values):.3f})"
        )
    if served != "asyncio":
        for state in ("memory", "sqlite"):
            fast, standard = medians[served, state], medians["asyncio", state]
            print(f"{state} state: {served} takes {standard - fast:.3f} ms off the added p50")
    for state, target in (("memory", TARGET_ADDED_P50_MS), ("sqlite", TARGET_SQLITE_ADDED_P50_MS)):
        verdict = "met" if medians[served, state] <= target else "NOT met"
        print(f"target <= {target:.1f} ms added at p50 ({state} state, {served} loop): {verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
