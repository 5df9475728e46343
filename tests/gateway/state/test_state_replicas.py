"""Two `loopwarden run` processes, one Redis: one room's budget, notice and reset are shared.

Each process hosts a different bot of the same Discord channel (the fake Discord runs in
the test process and speaks to both over loopback). Both bots echo everything, so one
human message starts a ping-pong between them. Each bot records the exchanges it receives,
in its own process: only a shared state makes the pair's budget one budget. With `redis`
the ping-pong is cut at the budget of a single process, the cooldown is announced once and
an admin's `/loop reset` is acknowledged once and frees the pair for both bots; with
`memory` the same two processes let twice the budget through and repeat the notice and the
acknowledgement, which shows the test measures sharing.

Every wait is a bounded poll on a condition. Counting is made exact without waiting for
quiet: once the pair's cooldown is seen in the shared state, a human "marker" is posted,
and each bot handles a channel's messages in order, so when both have answered the
marker, every exchange admitted before the cooldown has been answered too.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from gateway.state.redis import RedisStateStore
from tests.fakes.discord_server import DiscordFake, FakeUser
from tests.fakes.redis_server import RedisServer
from tests.gateway.state.hammer import ROOT

TOKEN_A = "MTAwMDAwMDAwMDAwOTEwMDAx.GrepA1.replica-one-secret-token-value"
TOKEN_B = "MTAwMDAwMDAwMDAwOTEwMDAy.GrepB2.replica-two-secret-token-value"
PARROT = FakeUser(910001, "Parrot", bot=True)
ECHO = FakeUser(910002, "Echo", bot=True)
ALICE = FakeUser(510001, "alice")  # the admin
GUILD, CHANNEL = 110, 210
ROOM = f"discord:{CHANNEL}"
BUDGET = 4
NOTICE = "Loop guard: pausing"
RESET_ACK = "Loop guard reset"
ECHO_PREFIX = "echo: "
HUMAN = frozenset({"hi bots", "marker one", "marker two"})
WAIT_SECONDS = 30.0
"""A bound on every wait, so a broken run fails instead of hanging; never a pass condition."""

CONFIG = """
state: {state}
http: {{host: 127.0.0.1, port: 0}}
agents:
  parrot: {{kind: scripted, default: "echo: {{text}}"}}
bots:
  - id: {bot_id}
    platform: discord
    token: "{token}"
    agent: parrot
    api_base_url: "{base_url}"
    gateway_url: "{gateway_url}"
admins: {{discord: ["{admin}"]}}
policy:
  bot_loop: {{max_events_per_window: {budget}, window_seconds: 600, cooldown_seconds: 600}}
"""


@pytest.fixture
async def fake() -> AsyncIterator[DiscordFake]:
    """A Discord guild with one channel, alice and the two bots."""
    async with DiscordFake() as server:
        world = server.world
        world.add_bot(TOKEN_A, PARROT)
        world.add_bot(TOKEN_B, ECHO)
        world.add_guild(GUILD, "Lounge", [ALICE, PARROT, ECHO])
        world.add_channel(GUILD, CHANNEL, "general")
        yield server


async def wait_for(predicate: Callable[[], bool] | Callable[[], Awaitable[bool]]) -> None:
    """Poll a condition (sync or async), bounded."""
    async with asyncio.timeout(WAIT_SECONDS):
        while True:
            result = predicate()
            if await result if isinstance(result, Awaitable) else result:
                return
            await asyncio.sleep(0.02)


@asynccontextmanager
async def replicas(tmp_path: Path, fake: DiscordFake, state: str) -> AsyncIterator[None]:
    """Two `python -m gateway run` processes, one bot each, connected to the fake."""
    processes = []
    for bot_id, token in (("parrot-dc", TOKEN_A), ("echo-dc", TOKEN_B)):
        config = tmp_path / f"{bot_id}.yaml"
        config.write_text(
            CONFIG.format(
                state=state,
                bot_id=bot_id,
                token=token,
                base_url=fake.base_url,
                gateway_url=fake.gateway_url,
                admin=ALICE.id,
                budget=BUDGET,
            ),
            encoding="utf-8",
        )
        with (tmp_path / f"{bot_id}.log").open("ab") as log:
            processes.append(
                await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "gateway",
                    "run",
                    "--config",
                    str(config),
                    cwd=ROOT,
                    stdout=log,
                    stderr=log,
                )
            )
    try:
        await wait_for(lambda: fake.connected(TOKEN_A) and fake.connected(TOKEN_B))
        yield
    finally:
        for process in processes:
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(WAIT_SECONDS):
            codes = [await process.wait() for process in processes]
    assert codes == [0, 0], f"a gateway failed to stop cleanly; its log is in {tmp_path}"


def posted(fake: DiscordFake, since: int = 0) -> list[tuple[int, str]]:
    """(author, text) of what the bots posted, from index `since` on."""
    return [(m.author_id, m.content) for m in fake.sent[since:]]


def bot_to_bot(fake: DiscordFake, since: int = 0) -> list[tuple[int, str]]:
    """Answers a bot gave to the other bot's message: echoes of anything a human did not say."""
    return [
        (a, t)
        for a, t in posted(fake, since)
        if t.startswith(ECHO_PREFIX) and t[len(ECHO_PREFIX) :] not in HUMAN
    ]


def notices(fake: DiscordFake) -> list[tuple[int, str]]:
    """Cooldown notices posted."""
    return [(a, t) for a, t in posted(fake) if t.startswith(NOTICE)]


def acks(fake: DiscordFake) -> list[tuple[int, str]]:
    """Acknowledgements of `/loop reset`."""
    return [(a, t) for a, t in posted(fake) if t.startswith(RESET_ACK)]


async def settle(fake: DiscordFake, word: str) -> None:
    """Post a human marker and wait until both bots answered it (see the module docstring)."""
    fake.message(CHANNEL, ALICE, word)
    await wait_for(
        lambda: (
            sorted(a for a, t in posted(fake) if t == ECHO_PREFIX + word) == [PARROT.id, ECHO.id]
        )
    )


@pytest.mark.redis
async def test_two_replicas_on_redis_share_the_budget_the_notice_and_the_reset(
    tmp_path: Path, fake: DiscordFake, redis: RedisServer
) -> None:
    state = RedisStateStore(redis.url, key_prefix="replicas:")
    await state.start()

    async def cooling() -> bool:
        return any(s.cooldown_remaining > 0 for s in await state.pair_snapshot(ROOM))

    try:
        async with replicas(
            tmp_path, fake, f"{{backend: redis, url: '{redis.url}', key_prefix: 'replicas:'}}"
        ):
            fake.message(CHANNEL, ALICE, "hi bots")
            await wait_for(cooling)
            await settle(fake, "marker one")
            assert len(bot_to_bot(fake)) == BUDGET
            assert {a for a, _ in bot_to_bot(fake)} == {PARROT.id, ECHO.id}
            assert len(notices(fake)) == 1

            # Both bots see the command; one executes and acknowledges it. The other bot
            # echoes the acknowledgement, and the freed pair ping-pongs up to the budget again.
            before = len(fake.sent)
            fake.message(CHANNEL, ALICE, "/loop reset")
            await wait_for(lambda: bool(acks(fake)))
            await wait_for(cooling)
            await settle(fake, "marker two")
            assert len(acks(fake)) == 1
            resumed = bot_to_bot(fake, before)
            assert len(resumed) == BUDGET
            assert {a for a, _ in resumed} == {PARROT.id, ECHO.id}
            assert len(notices(fake)) == 2
    finally:
        await state.aclose()


async def test_two_replicas_on_memory_share_nothing(tmp_path: Path, fake: DiscordFake) -> None:
    async with replicas(tmp_path, fake, "{backend: memory}"):
        fake.message(CHANNEL, ALICE, "hi bots")
        # Each process admits the whole budget for its own bot and announces its own cooldown.
        await wait_for(lambda: len(notices(fake)) == 2)
        await settle(fake, "marker one")
        assert len(bot_to_bot(fake)) == 2 * BUDGET
        fake.message(CHANNEL, ALICE, "/loop reset")
        await wait_for(lambda: len(acks(fake)) == 2)
