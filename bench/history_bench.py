"""Room memory: what loading 40 messages of history adds to a turn, per state backend.

Run with `.venv/bin/python -m bench.history_bench [--turns N] [--quick]`.

For each backend (memory, sqlite, and redis on a redis-server of its own on loopback) one
store serves three pipelines of the same gateway, in the same run, turn for turn in
turn: room memory off (`pipeline.transcript.max_messages: 0`), recording only (the
agent's `history.max_messages: 0`), and recording with 40 messages of history loaded for
the agent (the defaults: `history: {max_messages: 40, max_tokens: 6000}`). Every room's
transcript holds 200 messages of about 80 characters before the timed turns begin, so
each history turn loads a full 40. A turn is one human message through every stage to a
trivial agent and a connector whose sends go nowhere; its time is wall-clock (sqlite
works on its own thread and redis over a socket), and the figures are the p50 and p90
of each. "Added by history" is the p50 of the history turns less that of the
recording-only turns. Target: at most 1 ms p50 added on sqlite and redis.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.pipeline_bench import NullConnector
from gateway.admin.service import AdminService
from gateway.app.context import TurnContext
from gateway.app.middlewares.transcript import conversation
from gateway.app.pipeline import Handler
from gateway.app.refusals import RecentRefusals
from gateway.app.stages import build_gateway_pipeline
from gateway.app.types import AgentResult, InboundMessage
from gateway.config import Config, parse_config
from gateway.delivery.sender import Delivery
from gateway.observability.metrics import Metrics
from gateway.state.base import StateStore, TranscriptEntry
from gateway.state.memory import MemoryStateStore
from gateway.state.redis import RedisStateStore
from gateway.state.sqlite import SqliteStateStore
from tests.fakes.redis_server import RedisServer

TARGET_ADDED_MS = 1.0
HISTORY = 40
ROOMS = 20
PREFILL = 200
TEXT = "a message of about eighty characters, as people write them in a busy group chat"

CONFIGS = {
    "memory off": "pipeline: {transcript: {max_messages: 0}}\nagents: {echo: {kind: scripted}}",
    "recording only": "agents: {echo: {kind: scripted, history: {max_messages: 0}}}",
    "with history": "agents: {echo: {kind: scripted}}",
}
BASE = "bots: [{id: echo, platform: room, agent: echo}]\n"


class HistoryAgent:
    """Answers at once and remembers how much history the last turn had."""

    def __init__(self) -> None:
        self.last_history = 0

    async def respond(self, turn: TurnContext) -> AgentResult:
        self.last_history = len(turn.history)
        return AgentResult("ok")

    async def aclose(self) -> None:
        """Nothing to close."""


class Gateway:
    """One pipeline of one config on a shared store, and the turns it is given."""

    def __init__(self, config: Config, state: StateStore) -> None:
        self.config = config
        self.state = state
        self.agent = HistoryAgent()
        self.connector = NullConnector()
        recent = RecentRefusals()
        self.handler: Handler = build_gateway_pipeline(
            config,
            state=state,
            admin=AdminService(config, state, recent=recent),
            delivery=Delivery(Metrics()),
            recent=recent,
        )

    async def turn(self, message: InboundMessage) -> float:
        """Seconds one message takes through the pipeline (wall clock)."""
        turn = TurnContext(
            message=message,
            policy=self.config.policy,
            state=self.state,
            config=self.config,
            bot=self.config.bot("echo"),
            connector=self.connector,
            agent=self.agent,
        )
        started = time.perf_counter()
        await self.handler(turn)
        return time.perf_counter() - started


_ids = itertools.count()


def human(room: int) -> InboundMessage:
    """A fresh human message in one of the rooms."""
    return InboundMessage(
        platform="room",
        bot_id="echo",
        channel_id=f"r{room}",
        thread_id=None,
        message_id=f"m{next(_ids)}",
        sender_id="U_HUMAN",
        sender_name="human",
        sender_is_bot=False,
        text=TEXT,
        bot_user_id="U_ECHO",
    )


async def prefill(state: StateStore) -> None:
    """Every room's transcript full: PREFILL messages."""
    for room in range(ROOMS):
        scope = conversation(human(room))
        for index in range(PREFILL):
            entry = TranscriptEntry(f"pre{index}", "U_OTHER", "other", TEXT)
            await state.transcript_append(scope, entry, max_messages=PREFILL, ttl=86_400.0)


async def measure(state: StateStore, turns: int) -> dict[str, list[float]]:
    """Per-turn seconds of each config, the configs taking turns message by message."""
    await state.start()
    try:
        await prefill(state)
        gateways = {
            name: Gateway(parse_config(BASE + extra, env={}), state)
            for name, extra in CONFIGS.items()
        }
        times: dict[str, list[float]] = {name: [] for name in gateways}
        for index in range(turns):
            for name, gateway in gateways.items():
                times[name].append(await gateway.turn(human(index % ROOMS)))
        loaded = gateways["with history"].agent.last_history
        if loaded != HISTORY:
            raise RuntimeError(f"a history turn loaded {loaded} messages, not {HISTORY}")
        return times
    finally:
        await state.aclose()


def p(times: list[float], percent: int) -> float:
    """The percentile in milliseconds."""
    return statistics.quantiles(times, n=100)[percent - 1] * 1000


async def run(turns: int, workdir: Path) -> bool:
    """Measure every backend, print its figures; True when sqlite and redis meet the target."""
    met = True
    with RedisServer(workdir / "redis") as server:
        backends: dict[str, Callable[[], StateStore]] = {
            "memory": MemoryStateStore,
            "sqlite": lambda: SqliteStateStore(workdir / "history.sqlite3"),
            "redis": lambda: RedisStateStore(server.url, key_prefix="history-bench:"),
        }
        for backend, build in backends.items():
            times = await measure(build(), turns)
            print(f"{backend}")
            for name, each in times.items():
                print(f"  {name:15} p50 {p(each, 50):7.3f} ms   p90 {p(each, 90):7.3f} ms")
            added = p(times["with history"], 50) - p(times["recording only"], 50)
            recording = p(times["recording only"], 50) - p(times["memory off"], 50)
            print(f"  added by recording the turn    {recording:7.3f} ms p50")
            print(f"  added by loading {HISTORY} messages   {added:7.3f} ms p50", end="")
            if backend == "memory":
                print()
                continue
            ok = added <= TARGET_ADDED_MS
            met = met and ok
            print(f"   ({'meets' if ok else 'misses'} ≤ {TARGET_ADDED_MS:g} ms)")
    return met


def cli() -> None:
    """Parse the arguments and run."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--turns", type=int, default=2_000, help="timed turns per config")
    parser.add_argument("--quick", action="store_true", help="a tenth of the turns")
    args = parser.parse_args()
    turns = args.turns // 10 if args.quick else args.turns
    with tempfile.TemporaryDirectory(prefix="lw-history-bench-") as workdir:
        met = asyncio.run(run(turns, Path(workdir)))
    print(f"{'meets' if met else 'misses'} the target (≤ {TARGET_ADDED_MS:g} ms p50 added)")


if __name__ == "__main__":
    cli()
