"""The console must not slow the gateway: pipeline msg/s with a live Activity client, and without.

Run with `.venv/bin/python -m bench.console_bench [--messages N] [--repeat R]`.

The pipeline of bench/pipeline_bench.py (same room-shaped workload, memory state, a null
connector) records into an Activity feed that flushes in the background, as the gateway
runs it; a real aiohttp server on 127.0.0.1 serves `/admin/activity/stream`. Runs with ONE
console client reading that stream (another process, as a browser would be) alternate with
runs with none, in the same process and run; the turns yield to the event loop every
`YIELD_EVERY` messages, as a connector's reads do, so the flushes and the stream run
during the measurement. Every run starts with fresh state and an empty feed. Times are
this thread's CPU time (the client's own is not the gateway's). Also shown: the same
pipeline with no feed at all, for the feed's own cost (recording, the flushes, the memory
backend's appends). Target (issue 12): with a client, at least 0.95× the rate without. Our
own goal, not yet reached on every run: with the feed, at least 0.9× the rate with no feed
(about 4 µs per message).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable

import aiohttp
from aiohttp import web
from pydantic import SecretStr

from bench.pipeline_bench import (
    BOT_MESSAGES_PER_ROOM,
    CONFIG,
    EchoAgent,
    NullConnector,
    workload,
)
from gateway.admin.access import AdminAccess
from gateway.admin.activity import ActivityRoutes
from gateway.admin.service import AdminService
from gateway.app.context import TurnContext
from gateway.app.pipeline import Handler
from gateway.app.refusals import RecentRefusals
from gateway.app.stages import build_gateway_pipeline
from gateway.app.types import InboundMessage
from gateway.config import Config, parse_config
from gateway.delivery.sender import Delivery
from gateway.observability.activity import ActivityFeed
from gateway.observability.metrics import Metrics
from gateway.state.memory import MemoryStateStore

TARGET_RATIO = 0.95
FEED_GOAL = 0.9
YIELD_EVERY = 50
TOKEN = "bench-console-token-0123456789"


class Pipeline:
    """One pipeline (with or without a feed) and a fresh state per run."""

    def __init__(self, config: Config, feed: ActivityFeed | None) -> None:
        self.config = config
        self.feed = feed
        self.connector = NullConnector()
        self.agent = EchoAgent()
        self.bot = config.bot("echo")

    def _fresh(self) -> tuple[Handler, MemoryStateStore]:
        """A fresh state, and the pipeline built on it (its stages hold their stores)."""
        state = MemoryStateStore()
        recent = RecentRefusals()
        handler = build_gateway_pipeline(
            self.config,
            state=state,
            admin=AdminService(self.config, state, recent=recent),
            delivery=Delivery(Metrics()),
            recent=recent,
            activity=self.feed,
        )
        return handler, state

    async def run(self, messages: list[InboundMessage]) -> None:
        """Every message through the pipeline, yielding to the loop every YIELD_EVERY."""
        (handler, state), config = self._fresh(), self.config
        for index, message in enumerate(messages):
            await handler(
                TurnContext(
                    message=message,
                    policy=config.policy,
                    state=state,
                    config=config,
                    bot=self.bot,
                    connector=self.connector,
                    agent=self.agent,
                )
            )
            if index % YIELD_EVERY == 0:
                await asyncio.sleep(0)


async def timed(run: Callable[[list[InboundMessage]], Awaitable[None]], rooms: int) -> float:
    """CPU seconds of this thread per message for one run over fresh messages."""
    messages = workload(rooms)
    gc.collect()
    gc.disable()
    try:
        cpu = time.thread_time()
        await run(messages)
        cpu = time.thread_time() - cpu
    finally:
        gc.enable()
    return cpu / len(messages)


class Client:
    """A console client in another process, reading the live feed until told to stop."""

    def __init__(self, url: str) -> None:
        self._process = subprocess.Popen(
            [sys.executable, "-m", "bench.console_bench", "--client", url],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def stop(self) -> int:
        """End the client; how many events it read."""
        out, _ = self._process.communicate("", timeout=30)
        return int(out.strip() or 0)


async def connected(routes: ActivityRoutes, count: int) -> None:
    """Wait (bounded) until `count` streams are open."""
    async with asyncio.timeout(30):
        while routes.streams != count:  # noqa: ASYNC110 - the count lives in the routes
            await asyncio.sleep(0.01)


async def main(total: int, repeat: int) -> None:
    config = parse_config(CONFIG, env={})
    store = MemoryStateStore()
    feed = ActivityFeed(store)
    routes = ActivityRoutes(
        AdminService(config, store, recent=RecentRefusals()),
        feed,
        store,
        AdminAccess(SecretStr(TOKEN)),
    )
    app = web.Application()
    app.add_routes(routes.routes())
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/admin/activity/stream"
    feed.start()
    with_feed = Pipeline(config, feed)
    without_feed = Pipeline(config, None)
    rooms = max(1, total // (1 + BOT_MESSAGES_PER_ROOM))
    await timed(with_feed.run, rooms // 10 or 1)  # warm caches and code paths
    alone, watched, bare = [], [], []
    read = 0
    try:
        for _ in range(repeat):
            feed.state = MemoryStateStore()  # each run starts with an empty feed, as the other
            alone.append(await timed(with_feed.run, rooms))
            feed.state = MemoryStateStore()
            client = Client(url)
            await connected(routes, 1)
            watched.append(await timed(with_feed.run, rooms))
            read += client.stop()
            await connected(routes, 0)
            bare.append(await timed(without_feed.run, rooms))
    finally:
        await feed.aclose()
        await runner.cleanup()
    none, one, off = min(alone), min(watched), min(bare)
    count = rooms * (1 + BOT_MESSAGES_PER_ROOM)
    print(f"messages per run        {count:>12,}  ({rooms:,} rooms, best of {repeat})")
    print(f"feed, no console client {1 / none:>12,.0f} msg/s  {none * 1e6:8.2f} µs/msg  (CPU)")
    print(f"feed, one client        {1 / one:>12,.0f} msg/s  {one * 1e6:8.2f} µs/msg  (CPU)")
    print(f"no feed at all          {1 / off:>12,.0f} msg/s  {off * 1e6:8.2f} µs/msg  (CPU)")
    print(f"events the client read  {read:>12,}  (all runs; dropped by the feed: {feed.dropped:,})")
    ratio, feed_ratio = none / one, off / none
    client_verdict = "met" if ratio >= TARGET_RATIO else "missed"
    feed_verdict = "met" if feed_ratio >= FEED_GOAL else "missed"
    print(f"one client / none       {ratio:>12.3f} ×  (target ≥ {TARGET_RATIO}: {client_verdict})")
    print(f"feed / no feed          {feed_ratio:>12.3f} ×  (goal ≥ {FEED_GOAL}: {feed_verdict})")
    print(f"the feed's own cost     {(none - off) * 1e6:>12.2f} µs/msg  (CPU)")


async def client(url: str) -> None:
    """Read the stream (counting events) until stdin closes; print the count."""
    read = 0

    async def consume(response: aiohttp.ClientResponse) -> None:
        nonlocal read
        async for line in response.content:
            if line.startswith(b"data:"):
                read += 1

    async with (
        aiohttp.ClientSession() as session,
        session.get(url, headers={"Authorization": f"Bearer {TOKEN}"}) as response,
    ):
        reading = asyncio.create_task(consume(response))
        await asyncio.to_thread(sys.stdin.read)
        reading.cancel()
    print(read)


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--messages", type=int, default=60_000, help="messages per run")
    parser.add_argument("--repeat", type=int, default=5, help="runs; the best one counts")
    parser.add_argument("--quick", action="store_true", help="a tenth of the messages, 2 runs")
    parser.add_argument("--client", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        asyncio.run(client(args.client))
        return
    if args.quick:
        args.messages, args.repeat = args.messages // 10, 2
    asyncio.run(main(args.messages, args.repeat))


if __name__ == "__main__":
    cli()
