"""Telegram throughput: the full gateway against a bare python-telegram-bot echo bot.

Both poll the same loopback fake Bot API (tests/fakes/telegram_server.py) with the same
getUpdates batch size (100) and long-poll timeout (1 s), and both answer every update
with one sendMessage that quotes it (PTB's `reply_text` quotes in groups; the gateway
replies to the message it answers). The gateway runs its whole pipeline (dedupe, self
filter, admin commands, policy, admission, bot-loop guard, a scripted echo agent,
silence filter, delivery) with memory state; the bare bot is a PTB Application with one
echo MessageHandler (updates handled one at a time, PTB's default). Each side gets a
fresh fake, is started and idle in its long poll, and then receives all updates at once;
the clock runs from the injection to the last reply posted. The fake runs in the same
process, so its work is in both sides' figures alike.

The two sides run in alternating rounds (default 3) and the medians are compared, so
load from other processes hits both alike; the CPU-time rate is printed too, as it is
steadier than the wall clock on a busy machine.

Run: `.venv/bin/python -m bench.telegram_bench [--updates 5000] [--chats 1] [--rounds 3]`
(`--quick`: 1,000 updates, one round). With more than one chat the gateway handles the
chats of a batch concurrently (each chat in order), which the bare bot does not; the
default, one chat, compares like with like. Target: gateway >= 0.8 of the bare bot.
`--latency 0.05` makes every sendMessage take 50 ms, as a far-away Bot API does: then
the chats of a batch overlapping is what sets the gateway's throughput.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from telegram import Update
from telegram.ext import Application, ContextTypes, MessageHandler, filters

from gateway.app.runtime import Gateway
from gateway.config import parse_config
from tests.fakes.telegram_server import FakeChat, FakeUser, TelegramFake

TOKEN = "424242:BENCHtokenBENCHtokenBENCHtoken_xyz"
HUMAN = FakeUser(5678, "Alice", "alice")
POLL_TIMEOUT = 1
BATCH = 100

CONFIG = """
state: {{backend: memory}}
http: {{host: 127.0.0.1, port: 0}}
agents: {{echo: {{kind: scripted, default: "echo: {{text}}"}}}}
bots:
  - id: bench-tg
    platform: telegram
    token: "{token}"
    agent: echo
    api_base_url: "{base_url}"
    poll_timeout: {timeout}
"""

Runner = Callable[[TelegramFake], Awaitable[Callable[[], Awaitable[None]]]]


async def _run_gateway(fake: TelegramFake) -> Callable[[], Awaitable[None]]:
    config = parse_config(
        CONFIG.format(token=TOKEN, base_url=fake.base_url, timeout=POLL_TIMEOUT), env={}
    )
    gateway = Gateway(config)
    await gateway.start()

    async def stop() -> None:
        await gateway.stop(5.0)

    return stop


async def _echo(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    message = update.effective_message
    if message is not None and message.text:
        await message.reply_text(f"echo: {message.text}")


async def _run_bare_ptb(fake: TelegramFake) -> Callable[[], Awaitable[None]]:
    app = (
        Application.builder()
        .token(TOKEN)
        .base_url(f"{fake.base_url}/bot")
        .base_file_url(f"{fake.base_url}/file/bot")
        .build()
    )
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

    return stop


@dataclass(frozen=True, slots=True)
class Run:
    """One measured run: wall-clock and CPU throughput."""

    wall_rate: float
    cpu_rate: float


async def measure(name: str, run: Runner, updates: int, chats: int, latency: float = 0.0) -> Run:
    """Updates per second (wall clock, and per CPU second) of one bot over a fresh fake."""
    async with TelegramFake() as fake:
        fake.add_bot(TOKEN, 4242, "BenchBot")
        fake.send_latency = latency
        rooms = [
            fake.add_chat(FakeChat(-2000 - i, "supergroup", f"room {i}"), TOKEN)
            for i in range(chats)
        ]
        stop = await run(fake)
        bot = fake.bots[TOKEN]
        await _until(lambda: bot.polls > 0)
        started, cpu_started = time.perf_counter(), time.process_time()
        for index in range(updates):
            fake.group_message(rooms[index % chats], HUMAN, f"message {index}")
        await _until(lambda: len(fake.sent) >= updates, limit=600.0)
        elapsed = time.perf_counter() - started
        cpu = time.process_time() - cpu_started
        await stop()
        if len(fake.sent) != updates:
            raise RuntimeError(f"{name}: {len(fake.sent)} replies for {updates} updates")
    result = Run(updates / elapsed, updates / cpu)
    print(
        f"{name:<26} {updates} updates in {elapsed:6.2f} s: {result.wall_rate:6.0f} updates/s"
        f" ({result.cpu_rate:6.0f} per CPU second, {cpu / updates * 1e6:5.0f} us CPU each)"
    )
    return result


async def _until(condition: Callable[[], bool], limit: float = 30.0) -> None:
    async with asyncio.timeout(limit):
        while not condition():  # noqa: ASYNC110 - the condition lives in the fake
            await asyncio.sleep(0.005)


async def run(updates: int, chats: int, rounds: int, latency: float = 0.0) -> float:
    """Measure both in alternating rounds, print the medians and their ratios; return wall's."""
    bare: list[Run] = []
    full: list[Run] = []
    for _ in range(rounds):
        bare.append(
            await measure("bare python-telegram-bot", _run_bare_ptb, updates, chats, latency)
        )
        full.append(await measure("loopwarden gateway", _run_gateway, updates, chats, latency))
    wall = statistics.median(r.wall_rate for r in full) / statistics.median(
        r.wall_rate for r in bare
    )
    cpu = statistics.median(r.cpu_rate for r in full) / statistics.median(r.cpu_rate for r in bare)
    verdict = "met" if wall >= 0.8 else "missed"
    print(
        f"median of {rounds} rounds, chats={chats}, latency={latency * 1000:.0f} ms: "
        f"ratio gateway/bare = {wall:.2f} wall clock "
        f"(target 0.8 {verdict}), {cpu:.2f} per CPU second (steadier on a busy machine)"
    )
    return wall


def main(argv: list[str] | None = None) -> None:
    """Parse the arguments, run the benchmark and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="1,000 updates, one round")
    parser.add_argument("--updates", type=int, default=5000)
    parser.add_argument("--chats", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--latency", type=float, default=0.0, help="seconds the fake takes per sendMessage"
    )
    args = parser.parse_args(argv)
    updates, rounds = (1000, 1) if args.quick else (args.updates, args.rounds)
    # PTB warns on every RetryAfter unless its timedelta periods are opted in to.
    os.environ.setdefault("PTB_TIMEDELTA", "true")
    asyncio.run(run(updates, args.chats, rounds, args.latency))


if __name__ == "__main__":
    main()
