"""The room hub and connector over their real websocket, without the rest of the gateway."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from connectors.room import RoomConnector, create
from connectors.room import hub as hub_module
from connectors.room.connector import RUN, RoomIdentity, to_inbound
from connectors.room.hub import (
    HISTORY_LIMIT,
    MAX_CONNECTIONS_PER_ADDRESS,
    MAX_FRAME_BYTES,
    MAX_JOINS,
    MAX_ROOMS,
    ROOM_HUB,
    RoomHub,
    RoomMessage,
)
from gateway.app.connector import ConnectorServices
from gateway.app.errors import DeliveryError
from gateway.app.types import InboundMessage, Reply
from gateway.config import RoomBotConfig
from tests.connectors.room.room_helpers import join, next_event, say


@dataclass
class Room:
    """A served app with two started room bots whose sinks fill queues."""

    client: TestClient[web.Request, web.Application]
    hub: RoomHub
    bots: dict[str, RoomConnector]
    inbox: dict[str, asyncio.Queue[InboundMessage]]


def _sink_into(queue: asyncio.Queue[InboundMessage]) -> RecordingSink:
    return RecordingSink(queue)


@dataclass
class RecordingSink:
    """A pipeline stand-in that records what it is handed."""

    queue: asyncio.Queue[InboundMessage]

    async def __call__(self, message: InboundMessage) -> None:
        self.queue.put_nowait(message)


@pytest.fixture
async def room() -> AsyncIterator[Room]:
    app = web.Application()
    services = ConnectorServices(http=app)
    bots = {
        "ping": create(RoomBotConfig(id="ping", platform="room", agent="a"), services),
        "pong": create(RoomBotConfig(id="pong", platform="room", agent="a", name="Pong"), services),
    }
    inbox: dict[str, asyncio.Queue[InboundMessage]] = {}
    for bot_id, connector in bots.items():
        inbox[bot_id] = asyncio.Queue()
        await connector.start(_sink_into(inbox[bot_id]))
    async with TestClient(TestServer(app)) as client:
        yield Room(client, app[ROOM_HUB], bots, inbox)
    for connector in bots.values():
        await connector.aclose()


async def _received(queue: asyncio.Queue[InboundMessage]) -> InboundMessage:
    async with asyncio.timeout(10):
        return await queue.get()


def test_one_hub_per_app_with_routes_registered_once() -> None:
    app = web.Application()
    hub = RoomHub.for_app(app)
    assert RoomHub.for_app(app) is hub
    paths = sorted({route.resource.canonical for route in app.router.routes() if route.resource})
    assert paths == ["/room", "/room/app.js", "/room/history", "/room/style.css", "/room/ws"]


async def test_human_message_reaches_every_client_and_every_bot(room: Room) -> None:
    async with (
        room.client.ws_connect("/room/ws") as alice,
        room.client.ws_connect("/room/ws") as bob,
    ):
        await join(alice, "alice")
        await join(bob, "bob")
        await say(alice, "hello @ping")
        for ws in (alice, bob):
            event = await next_event(ws, "message")
            assert event == {
                "type": "message",
                "id": 1,
                "room": "lobby",
                "sender_id": "alice",
                "sender_name": "alice",
                "is_bot": False,
                "system": False,
                "text": "hello @ping",
                "thread_id": None,
                "ts": event["ts"],
            }
        to_ping = await _received(room.inbox["ping"])
        to_pong = await _received(room.inbox["pong"])
    assert (to_ping.platform, to_ping.bot_id, to_ping.channel_id) == ("room", "ping", "lobby")
    assert (to_ping.sender_id, to_ping.sender_is_bot, to_ping.message_id) == (
        "alice",
        False,
        f"{RUN}.1",
    )
    assert to_ping.bot_user_id == "ping"
    assert to_ping.mentions_bot
    assert not to_pong.mentions_bot
    assert not to_ping.is_direct
    assert to_ping.thread_id is None


async def test_bot_reply_is_broadcast_and_fed_to_the_other_bots_only(room: Room) -> None:
    async with room.client.ws_connect("/room/ws") as alice:
        await join(alice, "alice")
        message_id = await room.bots["ping"].send("lobby", Reply("@Pong hi"))
        event = await next_event(alice, "message")
        assert (event["sender_id"], event["is_bot"], event["text"]) == ("ping", True, "@Pong hi")
        assert message_id == f"{RUN}.{event['id']}"
        to_pong = await _received(room.inbox["pong"])
    assert (to_pong.sender_id, to_pong.sender_is_bot, to_pong.mentions_bot) == ("ping", True, True)
    assert room.inbox["ping"].empty()


async def test_join_sends_recent_history_in_order(room: Room) -> None:
    for n in range(3):
        room.hub.say("lobby", "carol", f"line {n}")
    async with room.client.ws_connect("/room/ws") as alice:
        history = await join(alice, "alice")
    messages = history["messages"]
    assert isinstance(messages, list)
    assert [m["text"] for m in messages] == ["line 0", "line 1", "line 2"]
    assert [m["id"] for m in messages] == [1, 2, 3]


async def test_messages_keep_one_order_for_clients_and_bots(room: Room) -> None:
    async with room.client.ws_connect("/room/ws") as alice:
        await join(alice, "alice")
        for n in range(50):
            await say(alice, f"m{n}")
        seen = [(await next_event(alice, "message"))["text"] for _ in range(50)]
    assert seen == [f"m{n}" for n in range(50)]
    handed = [(await _received(room.inbox["ping"])).text for _ in range(50)]
    assert handed == seen


async def test_typing_and_notices_reach_clients(room: Room) -> None:
    async with (
        room.client.ws_connect("/room/ws") as alice,
        room.client.ws_connect("/room/ws") as bob,
    ):
        await join(alice, "alice")
        await join(bob, "bob")
        await next_event(alice, "notice", lambda e: e["text"] == "bob joined")
        await room.bots["pong"].typing("lobby", None)
        typing = await next_event(alice, "typing")
        assert (typing["sender_id"], typing["sender_name"]) == ("pong", "Pong")
        await bob.close()
        await next_event(alice, "notice", lambda e: e["text"] == "bob left")


async def test_history_endpoint_is_bounded_and_takes_a_limit(room: Room) -> None:
    for n in range(HISTORY_LIMIT + 5):
        room.hub.say("lobby", "carol", f"line {n}")
    response = await room.client.get("/room/history")
    body = await response.json()
    assert body["room"] == "lobby"
    assert len(body["messages"]) == HISTORY_LIMIT
    assert body["messages"][0]["id"] == 6
    last_two = await (await room.client.get("/room/history?room=lobby&limit=2")).json()
    assert [m["text"] for m in last_two["messages"]] == [
        f"line {HISTORY_LIMIT + 3}",
        f"line {HISTORY_LIMIT + 4}",
    ]
    empty = await (await room.client.get("/room/history?room=elsewhere")).json()
    assert empty == {"room": "elsewhere", "messages": []}
    assert (await room.client.get("/room/history?limit=x")).status == 400


async def test_rooms_are_separate(room: Room) -> None:
    async with (
        room.client.ws_connect("/room/ws") as alice,
        room.client.ws_connect("/room/ws") as bob,
    ):
        await join(alice, "alice", room="side")
        await join(bob, "bob")
        await say(alice, "only here")
        await say(bob, "only lobby")
        assert (await next_event(alice, "message"))["text"] == "only here"
        event = await next_event(bob, "message")
    assert (event["text"], event["id"], event["room"]) == ("only lobby", 1, "lobby")
    first = await _received(room.inbox["ping"])
    assert (first.channel_id, first.message_id) == ("side", f"{RUN}.1")


@pytest.mark.parametrize(
    ("frame", "error"),
    [
        ({"type": "say", "text": "hi"}, "join first"),
        ({"type": "join", "name": "ping"}, "a bot's name"),
        ({"type": "join", "name": "PONG"}, "a bot's name"),
        ({"type": "join", "name": "no spaces"}, "a name is"),
        ({"type": "join", "name": "alice", "room": "../x"}, "a room name is"),
        ({"type": "dance"}, "unknown message type"),
        (["not", "an", "object"], "JSON objects"),
    ],
)
async def test_bad_frames_get_an_error_notice(room: Room, frame: object, error: str) -> None:
    async with room.client.ws_connect("/room/ws") as ws:
        await ws.send_json(frame)
        notice = await next_event(ws, "notice")
    assert notice["level"] == "error"
    assert error in str(notice["text"])


async def test_overlong_messages_are_refused(room: Room) -> None:
    async with room.client.ws_connect("/room/ws") as alice:
        await join(alice, "alice")
        await say(alice, "x" * 4001)
        notice = await next_event(alice, "notice", lambda e: e.get("level") == "error")
        assert "4000" in str(notice["text"])
        await say(alice, "   ")
        await say(alice, "fine")
        assert (await next_event(alice, "message"))["text"] == "fine"


async def test_cross_origin_websocket_is_refused(room: Room) -> None:
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        await room.client.ws_connect("/room/ws", headers={"Origin": "http://evil.example"})
    assert refused.value.status == 403
    own = f"http://{room.client.host}:{room.client.port}"
    async with room.client.ws_connect("/room/ws", headers={"Origin": own}) as ws:
        await join(ws, "alice")


async def test_page_and_assets_are_served(room: Room) -> None:
    page = await room.client.get("/room")
    assert page.content_type == "text/html"
    html = await page.text()
    assert '<ol id="messages"' in html
    assert 'src="/room/app.js"' in html
    script = await room.client.get("/room/app.js")
    assert script.content_type == "text/javascript"
    assert "WebSocket" in await script.text()
    style = await room.client.get("/room/style.css")
    assert style.content_type == "text/css"


async def test_listeners_see_messages_and_notices(room: Room) -> None:
    seen: list[str] = []
    unsubscribe = room.hub.subscribe(lambda event: seen.append(event.text))
    room.hub.notice("lobby", "hello")
    await room.bots["ping"].send("lobby", Reply("pong?"))
    unsubscribe()
    room.hub.say("lobby", "alice", "unseen")
    assert seen == ["hello", "pong?"]


async def test_a_broken_listener_does_not_break_the_room(room: Room) -> None:
    def explode(event: object) -> None:
        raise RuntimeError("boom")

    room.hub.subscribe(explode)
    message = room.hub.say("lobby", "alice", "still posted")
    assert room.hub.history("lobby")[-1] is message


async def test_closed_connector_neither_sends_nor_receives(room: Room) -> None:
    ping = room.bots["ping"]
    assert ping.connected
    await ping.aclose()
    assert not ping.connected
    with pytest.raises(DeliveryError):
        await ping.send("lobby", Reply("late"))
    room.hub.say("lobby", "alice", "anyone?")
    assert room.inbox["ping"].empty()
    assert (await _received(room.inbox["pong"])).text == "anyone?"


async def test_messages_before_start_are_not_queued() -> None:
    app = web.Application()
    bot = create(RoomBotConfig(id="late", platform="room", agent="a"), ConnectorServices(http=app))
    assert not bot.connected
    app[ROOM_HUB].say("lobby", "alice", "too early")
    queue: asyncio.Queue[InboundMessage] = asyncio.Queue()
    await bot.start(RecordingSink(queue))
    app[ROOM_HUB].say("lobby", "alice", "on time")
    assert (await _received(queue)).text == "on time"
    assert queue.empty()
    await bot.aclose()


async def test_server_shutdown_closes_open_websockets() -> None:
    app = web.Application()
    RoomHub.for_app(app)
    server = TestServer(app)
    client = TestClient(server)
    await client.start_server()
    try:
        ws = await client.ws_connect("/room/ws")
        await join(ws, "alice")
        async with asyncio.timeout(10):
            closing = asyncio.create_task(server.close())
            frames = [frame.type async for frame in ws]
            await closing
    finally:
        await client.close()
    assert aiohttp.WSMsgType.TEXT in frames  # the join notice, delivered before the close
    assert ws.closed
    assert ws.close_code == aiohttp.WSCloseCode.GOING_AWAY


def _message(text: str, sender: str = "alice", *, is_bot: bool = False) -> RoomMessage:
    return RoomMessage(7, "lobby", sender, sender, is_bot, text, 1.5)


@pytest.mark.parametrize(
    ("text", "mentioned"),
    [
        ("@ping start", True),
        ("hey @PING, you there?", True),
        ("@Ping.", True),
        ("@Pinger start", True),
        ("@pingpong", False),
        ("@ping-bot", False),
        ("email@ping", False),
        ("ping", False),
    ],
)
def test_mentions_go_by_id_or_display_name(text: str, mentioned: bool) -> None:
    me = RoomIdentity(bot_id="ping", user_id="ping", display_name="Pinger")
    inbound = to_inbound(_message(text), me)
    assert inbound is not None
    assert inbound.mentions_bot is mentioned


def test_to_inbound_skips_the_bots_own_messages() -> None:
    me = RoomIdentity(bot_id="ping", user_id="ping", display_name="ping")
    assert to_inbound(_message("hi", "ping", is_bot=True), me) is None
    inbound = to_inbound(_message("hi", "pong", is_bot=True), me)
    assert inbound is not None
    assert inbound.sender_is_bot
    assert (inbound.received_at, inbound.raw) == (1.5, _message("hi", "pong", is_bot=True))


async def test_issue9_empty_rooms_are_reclaimed_so_the_lobby_stays_open(room: Room) -> None:
    async with (
        room.client.ws_connect("/room/ws") as first,
        room.client.ws_connect("/room/ws") as second,
    ):
        for n in range(MAX_ROOMS):  # throwaway rooms, each left for the next
            await join(first if n % 2 else second, "mallory", room=f"junk{n}")
        await join(first, "mallory", room="junk-extra")
    async with room.client.ws_connect("/room/ws") as alice:
        await join(alice, "alice")
        await join(alice, "alice", room="side")
        # Only the rooms still in use at the last reclaim are left, and the new ones.
        assert set(room.hub.rooms()) == {"junk62", "junk-extra", "lobby", "side"}


async def test_issue9_rooms_with_clients_and_the_lobby_are_never_reclaimed(
    room: Room, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hub_module, "MAX_ROOMS", 2)
    room.hub.say("lobby", "carol", "kept")
    async with (
        room.client.ws_connect("/room/ws") as alice,
        room.client.ws_connect("/room/ws") as bob,
        room.client.ws_connect("/room/ws") as carol,
    ):
        await join(alice, "alice", room="one")
        await join(bob, "bob", room="two")
        await carol.send_json({"type": "join", "name": "carol", "room": "three"})
        refused = await next_event(carol, "notice", lambda e: e.get("level") == "error")
        assert "too many rooms" in str(refused["text"])
        await join(bob, "bob")  # the lobby is never counted; "two" is left empty
        await join(carol, "carol", room="three")  # "two" is reclaimed to make room
    assert room.hub.rooms() == ["lobby", "one", "three"]
    assert [m.text for m in room.hub.history("lobby")] == ["kept"]


async def test_issue9_a_reclaimed_room_opened_again_does_not_reuse_message_ids(
    room: Room, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hub_module, "MAX_ROOMS", 1)
    async with room.client.ws_connect("/room/ws") as alice:
        await join(alice, "alice", room="side")
        await say(alice, "first")
        before = await next_event(alice, "message")
        await join(alice, "alice", room="other")  # "side" is reclaimed
        await join(alice, "alice", room="side")  # "other" is reclaimed; "side" is new again
        await say(alice, "second")
        after = await next_event(alice, "message")
    assert isinstance(before["id"], int)
    assert isinstance(after["id"], int)
    assert after["id"] > before["id"]
    seen = [await _received(room.inbox["ping"]) for _ in range(2)]
    assert len({m.message_key for m in seen}) == 2


async def test_issue9_connections_per_address_are_bounded(room: Room) -> None:
    async with contextlib.AsyncExitStack() as stack:
        for _ in range(MAX_CONNECTIONS_PER_ADDRESS):
            await stack.enter_async_context(room.client.ws_connect("/room/ws"))
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await room.client.ws_connect("/room/ws")
        assert refused.value.status == 429
    assert (await room.client.get("/room/history")).status == 200


async def test_issue9_joins_per_connection_are_bounded(room: Room) -> None:
    async with room.client.ws_connect("/room/ws") as ws:
        for n in range(MAX_JOINS):
            await join(ws, f"name{n}")
        await ws.send_json({"type": "join", "name": "again"})
        refused = await next_event(ws, "notice", lambda e: e.get("level") == "error")
        assert f"at most {MAX_JOINS} joins" in str(refused["text"])
        await say(ws, "still talking")
        assert (await next_event(ws, "message"))["text"] == "still talking"


@pytest.mark.parametrize(
    "name",
    [
        "ping\n",
        "ping ",
        "p\u0456ng",  # Cyrillic i
        "PING",
        "pi\u200bng",  # zero-width space
        "\uff50\uff49\uff4e\uff47",  # full-width
        "P\u043eng",  # Pong's display name, with a Cyrillic o
    ],
)
async def test_issue9_a_name_that_passes_for_a_bot_is_refused(room: Room, name: str) -> None:
    async with room.client.ws_connect("/room/ws") as ws:
        await ws.send_json({"type": "join", "name": name})
        notice = await next_event(ws, "notice")
        assert notice["level"] == "error"
        await join(ws, "alice")
    assert {client.name for client in room.hub.clients} <= {"alice"}


async def test_issue9_a_name_that_passes_for_a_connected_member_is_refused(room: Room) -> None:
    async with (
        room.client.ws_connect("/room/ws") as alice,
        room.client.ws_connect("/room/ws") as mallory,
        room.client.ws_connect("/room/ws") as second_tab,
    ):
        await join(alice, "alice")
        for fake in ("\u0430lice", "ALICE", "alic\u0435"):
            await mallory.send_json({"type": "join", "name": fake})
            notice = await next_event(mallory, "notice", lambda e: e.get("level") == "error")
            assert "looks like alice" in str(notice["text"])
        await join(second_tab, "alice")  # the very same name is the same identity
        await alice.close()
        await next_event(second_tab, "notice", lambda e: e["text"] == "alice left")
        await second_tab.close()
        await join(mallory, "ALICE")  # once alice has gone, the name is free again


DEEP = "[" * 20_000 + "]" * 20_000


@pytest.mark.parametrize(
    ("frame", "error"),
    [
        (DEEP, "nested deeper than"),
        ("[" * 50_000, "nested deeper than"),
        ('{"type": "join", "name": ' + "[" * 30_000, "nested deeper than"),
        ('{"type": "say", "text": "hi", "n": ' + "9" * 5000 + "}", "frame refused"),
        ('{"type": "say", "text": NaN}', "frame refused"),
        ('{"type": "say", "text": 1e999}', "out of range"),
        ('{"type": "say", "text": "\\ud800"}', "lone surrogate"),
        ("not json", "frame refused"),
    ],
)
async def test_issue9_hostile_frames_get_an_error_and_the_socket_serves_on(
    room: Room, caplog: pytest.LogCaptureFixture, frame: str, error: str
) -> None:
    async with room.client.ws_connect("/room/ws") as ws:
        await join(ws, "alice")
        await ws.send_str(frame)
        notice = await next_event(ws, "notice", lambda e: e.get("level") == "error")
        assert error in str(notice["text"])
        await say(ws, "next")
        assert (await next_event(ws, "message"))["text"] == "next"
    assert not [record for record in caplog.records if record.exc_info]


async def test_issue9_binary_frames_get_an_error_and_the_socket_serves_on(room: Room) -> None:
    async with room.client.ws_connect("/room/ws") as ws:
        await ws.send_bytes(b'\xff\xfe{"type": "join"}')
        notice = await next_event(ws, "notice")
        assert "not binary" in str(notice["text"])
        await join(ws, "alice")


@pytest.mark.parametrize(
    ("payload", "code"),
    [
        (b"\xff\xfe", aiohttp.WSCloseCode.INVALID_TEXT),
        (b"x" * (MAX_FRAME_BYTES + 1), aiohttp.WSCloseCode.MESSAGE_TOO_BIG),
    ],
)
async def test_issue9_broken_or_huge_text_frames_close_with_a_code_and_no_traceback(
    room: Room, caplog: pytest.LogCaptureFixture, payload: bytes, code: aiohttp.WSCloseCode
) -> None:
    async with room.client.ws_connect("/room/ws") as ws:
        await join(ws, "alice")
        await ws.send_frame(payload, aiohttp.WSMsgType.TEXT)
        async with asyncio.timeout(10):
            async for _ in ws:
                pass
    assert ws.close_code == code
    async with room.client.ws_connect("/room/ws") as again:
        await join(again, "alice")
    assert not [record for record in caplog.records if record.exc_info]


@pytest.mark.parametrize(
    ("query", "parameter"),
    [
        ({"limit": "1e308"}, "limit"),
        ({"limit": "9" * 5000}, "limit"),
        ({"limit": "-1"}, "limit"),
        ({"limit": "inf"}, "limit"),
        ({"limit": "0"}, "limit"),
        ({"limit": str(HISTORY_LIMIT + 1)}, "limit"),
        ({"limit": "\u0663"}, "limit"),  # an Arabic-Indic digit three
        ({"room": "../x"}, "room"),
        ({"room": "x" * 5000}, "room"),
    ],
)
async def test_issue9_absurd_history_parameters_get_400_naming_them(
    room: Room, query: dict[str, str], parameter: str
) -> None:
    response = await room.client.get("/room/history", params=query)
    assert response.status == 400
    assert (await response.text()).startswith(f"{parameter} must be")
    assert (await room.client.get("/room/history", params={"limit": "1"})).status == 200
