"""The Matrix end-to-end tests' world on a real Synapse: users, a room, the config, waits.

A room is made by its admin (alice), joined by a stranger (mallory) and the hosted bots'
users; the config is the shared end-to-end config (`write_e2e_config`) with one matrix bot
`mx<n>` per bot user. Every wait is a bounded poll of the room's history, never a fixed
sleep.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tests.connectors.connector_helpers import WAIT_SECONDS, write_e2e_config
from tests.fakes.synapse_server import SynapseClient, SynapseServer

Bodies = list[tuple[str, str]]
"""(sender, body) of a room's messages, oldest first."""

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


def unique(name: str) -> str:
    """A username no other test of the session uses."""
    return f"issue23-{name}-{secrets.token_hex(3)}-{next(_names)}"


async def new_user(synapse: SynapseClient, name: str, *, admin: bool = False) -> User:
    """A registered user named after `name`."""
    return User(*await synapse.register(unique(name), admin=admin))


async def new_room(synapse: SynapseClient, bots: int) -> Room:
    """A room alice made, joined by mallory and `bots` bot users."""
    alice = await new_user(synapse, "alice", admin=True)
    mallory = await new_user(synapse, "mallory")
    hosted = tuple([await new_user(synapse, f"bot{n}") for n in range(bots)])
    members = (mallory, *hosted)
    room = await synapse.create_room(alice.token, invite=[m.user_id for m in members])
    for member in members:
        await synapse.join(member.token, room)
    return Room(room, alice, mallory, hosted)


def write_config(
    tmp_path: Path, server: SynapseServer, room: Room, *, state: str = "", extra: str = ""
) -> Path:
    """The config of bots `mx0`, `mx1`… for the room's bot users, alice the admin.

    `state` replaces the memory state line (e.g. `sqlite_state`), `extra` is more
    top-level YAML (e.g. `channels:`).
    """
    bots = "".join(
        BOT.format(id=f"mx{n}", homeserver=server.base_url, user_id=b.user_id, token=b.token)
        for n, b in enumerate(room.bots)
    )
    path = write_e2e_config(
        tmp_path, platform="matrix", admin=room.alice.user_id, bots=bots, extra=extra
    )
    if state:
        path.write_text(path.read_text().replace("state: {backend: memory}", state))
    return path


def sqlite_state(tmp_path: Path) -> str:
    """The config line of a sqlite state in `tmp_path` (kept across restarts)."""
    return f"state: {{backend: sqlite, path: {tmp_path / 'state.db'}}}"


async def messages_of(synapse: SynapseClient, room: Room) -> Bodies:
    """(sender, body) of every message of the room, oldest first."""
    events = await synapse.messages(room.alice.token, room.room_id)
    return [(e["sender"], e["content"].get("body", "")) for e in events]


async def until(
    synapse: SynapseClient,
    room: Room,
    done: Callable[[Bodies], bool],
    limit: float = WAIT_SECONDS,
) -> Bodies:
    """Poll the room until `done` holds for its messages; those messages."""
    async with asyncio.timeout(limit):
        while True:
            seen = await messages_of(synapse, room)
            if done(seen):
                return seen
            await asyncio.sleep(0.05)


def count(seen: Bodies, body: str) -> int:
    """How many messages read `body`."""
    return sum(text == body for _, text in seen)


async def say(synapse: SynapseClient, room: Room, who: User, text: str) -> str:
    """`who` writes `text` in the room (`m.text`); its event id."""
    return await synapse.send_text(who.token, room.room_id, text)


def posted_by(seen: Bodies, bot: str) -> list[str]:
    """The bodies `bot` posted, oldest first."""
    return [t for s, t in seen if s == bot]


def answered(bot: str, texts: tuple[str, ...]) -> Callable[[Bodies], bool]:
    """A `done` for `until`: `bot` echoed each of `texts`."""
    return lambda seen: all((bot, f"echo: {t}") in seen for t in texts)
