"""discord.py bots guarded by `guard_bot`, against the fake Discord (REST and gateway).

Two real `commands.Bot`s log in to the fake (pointed at it with the connector's
`RoutedHTTPClient`, as the gateway's own Discord connector is), see each other's posts as
on Discord, and answer every message from an `on_message` listener; `!hush` is a prefix
command answering NO_REPLY. They share one SQLite file, so they hold one pair budget.
"""

from __future__ import annotations

import asyncio
import itertools
import warnings
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import pytest
import yarl

from connectors.discord.connector import RoutedHTTPClient
from loopwarden_integrations import RoomGuard
from loopwarden_integrations.discord_py import guard_bot
from tests.connectors.connector_helpers import wait_for
from tests.fakes.discord_server import DiscordFake, FakeUser
from tests.integrations.recording_guard import RecordingGuard

with warnings.catch_warnings():
    # discord.py imports the stdlib `audioop` (for voice), deprecated since Python 3.11.
    warnings.filterwarnings("ignore", "'audioop' is deprecated", DeprecationWarning)
    import discord
    from discord.ext import commands

GUILD, CHANNEL = 900, 1100
PARROT = FakeUser(501, "parrot", bot=True)
ECHO = FakeUser(502, "echo", bot=True)
ALICE = FakeUser(7, "alice")
TOKENS = {PARROT.id: "parrot-discord-token", ECHO.id: "echo-discord-token"}
POLICY: Mapping[str, object] = {
    "bot_loop": {"max_events_per_window": 4, "window_seconds": 300, "cooldown_seconds": 300}
}


@pytest.fixture
async def fake() -> AsyncIterator[DiscordFake]:
    async with DiscordFake() as server:
        for user in (PARROT, ECHO):
            server.world.add_bot(TOKENS[user.id], user)
        server.world.add_guild(GUILD, "Lounge", [ALICE, PARROT, ECHO])
        server.world.add_channel(GUILD, CHANNEL, "general")
        yield server


@asynccontextmanager
async def running_bot(fake: DiscordFake, user: FakeUser, guard: RoomGuard) -> AsyncIterator[None]:
    """A guarded commands.Bot logged in to the fake until the block ends."""
    intents = discord.Intents.default()
    intents.message_content = True
    bot = commands.Bot(command_prefix="!", intents=intents, chunk_guilds_at_startup=False)
    http = RoutedHTTPClient(asyncio.get_running_loop(), api_base_url=fake.base_url)
    bot.http = http
    bot._connection.http = http
    counter = itertools.count(1)

    @bot.listen("on_message")
    async def respond(message: discord.Message) -> None:
        me = bot.user
        if me is not None and message.author.id != me.id and not message.content.startswith("!"):
            await message.channel.send(f"ping from {user.username} {next(counter)}")

    @bot.command()
    async def hush(ctx: commands.Context[commands.Bot]) -> None:
        await ctx.send("NO_REPLY")

    guard_bot(bot, guard)
    await bot.login(TOKENS[user.id])
    http.gateway_url = yarl.URL(fake.gateway_url)
    connection = asyncio.create_task(bot.connect(reconnect=False))
    try:
        await wait_for(lambda: fake.connected(TOKENS[user.id]))
        yield
    finally:
        await bot.close()
        await asyncio.wait((connection,))


async def start_pair(
    stack: AsyncExitStack, fake: DiscordFake, state: str, policy: Mapping[str, object] = POLICY
) -> tuple[RecordingGuard, RecordingGuard]:
    parrot = RecordingGuard(policy, state, bot_id=str(PARROT.id), bot_name="parrot")
    echo = RecordingGuard(policy, state, bot_id=str(ECHO.id), bot_name="echo")
    for guard, user in ((parrot, PARROT), (echo, ECHO)):
        guard.decisions = []
        await stack.enter_async_context(guard)
        await stack.enter_async_context(running_bot(fake, user, guard))
    return parrot, echo


def decided(*guards: RecordingGuard) -> int:
    return sum(len(guard.decisions) for guard in guards)


def posted(fake: DiscordFake) -> list[str]:
    return [message.content for message in fake.sent]


async def test_issue15_discord_ping_pong_stops_at_the_budget_with_one_notice(
    fake: DiscordFake, tmp_path: Path
) -> None:
    async with AsyncExitStack() as stack:
        parrot, echo = await start_pair(stack, fake, f"sqlite:///{tmp_path / 'd.db'}")
        fake.message(CHANNEL, ECHO, "hello parrot")
        await wait_for(lambda: decided(parrot, echo) == 6)
        await wait_for(lambda: len(fake.sent) == 5)
    notices = [text for text in posted(fake) if text.startswith("Loop guard:")]
    assert len(notices) == 1
    assert sorted(d.reason for d in parrot.decisions + echo.decisions) == [
        "budget_exceeded",
        "cooldown",
        "ok",
        "ok",
        "ok",
        "ok",
    ]


async def test_issue15_discord_human_resets_turns_and_no_reply_is_never_posted(
    fake: DiscordFake, tmp_path: Path
) -> None:
    policy = {"bot_loop": {"max_events_per_window": 100, "max_consecutive_bot_turns": 2}}
    async with AsyncExitStack() as stack:
        parrot, echo = await start_pair(stack, fake, f"sqlite:///{tmp_path / 'h.db'}", policy)
        fake.message(CHANNEL, ECHO, "hello parrot")
        await wait_for(lambda: decided(parrot, echo) == 3)
        assert len(fake.sent) == 2
        fake.message(CHANNEL, ALICE, "!hush")
        fake.message(CHANNEL, ALICE, "go on")
        # `!hush` is answered NO_REPLY by both (not posted); "go on" resets the count,
        # both answer it, each answer is answered once, and the next are over the cap.
        await wait_for(lambda: len(fake.sent) == 6)
        await wait_for(lambda: decided(parrot, echo) == 11)
    assert all("NO_REPLY" not in text for text in posted(fake))
    caps = [d for d in parrot.decisions + echo.decisions if d.reason == "bot_turn_cap"]
    assert len(caps) == 3
