"""Issue 20: what the web room keeps per room name, and what a reclaimed room leaves behind.

Through the real aiohttp server: the hub alone with recording bots, and the demo gateway
(its six bots, the pipeline and a real state store: memory, sqlite or redis).
"""

from __future__ import annotations

import asyncio
import itertools
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from pydantic import SecretStr

from connectors.room import RoomConnector, create
from connectors.room import hub as hub_module
from connectors.room.hub import (
    HISTORY_BYTES,
    MAX_JOINS,
    MAX_ROOMS,
    ROOM_HUB,
    RoomHub,
)
from gateway.app.connector import ConnectorServices
from gateway.app.runtime import Gateway
from gateway.app.types import InboundMessage
from gateway.config import Config, HttpConfig, RoomBotConfig, StateConfig
from gateway.demo.room import demo_config
from gateway.state.memory import MemoryStateStore
from tests.connectors.connector_helpers import wait_for
from tests.connectors.room.room_helpers import (
    WAIT_SECONDS,
    demo_gateway,
    from_sender,
    join,
    next_event,
    say,
)

BIG = "\U0001f600" * 4_000
"""A 16 KB message: 4,000 emoji, the most the room takes (4,000 characters)."""
TOKEN = "adm-reclaim-7c1d9e"
_prefixes = itertools.count()


def big(tag: str) -> str:
    """A 16 KB message of its own."""
    return BIG[: -len(tag)] + tag


# The hub alone, with two bots whose sinks the test controls


@dataclass
class GatedSink:
    """A pipeline stand-in that records what it is handed; holds each turn until opened."""

    seen: list[InboundMessage] = field(default_factory=list)
    gate: asyncio.Event = field(default_factory=asyncio.Event)

    async def __call__(self, message: InboundMessage) -> None:
        self.seen.append(message)
        await self.gate.wait()


@dataclass
class Room:
    """A served hub whose reclaimed rooms are recorded as forgotten, with two seated bots."""

    client: TestClient[web.Request, web.Application]
    hub: RoomHub
    bots: list[RoomConnector]
    sinks: list[GatedSink]
    forgotten: list[str]


@pytest.fixture
async def room() -> AsyncIterator[Room]:
    forgotten: list[str] = []

    async def forget(room_key: str) -> int:
        forgotten.append(room_key)
        return 0

    app = web.Application()
    services = ConnectorServices(http=app, forget_room=forget)
    bots = [
        create(RoomBotConfig(id=name, platform="room", agent="a"), services)
        for name in ("ping", "pong")
    ]
    sinks = [GatedSink(), GatedSink()]
    for bot, sink in zip(bots, sinks, strict=True):
        sink.gate.set()
        await bot.start(sink)
    async with TestClient(TestServer(app)) as client:
        yield Room(client, app[ROOM_HUB], bots, sinks, forgotten)
    for sink in sinks:
        sink.gate.set()
    for bot in bots:
        await bot.aclose()


async def test_issue20_a_rooms_history_is_bounded_in_bytes_keeping_the_newest(
    room: Room, monkeypatch: pytest.MonkeyPatch
) -> None:
    for index in range(40):  # 640 KB posted, 500 messages would be allowed
        room.hub.say("side", "mallory", big(f"m{index}"))
    kept = room.hub.history("side")
    assert room.hub.history_bytes("side") <= HISTORY_BYTES
    each = sys.getsizeof(big("m0")) + sys.getsizeof("mallory")
    assert len(kept) == HISTORY_BYTES // each == 16
    assert kept[-1].text == big("m39")
    response = await room.client.get("/room/history", params={"room": "side"})
    messages = (await response.json())["messages"]
    assert [m["text"] for m in messages] == [m.text for m in kept]
    # A message alone larger than the bound is still kept (the newest always is).
    monkeypatch.setattr(hub_module, "HISTORY_BYTES", 1_000)
    room.hub.say("side", "mallory", big("last"))
    assert [m.text for m in room.hub.history("side")] == [big("last")]
    assert room.hub.history_bytes("side") > 1_000


async def test_issue20_a_reclaimed_room_is_forgotten_after_every_bot_handled_its_messages(
    room: Room, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hub_module, "MAX_ROOMS", 1)
    slow = room.sinks[1]
    slow.gate.clear()  # pong holds its turn: what was posted in "side" is not handled yet
    async with room.client.ws_connect("/room/ws") as alice:
        await join(alice, "alice", room="side")
        await say(alice, "hello")
        await next_event(alice, "message")
        await wait_for(lambda: bool(slow.seen))
        await join(alice, "alice", room="other")  # "side" is reclaimed
        assert "side" not in room.hub.rooms()
        await asyncio.sleep(0.05)  # a chance to forget too early, which must not be taken
        assert room.forgotten == []
        assert room.hub.forgetting
        slow.gate.set()
        await wait_for(lambda: not room.hub.forgetting)
        assert room.forgotten == ["room:side"]
        # The room left for another is reclaimed (and forgotten) in the next round.
        await join(alice, "alice", room="third")
        await wait_for(lambda: room.forgotten == ["room:side", "room:other"])


async def test_issue20_a_closed_bot_never_holds_a_forget_back(room: Room) -> None:
    room.sinks[0].gate.clear()
    room.hub.say("side", "mallory", "queued behind a held turn")
    room.hub.say("side", "mallory", "and another")
    await wait_for(lambda: bool(room.sinks[0].seen))
    waited: list[str] = []
    room.bots[0].after_handled(lambda: waited.append("ping"))
    assert waited == []
    await room.bots[0].aclose()
    assert waited == ["ping"]


# The demo gateway: six bots, the pipeline, a real state store


def with_state(state: StateConfig) -> Config:
    """The demo's config on a free port, no reply delay, an admin token and `state`."""
    config = demo_config(port=0, delay=0)
    http = HttpConfig(host="127.0.0.1", port=0, admin_token=SecretStr(TOKEN))
    return config.model_copy(update={"state": state, "http": http})


@pytest.fixture(params=["memory", "sqlite", "redis"])
def state_config(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StateConfig]:
    """Each backend, fresh."""
    if request.param == "memory":
        yield StateConfig()
    elif request.param == "sqlite":
        yield StateConfig(backend="sqlite", path=str(tmp_path / "state.sqlite3"))
    else:
        url = request.getfixturevalue("redis_url")
        prefix = f"reclaim{next(_prefixes)}:"
        yield StateConfig(backend="redis", url=SecretStr(url), key_prefix=prefix)


def seated(gateway: Gateway) -> list[RoomConnector]:
    """The gateway's room bots."""
    bots = [hosted.connector for hosted in gateway.hosted.values()]
    return [bot for bot in bots if isinstance(bot, RoomConnector)]


async def handled(gateway: Gateway) -> None:
    """Wait (bounded) until every room bot has handled what it was handed, and forgets ran."""
    loop = asyncio.get_running_loop()
    waits = []
    for bot in seated(gateway):
        done: asyncio.Future[None] = loop.create_future()
        bot.after_handled(partial(done.set_result, None))
        waits.append(done)
    async with asyncio.timeout(WAIT_SECONDS):
        await asyncio.gather(*waits)
    hub = gateway.app[ROOM_HUB]
    await wait_for(lambda: not hub.forgetting)


@asynccontextmanager
async def connection(gateway: Gateway) -> AsyncIterator[aiohttp.ClientWebSocketResponse]:
    """A websocket to the gateway's room."""
    async with (
        aiohttp.ClientSession() as session,
        session.ws_connect(f"http://127.0.0.1:{gateway.port}/room/ws") as ws,
    ):
        yield ws


async def say_and_see(ws: aiohttp.ClientWebSocketResponse, text: str) -> None:
    """Post as mallory and wait for the room to echo it (so it is in every bot's queue)."""
    await say(ws, text)
    await next_event(ws, "message", from_sender("mallory", text))


async def forget(gateway: Gateway, room: str) -> str:
    """`POST /admin/forget` of a room: the answer's text."""
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"http://127.0.0.1:{gateway.port}/admin/forget",
            json={"room": room},
            headers={"Authorization": f"Bearer {TOKEN}"},
        ) as response,
    ):
        assert response.status == 200
        return str((await response.json())["result"])


async def test_issue20_a_reclaimed_web_room_leaves_nothing_to_forget(
    state_config: StateConfig,
) -> None:
    async with demo_gateway(with_state(state_config)) as gateway:
        async with connection(gateway) as ws:
            await join(ws, "mallory", room="doomed")
            for tag in ("a", "b"):
                await say_and_see(ws, big(tag))
            await handled(gateway)
            assert len((await gateway.state.transcript_recent("room:doomed", 10)).entries) == 2
            for index in range(MAX_JOINS - 1):  # rooms left behind, each empty
                await join(ws, "mallory", room=f"r{index}")
        async with connection(gateway) as ws:
            for index in range(MAX_JOINS - 1, MAX_ROOMS):  # r63 is the 65th: a reclaim
                await join(ws, "mallory", room=f"r{index}")
            await say_and_see(ws, "kept")
            await handled(gateway)
            assert "doomed" not in gateway.app[ROOM_HUB].rooms()
            assert (await gateway.state.transcript_recent("room:doomed", 10)).entries == ()
            assert "(0 messages)" in await forget(gateway, "room:doomed")
            kept = await gateway.state.transcript_recent(f"room:r{MAX_ROOMS - 1}", 10)
            assert [entry.text for entry in kept.entries] == ["kept"]


async def test_issue20_1500_web_room_names_with_two_16_kb_messages_hold_at_most_the_budget() -> (
    None
):
    budget = 1024 * 1024  # 64 such messages: the budget, not the reclaims, is what binds
    names = [f"r{index}" for index in range(1_500)]
    async with demo_gateway(with_state(StateConfig(max_transcript_bytes=budget))) as gateway:
        store = gateway.state
        assert isinstance(store, MemoryStateStore)
        hub = gateway.app[ROOM_HUB]
        peak = 0
        for start in range(0, len(names), MAX_JOINS):
            async with connection(gateway) as ws:
                for name in names[start : start + MAX_JOINS]:
                    await join(ws, "mallory", room=name)
                    for tag in ("a", "b"):
                        await say_and_see(ws, big(f"{name}{tag}"))
                    peak = max(peak, store.transcript_bytes)
                    assert len(hub.rooms()) <= MAX_ROOMS + 1
                    assert all(hub.history_bytes(room) <= HISTORY_BYTES for room in hub.rooms())
        await handled(gateway)
        assert peak <= budget
        assert store.transcript_bytes <= budget
        remembered = [
            name for name in names if (await store.transcript_recent(f"room:{name}", 1)).entries
        ]
        # Only rooms the hub still holds are remembered; the newest is, whole.
        assert set(remembered) <= set(hub.rooms())
        last = await store.transcript_recent("room:r1499", 10)
        assert [entry.text for entry in last.entries] == [big("r1499a"), big("r1499b")]
