"""Two bot processes written with different libraries, one Redis: one pair budget between them.

A python-telegram-bot process and an aiogram process, each with its own RoomGuard on the
same redis-server, ping-pong in one group of the fake Telegram (served by this test
process, which relays each post to the other bot). The pair is held to one budget and
gets one cooldown notice, and the pair's record in Redis says so.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from loopwarden_integrations import RoomGuard
from tests.connectors.connector_helpers import wait_for
from tests.fakes.redis_server import RedisServer
from tests.fakes.telegram_server import TelegramFake
from tests.integrations import telegram_room as room
from tests.integrations.telegram_bots import POLICY

ROOT = Path(__file__).resolve().parents[2]
BUDGET = 4


@asynccontextmanager
async def bot_process(
    kind: str, token: str, name: str, api: str, state: str
) -> AsyncIterator[None]:
    """One guarded bot as a process of its own, until the block ends."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.integrations.telegram_bots",
        kind,
        token,
        name,
        api,
        state,
        stdout=asyncio.subprocess.PIPE,
        cwd=ROOT,
    )
    try:
        assert process.stdout is not None
        async with asyncio.timeout(30):
            assert (await process.stdout.readline()).strip() == b"ready"
        yield
    finally:
        if process.returncode is None:
            process.terminate()
        async with asyncio.timeout(30):
            await process.wait()


@pytest.mark.redis
async def test_issue15_two_processes_two_libraries_one_redis_one_budget(
    redis: RedisServer,
) -> None:
    async with TelegramFake() as fake:
        room.setup(fake)
        async with (
            bot_process("ptb", room.PARROT_TOKEN, "parrot", fake.base_url, redis.url),
            bot_process("aiogram", room.ECHO_TOKEN, "echo", fake.base_url, redis.url),
        ):
            room.kickoff(fake)
            await wait_for(lambda: len(fake.sent_to(room.GROUP.id)) == BUDGET + 1, limit=30)
            # A human probe: both answer her, and those answers (bot messages of a pair in
            # cooldown) are refused in silence by the other process.
            fake.group_message(room.GROUP, room.ALICE, "anyone there?")
            await wait_for(lambda: len(fake.sent_to(room.GROUP.id)) == BUDGET + 3, limit=30)
            await wait_for(
                lambda: not fake.pending(room.PARROT_TOKEN) and not fake.pending(room.ECHO_TOKEN),
                limit=30,
            )
    posted = room.texts(fake)
    assert len([text for text in posted if text.startswith("Loop guard:")]) == 1
    assert len([text for text in posted if text.startswith("ping from")]) == BUDGET + 2
    async with RoomGuard(POLICY, redis.url, bot_id="observer") as observer:
        (pair,) = await observer.state.pair_snapshot(f"telegram:{room.GROUP.id}")
    assert {pair.bot_a, pair.bot_b} == {room.PARROT_ID, room.ECHO_ID}
    assert pair.count == BUDGET
    assert pair.cooldown_remaining > 0
