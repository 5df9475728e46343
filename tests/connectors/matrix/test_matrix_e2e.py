"""End to end on a real Synapse: a YAML config in, the real runtime and matrix-nio, the room out.

The gateway is built as `loopwarden run` builds it (`load_config` of a file, then
`Gateway`); people and outside bots are Synapse users driven by `SynapseClient`. Every wait
is a bounded poll of the room's history, never a fixed sleep.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import AsyncExitStack, closing
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.app.messages import REFUSAL
from tests.connectors.connector_helpers import (
    BUDGET,
    NOTICE,
    WAIT_SECONDS,
    GatewayProcess,
    gateway_process,
    running,
)
from tests.connectors.connector_helpers import write_e2e_config as _write_e2e_config
from tests.fakes.synapse_server import (
    RateLimit,
    SynapseClient,
    SynapseServer,
    running_synapse,
)

_names = itertools.count(1)
BOT = """  - id: {id}
    platform: matrix
    homeserver: "{homeserver}"
    user_id: "{user_id}"
    access_token: "{token}"
    agent: parrot
    sync_timeout: 2
"""


@dataclass(frozen=True, slots=True)
class User:
    """A Synapse user of one test: id and access token."""

    user_id: str
    token: str


@dataclass(frozen=True, slots=True)
class Room:
    """A room of one test: its id, its admin (alice), a stranger, and the hosted bots."""

    room_id: str
    alice: User
    mallory: User
    bots: tuple[User, ...]


def _unique(name: str) -> str:
    return f"issue23-{name}-{secrets.token_hex(3)}-{next(_names)}"


async def _user(synapse: SynapseClient, name: str, *, admin: bool = False) -> User:
    return User(*await synapse.register(_unique(name), admin=admin))


async def _room(synapse: SynapseClient, bots: int) -> Room:
    """A room alice made, joined by mallory and `bots` bot users."""
    alice = await _user(synapse, "alice", admin=True)
    mallory = await _user(synapse, "mallory")
    hosted = tuple([await _user(synapse, f"bot{n}") for n in range(bots)])
    members = (mallory, *hosted)
    room = await synapse.create_room(alice.token, invite=[m.user_id for m in members])
    for member in members:
        await synapse.join(member.token, room)
    return Room(room, alice, mallory, hosted)


def _config(tmp_path: Path, server: SynapseServer, room: Room, *, state: str = "") -> Path:
    bots = "".join(
        BOT.format(id=f"mx{n}", homeserver=server.base_url, user_id=b.user_id, token=b.token)
        for n, b in enumerate(room.bots)
    )
    path = _write_e2e_config(tmp_path, platform="matrix", admin=room.alice.user_id, bots=bots)
    if state:
        path.write_text(path.read_text().replace("state: {backend: memory}", state))
    return path


async def _bodies(synapse: SynapseClient, room: Room) -> list[tuple[str, str]]:
    """(sender, body) of every message of the room, oldest first."""
    events = await synapse.messages(room.alice.token, room.room_id)
    return [(e["sender"], e["content"].get("body", "")) for e in events]


async def _until(
    synapse: SynapseClient,
    room: Room,
    done: Callable[[list[tuple[str, str]]], bool],
    limit: float = WAIT_SECONDS,
) -> list[tuple[str, str]]:
    """Poll the room until `done` holds for its messages; those messages."""
    async with asyncio.timeout(limit):
        while True:
            bodies = await _bodies(synapse, room)
            if done(bodies):
                return bodies
            await asyncio.sleep(0.05)


def _count(bodies: list[tuple[str, str]], body: str) -> int:
    return sum(text == body for _, text in bodies)


async def _say(synapse: SynapseClient, room: Room, who: User, text: str) -> None:
    await synapse.send_text(who.token, room.room_id, text)


async def test_issue23_two_hosted_bots_ping_pong_is_cut_at_the_pair_budget(
    tmp_path: Path, synapse_server: SynapseServer, synapse: SynapseClient
) -> None:
    room = await _room(synapse, bots=2)
    async with running(_config(tmp_path, synapse_server, room)):
        await _say(synapse, room, room.alice, "hi bots")
        await _until(synapse, room, lambda b: any(t.startswith(NOTICE) for _, t in b))
        await _say(synapse, room, room.alice, "still there?")
        bodies = await _until(synapse, room, lambda b: _count(b, "echo: still there?") == 2)

    bot_to_bot = [t for _, t in bodies if t.startswith("echo: echo:")]
    assert len(bot_to_bot) == BUDGET
    assert sum(t.startswith(NOTICE) for _, t in bodies) == 1
    assert {s for s, t in bodies if t == "echo: hi bots"} == {b.user_id for b in room.bots}
    events = await synapse.messages(room.alice.token, room.room_id)
    replies = [e for e in events if e["sender"] != room.alice.user_id]
    assert {e["content"]["msgtype"] for e in replies} == {"m.notice"}


async def test_issue23_no_reply_is_never_posted(
    tmp_path: Path, synapse_server: SynapseServer, synapse: SynapseClient
) -> None:
    room = await _room(synapse, bots=1)
    async with running(_config(tmp_path, synapse_server, room)):
        await _say(synapse, room, room.alice, "quiet please")
        await _say(synapse, room, room.alice, "after the silence")
        bodies = await _until(synapse, room, lambda b: _count(b, "echo: after the silence") == 1)

    assert [t for s, t in bodies if s == room.bots[0].user_id] == ["echo: after the silence"]
    assert all("NO_REPLY" not in t for _, t in bodies)


async def test_issue23_loop_reset_by_an_admin_works_and_by_anyone_else_is_refused(
    tmp_path: Path, synapse_server: SynapseServer, synapse: SynapseClient
) -> None:
    room = await _room(synapse, bots=1)
    bot = room.bots[0].user_id
    async with running(_config(tmp_path, synapse_server, room)):
        await _say(synapse, room, room.mallory, "/loop reset")
        await _until(synapse, room, lambda b: (bot, REFUSAL) in b)
        await _say(synapse, room, room.alice, "/loop reset")
        bodies = await _until(
            synapse,
            room,
            lambda b: any(s == bot and "reset" in t.lower() and t != REFUSAL for s, t in b),
        )

    from_bot = [t for s, t in bodies if s == bot]
    assert from_bot.count(REFUSAL) == 1
    assert len(from_bot) == 2
    assert not any(t.startswith("echo: /loop") for t in from_bot)


async def test_issue23_a_restart_answers_nothing_twice_and_nothing_before_the_first_sync(
    tmp_path: Path, synapse_server: SynapseServer, synapse: SynapseClient
) -> None:
    room = await _room(synapse, bots=1)
    bot = room.bots[0].user_id
    state = f"state: {{backend: sqlite, path: {tmp_path / 'state.db'}}}"
    config = _config(tmp_path, synapse_server, room, state=state)
    await _say(synapse, room, room.alice, "before the first sync")
    async with running(config):
        await _say(synapse, room, room.alice, "one")
        await _until(synapse, room, lambda b: (bot, "echo: one") in b)
    await _say(synapse, room, room.alice, "while down")
    async with running(config):
        await _say(synapse, room, room.alice, "two")
        bodies = await _until(synapse, room, lambda b: (bot, "echo: two") in b)

    assert [t for s, t in bodies if s == bot] == ["echo: one", "echo: while down", "echo: two"]


@pytest.fixture(scope="module")
def slow_synapse(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SynapseServer]:
    """A Synapse whose message limit a busy bot meets: 2 at once, then one a second."""
    slow = RateLimit(per_second=1.0, burst_count=2)
    with running_synapse(tmp_path_factory.mktemp("slow-synapse"), rc_message=slow) as server:
        yield server


async def _unlimited(client: SynapseClient, admin: User) -> None:
    """Lift the message rate limit of `admin` (the people of the test), as an admin may."""
    path = f"/_synapse/admin/v1/users/{quote(admin.user_id, safe='')}/override_ratelimit"
    await client.request(
        "POST", path, token=admin.token, body={"messages_per_second": 0, "burst_count": 0}
    )


async def test_issue23_m_limit_exceeded_is_waited_out_and_each_reply_posted_once(
    tmp_path: Path, slow_synapse: SynapseServer
) -> None:
    async with SynapseClient(slow_synapse) as client:
        room = await _room(client, bots=1)
        await _unlimited(client, room.alice)
        bot = room.bots[0].user_id
        async with running(_config(tmp_path, slow_synapse, room)) as gateway:
            for n in range(4):
                await _say(client, room, room.alice, f"flood {n}")
            bodies = await _until(client, room, lambda b: (bot, "echo: flood 3") in b)
            retries = gateway.metrics.value("delivery_retries_total", platform="matrix")

    assert [t for s, t in bodies if s == bot] == [f"echo: flood {n}" for n in range(4)]
    assert retries >= 1


BURST = tuple(f"burst {n}" for n in range(4))
"""Human messages sent at once; with their replies they stay inside a sync's timeline limit."""


def _sqlite(tmp_path: Path) -> str:
    return f"state: {{backend: sqlite, path: {tmp_path / 'state.db'}}}"


def _replies(bodies: list[tuple[str, str]], bot: str) -> list[str]:
    return [t for s, t in bodies if s == bot]


def _answered(bot: str, texts: tuple[str, ...]) -> Callable[[list[tuple[str, str]]], bool]:
    return lambda bodies: all((bot, f"echo: {t}") in bodies for t in texts)


async def _started(config: Path, stack: AsyncExitStack) -> GatewayProcess:
    gateway = await stack.enter_async_context(gateway_process(config))
    await gateway.ready()
    return gateway


async def test_issue23_sigkill_mid_stream_then_a_restart_answers_each_message_once(
    tmp_path: Path, synapse_server: SynapseServer, synapse: SynapseClient
) -> None:
    room = await _room(synapse, bots=1)
    bot = room.bots[0].user_id
    config = _config(tmp_path, synapse_server, room, state=_sqlite(tmp_path))
    config.write_text(config.read_text().replace("delay: 0.0", "delay: 0.3"))
    async with AsyncExitStack() as stack:
        first = await _started(config, stack)
        await _say(synapse, room, room.alice, "warm up")
        await _until(synapse, room, _answered(bot, ("warm up",)))
        for text in BURST:
            await _say(synapse, room, room.alice, text)
        await _until(synapse, room, _answered(bot, BURST[:1]))
        await first.kill()
    async with AsyncExitStack() as stack:
        await _started(config, stack)
        await _say(synapse, room, room.alice, "after")
        bodies = await _until(synapse, room, _answered(bot, (*BURST, "after")))

    assert _replies(bodies, bot) == [f"echo: {t}" for t in ("warm up", *BURST, "after")]


def _rewind(database: Path, cursor: str, keys: list[str]) -> None:
    """Put back what a SIGKILL between a reply's send and its confirmation leaves in sqlite.

    The sync position from before the burst, and each burst receipt in flight (owner a
    dead run): the restart syncs the burst again and its pipeline answers every message.
    """
    with closing(sqlite3.connect(database)) as db, db:
        db.execute("UPDATE cursors SET value = ?", (cursor,))
        for key in keys:
            db.execute("UPDATE receipts SET confirmed = 0, owner = 'killed' WHERE key = ?", (key,))


def _cursor(database: Path) -> str:
    with closing(sqlite3.connect(database)) as db:
        (value,) = db.execute("SELECT value FROM cursors").fetchone()
        return str(value)


async def test_issue23_a_reply_sent_before_a_sigkill_is_not_posted_again_after_the_restart(
    tmp_path: Path, synapse_server: SynapseServer, synapse: SynapseClient
) -> None:
    room = await _room(synapse, bots=1)
    bot = room.bots[0].user_id
    database = tmp_path / "state.db"
    config = _config(tmp_path, synapse_server, room, state=_sqlite(tmp_path))
    async with AsyncExitStack() as stack:
        first = await _started(config, stack)
        await _say(synapse, room, room.alice, "warm up")
        await _until(synapse, room, _answered(bot, ("warm up",)))
        before = _cursor(database)
        events = [await synapse.send_text(room.alice.token, room.room_id, text) for text in BURST]
        await _until(synapse, room, _answered(bot, BURST))
        await first.kill()
    _rewind(database, before, [f"dedupe:matrix:mx0:matrix:{room.room_id}:{e}" for e in events])
    async with AsyncExitStack() as stack:
        second = await _started(config, stack)
        await _say(synapse, room, room.alice, "after")
        bodies = await _until(synapse, room, _answered(bot, ("after",)))
        sent = await _replies_out(await second.ready())

    assert _replies(bodies, bot) == [f"echo: {t}" for t in ("warm up", *BURST, "after")]
    assert sent == len(BURST) + 1  # the burst was answered again: the homeserver kept one each


async def _replies_out(port: int) -> float:
    """`replies_out_total` of the platform matrix, as the gateway's `/metrics` serves it."""
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://127.0.0.1:{port}/metrics") as response,
    ):
        text = await response.text()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "replies_out_total" and sample.labels.get("platform") == "matrix"
    )


async def test_issue23_more_messages_while_down_than_synapse_syncs_by_default_are_all_answered(
    tmp_path: Path, synapse_server: SynapseServer, synapse: SynapseClient
) -> None:
    room = await _room(synapse, bots=1)
    bot = room.bots[0].user_id
    config = _config(tmp_path, synapse_server, room, state=_sqlite(tmp_path))
    async with running(config):
        await _say(synapse, room, room.alice, "warm up")
        await _until(synapse, room, _answered(bot, ("warm up",)))
    missed = tuple(f"while down {n}" for n in range(15))  # Synapse's default timeline is 10
    for text in missed:
        await _say(synapse, room, room.alice, text)
    async with running(config):
        bodies = await _until(synapse, room, _answered(bot, missed))

    assert _replies(bodies, bot) == [f"echo: {t}" for t in ("warm up", *missed)]
