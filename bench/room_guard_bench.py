"""RoomGuard: `admit` per message on memory and Redis, and a guarded PTB bot against a bare one.

Part 1 times `RoomGuard.admit` alone: bot messages from a few senders across many rooms
(each with a message id, so the duplicate claim, the bot-turn count and the pair
decision all run), on the memory backend and on a redis-server this benchmark starts
(`tests/fakes/redis_server.py`), one message at a time.

Part 2 is the cost a guard adds to a real bot: the same python-telegram-bot echo bot,
bare and guarded (`LoopwardenHandler` in group -1, `GuardedBot` filtering replies, memory
state), each against a fresh fake Bot API (`bench.telegram_bench.measure`: all updates
injected at once, the clock runs until the last reply is posted), in alternating rounds
of one run; the medians are compared. Target: guarded >= 0.9 of bare.

Run: `.venv/bin/python -m bench.room_guard_bench [--messages 20000] [--updates 3000]
[--rounds 3]` (`--quick`: 2,000 messages, 1,000 updates, one round).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from telegram import Update
from telegram.ext import Application, ContextTypes, ExtBot, MessageHandler, filters

from bench.telegram_bench import POLL_TIMEOUT, TOKEN, Run, measure
from loopwarden_integrations import RoomGuard
from loopwarden_integrations.telegram_ptb import GuardedBot, LoopwardenHandler
from tests.fakes.redis_server import RedisServer
from tests.fakes.telegram_server import TelegramFake

ROOMS = 500
SENDERS = ("echo", "mirror", "parrot2", "relay")
# Budgets large enough that the measured messages are admitted: the common case.
POLICY = {"bot_loop": {"max_events_per_window": 1_000_000, "max_consecutive_bot_turns": 0}}
TARGET = 0.9


async def admit_rate(state: str, messages: int) -> float:
    """Admissions per second of one guard on `state`, one message at a time."""
    async with RoomGuard(POLICY, state, bot_id="bench-bot") as guard:
        await guard.admit("bench:warm-up", "echo", True)
        started = time.perf_counter()
        for index in range(messages):
            await guard.admit(
                f"bench:{index % ROOMS}",
                SENDERS[index % len(SENDERS)],
                True,
                message_id=str(index),
            )
        return messages / (time.perf_counter() - started)


async def _echo(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    message = update.effective_message
    if message is not None and message.text:
        await message.reply_text(f"echo: {message.text}")


class _PlainBot(ExtBot[None]):
    """PTB's own ExtBot, taking (and ignoring) the guard so both sides are built alike."""

    def __init__(self, token: str, *, guard: RoomGuard, base_url: str) -> None:
        super().__init__(token, base_url=base_url)


def ptb_runner(guarded: bool) -> Callable[[TelegramFake], Awaitable[Callable[[], Awaitable[None]]]]:
    """The echo bot, bare or guarded; otherwise built alike so only the guard differs."""

    async def start(fake: TelegramFake) -> Callable[[], Awaitable[None]]:
        guard = RoomGuard(state="memory", bot_id=str(fake.bots[TOKEN].user.id))
        bot_class = GuardedBot if guarded else _PlainBot
        bot = bot_class(TOKEN, guard=guard, base_url=f"{fake.base_url}/bot")
        app = Application.builder().bot(bot).build()
        if guarded:
            app.add_handler(LoopwardenHandler(guard), group=-1)
        app.add_handler(MessageHandler(filters.TEXT, _echo))
        await app.initialize()
        updater = app.updater
        if updater is None:
            raise RuntimeError("the PTB application has no updater")
        await updater.start_polling(timeout=POLL_TIMEOUT, allowed_updates=["message"])
        await app.start()

        async def stop() -> None:
            await updater.stop()
            await app.stop()
            await app.shutdown()
            await guard.aclose()

        return stop

    return start


async def run(messages: int, updates: int, rounds: int) -> float:
    """Both parts; prints the figures and returns the guarded/bare wall-clock ratio."""
    memory = await admit_rate("memory", messages)
    with tempfile.TemporaryDirectory() as workdir, RedisServer(Path(workdir) / "redis") as redis:
        shared = await admit_rate(redis.url, messages)
    for name, rate in (("memory", memory), ("redis", shared)):
        print(f"RoomGuard.admit on {name:<6} {rate:10,.0f} messages/s ({1e6 / rate:6.1f} us each)")
    bare: list[Run] = []
    guarded: list[Run] = []
    for _ in range(rounds):
        bare.append(await measure("bare python-telegram-bot", ptb_runner(False), updates, 1))
        guarded.append(await measure("guarded (RoomGuard)", ptb_runner(True), updates, 1))
    wall = statistics.median(r.wall_rate for r in guarded) / statistics.median(
        r.wall_rate for r in bare
    )
    cpu = statistics.median(r.cpu_rate for r in guarded) / statistics.median(
        r.cpu_rate for r in bare
    )
    verdict = "met" if wall >= TARGET else "MISSED"
    print(
        f"median of {rounds} rounds: guarded/bare = {wall:.2f} wall clock (target {TARGET} "
        f"{verdict}), {cpu:.2f} per CPU second"
    )
    return wall


def main(argv: list[str] | None = None) -> None:
    """Parse the arguments, run both parts and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="2,000 messages, 1,000 updates")
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--updates", type=int, default=3_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    if args.quick:
        messages, updates, rounds = 2_000, 1_000, 1
    else:
        messages, updates, rounds = args.messages, args.updates, args.rounds
    # PTB warns on every RetryAfter unless its timedelta periods are opted in to.
    os.environ.setdefault("PTB_TIMEDELTA", "true")
    asyncio.run(run(messages, updates, rounds))


if __name__ == "__main__":
    main()
