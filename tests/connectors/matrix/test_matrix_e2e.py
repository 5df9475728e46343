"""End to end on a real Synapse: a YAML config in, the real runtime and matrix-nio, the room out.

The gateway is built as `loopwarden run` builds it (`load_config` of a file, then
`Gateway`); people and outside bots are Synapse users driven by `SynapseClient`. Every wait
is a bounded poll of the room's history, never a fixed sleep.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import pytest

from gateway.app.messages import REFUSAL
from tests.connectors.connector_helpers import BUDGET, NOTICE, WAIT_SECONDS, running
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
