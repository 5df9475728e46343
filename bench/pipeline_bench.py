"""Pipeline throughput: messages/s through every stage, and the cost added per message.

Run with `.venv/bin/python -m bench.pipeline_bench [--messages N] [--repeat R]`.

The workload is a room-shaped mix with no platform I/O: in each of many distinct rooms a
human writes once and another bot then writes five times (under the pair budget and the
bot-turn cap), each message answered by a trivial scripted-like agent, with memory
state and an in-memory connector. The same messages are then handed straight to the
agent (the baseline, same run, same process). Figures: messages/s through the pipeline
(one core, one event loop), the baseline's, and the difference per message in µs. Times
are this thread's CPU time, so other processes on the machine do not distort them; the
wall-clock rate is printed too. Each run starts with fresh state (the pipeline is
built once). Targets: at least 20,000 messages/s and at most 30 µs added per message, for
the pipeline without room memory (the targets predate it); the default pipeline, with
the transcript recorded and each turn's history read, is measured beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from gateway.admin.service import AdminService
from gateway.app.connector import Capabilities, Sink
from gateway.app.context import TurnContext
from gateway.app.refusals import RecentRefusals
from gateway.app.stages import build_gateway_pipeline
from gateway.app.types import AgentResult, InboundMessage, Reply
from gateway.config import Config, parse_config
from gateway.delivery.sender import Delivery
from gateway.observability.metrics import Metrics
from gateway.state.memory import MemoryStateStore

TARGET_RATE = 20_000
TARGET_ADDED_US = 30.0
BOT_MESSAGES_PER_ROOM = 5

CONFIG = """
agents: {echo: {kind: scripted, default: "echo: {text}"}}
bots: [{id: echo, platform: room, agent: echo}]
"""
NO_ROOM_MEMORY = "pipeline: {transcript: {max_messages: 0}}\n"
"""The pipeline the targets were set for: every stage but room memory (issue 11's)."""


class EchoAgent:
    """What the scripted agent does with no rules: fill the default template."""

    async def respond(self, turn: TurnContext) -> AgentResult:
        return AgentResult(f"echo: {turn.message.text}")

    async def aclose(self) -> None:
        """Nothing to close."""


class NullConnector:
    """A connector whose sends go nowhere: the pipeline's cost, not a platform's."""

    name = "room"
    bot_id = "echo"
    capabilities = Capabilities(max_message_length=2_000)
    connected = True
    bot_user_id = "U_ECHO"

    def __init__(self) -> None:
        self.sent = 0

    async def start(self, sink: Sink) -> None:
        """Nothing to connect."""

    async def send(self, channel_id: str, reply: Reply) -> str | None:
        self.sent += 1
        return None

    async def typing(self, channel_id: str, thread_id: str | None) -> None:
        """No typing indicator."""

    async def aclose(self) -> None:
        """Nothing to close."""


_ids = itertools.count()


def workload(rooms: int) -> list[InboundMessage]:
    """One human message then BOT_MESSAGES_PER_ROOM bot messages, in each of `rooms` rooms."""
    batch = next(_ids)
    messages: list[InboundMessage] = []
    for room in range(rooms):
        channel = f"{batch}-{room}"
        senders = [("U_HUMAN", "human", False)] + [
            ("U_OTHER", "other", True)
        ] * BOT_MESSAGES_PER_ROOM
        for index, (sender_id, name, is_bot) in enumerate(senders):
            messages.append(
                InboundMessage(
                    platform="room",
                    bot_id="echo",
                    channel_id=channel,
                    thread_id=None,
                    message_id=f"{channel}-{index}",
                    sender_id=sender_id,
                    sender_name=name,
                    sender_is_bot=is_bot,
                    text=f"hello there, message {index} of room {room}",
                    bot_user_id="U_ECHO",
                )
            )
    return messages


class Bench:
    """One gateway's pipeline and the turn factory both measurements share."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.connector = NullConnector()
        self.agent = EchoAgent()
        self.bot = config.bot("echo")
        self.fresh()

    def fresh(self) -> None:
        """A fresh state, and the pipeline built on it (its stages hold their stores)."""
        self.state = MemoryStateStore()
        recent = RecentRefusals()
        self.handler = build_gateway_pipeline(
            self.config,
            state=self.state,
            admin=AdminService(self.config, self.state, recent=recent),
            delivery=Delivery(Metrics()),
            recent=recent,
        )

    def turn(self, message: InboundMessage) -> TurnContext:
        return TurnContext(
            message=message,
            policy=self.config.policy,
            state=self.state,
            config=self.config,
            bot=self.bot,
            connector=self.connector,
            agent=self.agent,
        )

    async def through_pipeline(self, messages: list[InboundMessage]) -> None:
        handler, turn = self.handler, self.turn
        for message in messages:
            await handler(turn(message))

    async def agent_directly(self, messages: list[InboundMessage]) -> None:
        respond, turn = self.agent.respond, self.turn
        for message in messages:
            await respond(turn(message))


@dataclass(frozen=True, slots=True)
class Timing:
    """Seconds per message of one run: CPU time of this thread, and wall-clock time."""

    cpu: float
    wall: float


async def timed(
    bench: Bench, run: Callable[[list[InboundMessage]], Awaitable[None]], rooms: int
) -> Timing:
    """One run over fresh messages and fresh state (GC paused, as timeit does)."""
    messages = workload(rooms)
    bench.fresh()
    gc.collect()
    gc.disable()
    try:
        wall, cpu = time.perf_counter(), time.thread_time()
        await run(messages)
        cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
    finally:
        gc.enable()
    return Timing(cpu / len(messages), wall / len(messages))


async def measure(config: Config, rooms: int, repeat: int) -> tuple[Bench, Timing, Timing]:
    """The best pipeline run and the best direct run of one config (CPU per message)."""
    bench = Bench(config)
    await timed(bench, bench.through_pipeline, rooms // 10 or 1)  # warm caches and code paths
    runs = [await timed(bench, bench.through_pipeline, rooms) for _ in range(repeat)]
    bases = [await timed(bench, bench.agent_directly, rooms) for _ in range(repeat)]
    best = min(runs, key=lambda run: run.cpu)
    return bench, best, min(bases, key=lambda run: run.cpu)


async def main(total: int, repeat: int) -> None:
    rooms = max(1, total // (1 + BOT_MESSAGES_PER_ROOM))
    count = rooms * (1 + BOT_MESSAGES_PER_ROOM)
    bare, bare_run, bare_direct = await measure(
        parse_config(CONFIG + NO_ROOM_MEMORY, env={}), rooms, repeat
    )
    _, memory_run, _ = await measure(parse_config(CONFIG, env={}), rooms, repeat)
    pipeline, direct = bare_run.cpu, bare_direct.cpu
    added_us = (pipeline - direct) * 1e6
    rate = 1 / pipeline
    print(f"messages per run        {count:>12,}  ({rooms:,} rooms, best of {repeat})")
    print(f"replies delivered       {bare.connector.sent:>12,}  (all runs, room memory off)")
    print(f"pipeline                {rate:>12,.0f} msg/s  {pipeline * 1e6:8.2f} µs/msg  (CPU)")
    print(f"agent directly          {1 / direct:>12,.0f} msg/s  {direct * 1e6:8.2f} µs/msg  (CPU)")
    print(f"added by the pipeline   {added_us:>12.2f} µs/msg  (target ≤ {TARGET_ADDED_US:.0f})")
    print(f"pipeline / direct       {pipeline / direct:>12.1f} ×")
    wall = 1 / bare_run.wall
    print(f"pipeline, wall clock    {wall:>12,.0f} msg/s  (other processes count here)")
    verdict = "meets" if rate >= TARGET_RATE and added_us <= TARGET_ADDED_US else "misses"
    print(f"{verdict} the targets (≥ {TARGET_RATE:,} msg/s, ≤ {TARGET_ADDED_US:.0f} µs added)")
    memory_us = (memory_run.cpu - pipeline) * 1e6
    print(
        f"with room memory (the default)  {1 / memory_run.cpu:>8,.0f} msg/s"
        f"  (+{memory_us:.2f} µs/msg: the transcript and history stages)"
    )


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--messages", type=int, default=60_000, help="messages per run")
    parser.add_argument("--repeat", type=int, default=5, help="runs; the best one counts")
    parser.add_argument("--quick", action="store_true", help="a tenth of the messages, 2 runs")
    args = parser.parse_args()
    if args.quick:
        args.messages, args.repeat = args.messages // 10, 2
    asyncio.run(main(args.messages, args.repeat))


if __name__ == "__main__":
    cli()
