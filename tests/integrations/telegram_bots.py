"""Two small Telegram bots, one with python-telegram-bot and one with aiogram, both guarded.

Each answers every text with `ping from <name> <n>`, and with `NO_REPLY` when asked to be
quiet, so two of them in one group ping-pong until a guard stops them. Tests run them in
process; `python -m tests.integrations.telegram_bots ptb|aiogram TOKEN NAME API STATE`
runs one as a process of its own (until SIGTERM), printing `ready` once it polls.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import signal
import sys
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager

from aiogram import Bot, Dispatcher
from aiogram.client.session.aiohttp import AiohttpSession
from aiogram.client.telegram import TelegramAPIServer
from aiogram.types import Message
from telegram import Update
from telegram.ext import Application, ContextTypes, MessageHandler, filters

from loopwarden_integrations import RoomGuard
from loopwarden_integrations.aiogram import LoopwardenMiddleware, ReplyFilter
from loopwarden_integrations.telegram_ptb import GuardedBot, LoopwardenHandler

POLICY: Mapping[str, object] = {
    "bot_loop": {"max_events_per_window": 4, "window_seconds": 300, "cooldown_seconds": 300}
}


def answer(name: str) -> Callable[[str], str]:
    """The bot's reply to a text: a numbered ping, or silence when asked to be quiet."""
    counter = itertools.count(1)
    return lambda text: "NO_REPLY" if "quiet" in text else f"ping from {name} {next(counter)}"


@asynccontextmanager
async def ptb_bot(token: str, name: str, api: str, guard: RoomGuard) -> AsyncIterator[None]:
    """A python-telegram-bot Application polling `api`, guarded, while the block runs."""
    reply = answer(name)
    app = Application.builder().bot(GuardedBot(token, guard=guard, base_url=f"{api}/bot")).build()

    async def respond(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        message = update.message
        if message is not None and message.text is not None:
            await message.reply_text(reply(message.text))

    app.add_handler(LoopwardenHandler(guard), group=-1)
    app.add_handler(MessageHandler(filters.TEXT, respond))
    async with app:
        updater = app.updater
        assert updater is not None
        await updater.start_polling(poll_interval=0.0, timeout=1)
        await app.start()
        try:
            yield
        finally:
            await updater.stop()
            await app.stop()


@asynccontextmanager
async def aiogram_bot(token: str, name: str, api: str, guard: RoomGuard) -> AsyncIterator[None]:
    """An aiogram Dispatcher polling `api`, guarded, while the block runs."""
    reply = answer(name)
    bot = Bot(token, session=AiohttpSession(api=TelegramAPIServer.from_base(api)))
    bot.session.middleware(ReplyFilter(guard))
    dp = Dispatcher()
    dp.message.outer_middleware(LoopwardenMiddleware(guard))

    @dp.message()
    async def respond(message: Message) -> None:
        if message.text is not None:
            await message.answer(reply(message.text))

    polling = asyncio.create_task(
        dp.start_polling(bot, polling_timeout=1, handle_signals=False, close_bot_session=True)
    )
    try:
        yield
    finally:
        with contextlib.suppress(RuntimeError):  # polling already stopped by itself
            await dp.stop_polling()
        await polling


BOTS = {"ptb": ptb_bot, "aiogram": aiogram_bot}


async def main(kind: str, token: str, name: str, api: str, state: str) -> None:
    """Run one bot as a process until SIGTERM."""
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    guard = RoomGuard(POLICY, state, bot_id=token.partition(":")[0])
    async with guard, BOTS[kind](token, name, api, guard):
        print("ready", flush=True)
        await stop.wait()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:6]))
