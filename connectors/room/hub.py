"""RoomHub: the local web chat room behind the `room` platform, served by the gateway's app.

One hub per aiohttp Application (kept under `ROOM_HUB`), created by the first room
connector, which also registers the routes: `GET /room` (the page and its two assets),
`GET /room/ws` (the websocket) and `GET /room/history` (the transcript as JSON).

Websocket protocol (JSON text frames). Client → server: `{"type": "join", "name":
"alice", "room": "lobby"}` (room optional; joining again renames or moves the client) and
`{"type": "say", "text": "…"}`. Server → client: `joined`, then `history` (the recent
transcript), then a `message` for every message posted in the room (human or bot), plus
`notice` (joins, leaves, errors) and `typing` events.

Decisions where DESIGN.md is silent:
- The room has no authentication: a sender's id is the name it joined with, which is what
  `admins.room` lists. It is a local demo platform; keep it on loopback.
- A human may not join under a hosted bot's id or display name (no impersonating bots).
- Cross-site websocket hijacking is refused: a browser connection whose `Origin` is not
  this server's host gets 403 (clients without an Origin header, curl and tests, are let in).
- Every post is synchronous: it takes the next id, joins the bounded transcript and is
  queued to every client and every other bot in that order, so everyone sees one order.
  A client that falls `CLIENT_QUEUE` messages behind is disconnected rather than buffered.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from typing import Protocol
from urllib.parse import urlsplit

from aiohttp import WSCloseCode, WSMsgType, web

log = logging.getLogger("loopwarden.room")

DEFAULT_ROOM = "lobby"
MAX_TEXT = 4000
HISTORY_LIMIT = 500
JOIN_HISTORY = 100
MAX_ROOMS = 64
CLIENT_QUEUE = 1000
FINISH_SECONDS = 5.0

_NAME = re.compile(r"^[\w.-]{1,32}$")
_ROOM = re.compile(r"^[\w.-]{1,40}$")
_ASSETS = {
    "index.html": "text/html",
    "app.js": "text/javascript",
    "style.css": "text/css",
}


@dataclass(frozen=True, slots=True)
class RoomMessage:
    """One message posted in a room, by a human or a hosted bot; `id` counts per room."""

    id: int
    room: str
    sender_id: str
    sender_name: str
    is_bot: bool
    text: str
    ts: float

    def to_wire(self) -> dict[str, object]:
        """The `message` event sent to websocket clients and the history endpoint."""
        return {
            "type": "message",
            "id": self.id,
            "room": self.room,
            "sender_id": self.sender_id,
            "sender_name": self.sender_name,
            "is_bot": self.is_bot,
            "text": self.text,
            "thread_id": None,
            "ts": self.ts,
        }


@dataclass(frozen=True, slots=True)
class RoomNotice:
    """A line from the room itself (joins, leaves, demo hints), not a chat message."""

    room: str
    text: str
    ts: float

    def to_wire(self) -> dict[str, object]:
        """The `notice` event sent to websocket clients."""
        return {"type": "notice", "room": self.room, "text": self.text, "ts": self.ts}


RoomEvent = RoomMessage | RoomNotice
Listener = Callable[[RoomEvent], None]


class RoomMember(Protocol):
    """A hosted bot in the hub: its user id, display name, and a non-blocking delivery."""

    @property
    def user_id(self) -> str: ...

    @property
    def display_name(self) -> str: ...

    def deliver(self, message: RoomMessage) -> None: ...


@dataclass(slots=True)
class _Room:
    """One room's transcript, id counter and connected clients."""

    transcript: deque[RoomMessage] = field(default_factory=lambda: deque(maxlen=HISTORY_LIMIT))
    next_id: int = 1
    clients: set[_Client] = field(default_factory=set)


class _Client:
    """One websocket connection with its own ordered outbound queue and writer task."""

    def __init__(self, ws: web.WebSocketResponse) -> None:
        self.ws = ws
        self.name: str | None = None
        self.room: str | None = None
        self._queue: asyncio.Queue[str | None] = asyncio.Queue(maxsize=CLIENT_QUEUE)
        self._writer = asyncio.create_task(self._write())
        self._closer: asyncio.Task[bool] | None = None

    def push(self, frame: str) -> None:
        """Queue one frame; a client too far behind is closed instead of buffered."""
        if self._closer is not None:
            return
        try:
            self._queue.put_nowait(frame)
        except asyncio.QueueFull:
            log.warning("room client %s fell behind; disconnecting it", self.name or "?")
            self._writer.cancel()
            self._closer = asyncio.create_task(
                self.ws.close(code=WSCloseCode.TRY_AGAIN_LATER, message=b"too slow")
            )

    def push_event(self, event: dict[str, object]) -> None:
        """Queue one JSON event."""
        self.push(json.dumps(event))

    async def _write(self) -> None:
        while (frame := await self._queue.get()) is not None:
            try:
                await self.ws.send_str(frame)
            except ConnectionError:
                return

    async def finish(self) -> None:
        """Stop the writer once what is queued has been sent (bounded: the peer may be gone)."""
        with contextlib.suppress(asyncio.QueueFull):
            self._queue.put_nowait(None)
        await asyncio.wait({self._writer}, timeout=FINISH_SECONDS)
        self._writer.cancel()
        if self._closer is not None:
            await asyncio.wait({self._closer}, timeout=FINISH_SECONDS)


ROOM_HUB: web.AppKey[RoomHub] = web.AppKey("loopwarden_room_hub")


class RoomHub:
    """Rooms, their transcripts, the websocket clients and the hosted bots, for one app."""

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._rooms: dict[str, _Room] = {}
        self._members: dict[str, RoomMember] = {}
        self._listeners: list[Listener] = []
        self._assets = {
            name: resources.files("connectors.room").joinpath("static", name).read_bytes()
            for name in _ASSETS
        }

    @classmethod
    def for_app(cls, app: web.Application) -> RoomHub:
        """The app's hub, created (with its routes) on first use; call before the app starts."""
        hub = app.get(ROOM_HUB)
        if hub is None:
            hub = cls()
            app[ROOM_HUB] = hub
            hub.add_routes(app)
        return hub

    def add_routes(self, app: web.Application) -> None:
        """Register the page, its assets, the websocket and the history endpoint."""
        app.router.add_get("/room", self._page)
        app.router.add_get("/room/app.js", self._asset)
        app.router.add_get("/room/style.css", self._asset)
        app.router.add_get("/room/ws", self._websocket)
        app.router.add_get("/room/history", self._history)
        app.on_shutdown.append(self._on_shutdown)

    # Bots and listeners

    def attach(self, member: RoomMember) -> None:
        """Seat a hosted bot: it is handed every message others post, in order."""
        self._members[member.user_id] = member

    def detach(self, member: RoomMember) -> None:
        """Unseat a hosted bot."""
        if self._members.get(member.user_id) is member:
            del self._members[member.user_id]

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Call `listener` with every message and notice; returns the unsubscribe function."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    def bot_names(self) -> list[tuple[str, str]]:
        """(user id, display name) of every seated bot."""
        return [(m.user_id, m.display_name) for m in self._members.values()]

    # Posting

    def say(self, room: str, name: str, text: str) -> RoomMessage:
        """Post a human's message (the websocket path, and the demo's scripted kick-off)."""
        return self.post(room, sender_id=name, sender_name=name, is_bot=False, text=text)

    def post(
        self, room: str, *, sender_id: str, sender_name: str, is_bot: bool, text: str
    ) -> RoomMessage:
        """Append a message to the room and hand it to every client and every other bot."""
        state = self._room(room)
        message = RoomMessage(
            id=state.next_id,
            room=room,
            sender_id=sender_id,
            sender_name=sender_name,
            is_bot=is_bot,
            text=text,
            ts=self._clock(),
        )
        state.next_id += 1
        state.transcript.append(message)
        self._broadcast(state, message.to_wire())
        self._tell_listeners(message)
        for member in list(self._members.values()):
            if member.user_id != sender_id:
                member.deliver(message)
        return message

    def notice(self, room: str, text: str) -> RoomNotice:
        """Post a notice from the room itself (not part of the chat, not seen by bots)."""
        notice = RoomNotice(room=room, text=text, ts=self._clock())
        self._broadcast(self._room(room), notice.to_wire())
        self._tell_listeners(notice)
        return notice

    def typing(self, room: str, sender_id: str, sender_name: str) -> None:
        """Tell the room's clients that a bot is composing a reply."""
        event: dict[str, object] = {
            "type": "typing",
            "room": room,
            "sender_id": sender_id,
            "sender_name": sender_name,
        }
        self._broadcast(self._room(room), event)

    def history(self, room: str, limit: int = HISTORY_LIMIT) -> list[RoomMessage]:
        """The newest `limit` messages of a room, oldest first."""
        state = self._rooms.get(room)
        if state is None or limit <= 0:
            return []
        return list(state.transcript)[-limit:]

    def _room(self, name: str) -> _Room:
        state = self._rooms.get(name)
        if state is None:
            state = self._rooms[name] = _Room()
        return state

    def _broadcast(self, state: _Room, event: dict[str, object]) -> None:
        frame = json.dumps(event)
        for client in list(state.clients):
            client.push(frame)

    def _tell_listeners(self, event: RoomEvent) -> None:
        for listener in list(self._listeners):
            try:
                listener(event)
            except Exception:  # a broken observer must not break the room
                log.exception("room listener failed")

    # HTTP

    async def _page(self, request: web.Request) -> web.Response:
        return self._asset_response("index.html")

    async def _asset(self, request: web.Request) -> web.Response:
        return self._asset_response(request.path.rsplit("/", 1)[-1])

    def _asset_response(self, name: str) -> web.Response:
        return web.Response(
            body=self._assets[name],
            content_type=_ASSETS[name],
            charset="utf-8",
            headers={"Cache-Control": "no-cache"},
        )

    async def _history(self, request: web.Request) -> web.Response:
        room = request.query.get("room", DEFAULT_ROOM)
        try:
            limit = int(request.query.get("limit", str(HISTORY_LIMIT)))
        except ValueError:
            raise web.HTTPBadRequest(text="limit must be a whole number") from None
        messages = [m.to_wire() for m in self.history(room, limit)]
        return web.json_response({"room": room, "messages": messages})

    async def _websocket(self, request: web.Request) -> web.WebSocketResponse:
        if not _same_origin(request):
            raise web.HTTPForbidden(text="cross-origin websocket refused")
        ws = web.WebSocketResponse(heartbeat=30.0, max_msg_size=64 * 1024)
        await ws.prepare(request)
        client = _Client(ws)
        try:
            async for frame in ws:
                if frame.type is WSMsgType.TEXT:
                    self._on_frame(client, frame.data)
                elif frame.type is WSMsgType.ERROR:
                    break
        finally:
            self._leave(client)
            await client.finish()
        return ws

    def _on_frame(self, client: _Client, data: str) -> None:
        try:
            payload = json.loads(data)
        except ValueError:
            payload = None
        if not isinstance(payload, dict):
            client.push_event(_error("send JSON objects with a type: join or say"))
            return
        kind = payload.get("type")
        if kind == "join":
            self._join(client, payload.get("name"), payload.get("room", DEFAULT_ROOM))
        elif kind == "say":
            self._say(client, payload.get("text"))
        else:
            client.push_event(_error("unknown message type (use join or say)"))

    def _join(self, client: _Client, name: object, room: object) -> None:
        if not isinstance(name, str) or not _NAME.match(name):
            client.push_event(_error("a name is 1-32 letters, digits, '.', '-' or '_'"))
            return
        if not isinstance(room, str) or not _ROOM.match(room):
            client.push_event(_error("a room name is 1-40 letters, digits, '.', '-' or '_'"))
            return
        taken = {part.casefold() for pair in self.bot_names() for part in pair}
        if name.casefold() in taken:
            client.push_event(_error(f"{name} is a bot's name here; pick another"))
            return
        if room not in self._rooms and len(self._rooms) >= MAX_ROOMS:
            client.push_event(_error("this server has too many rooms; join an existing one"))
            return
        previous = client.name
        self._leave(client, quiet=True)
        client.name, client.room = name, room
        state = self._room(room)
        bots = [{"id": bot_id, "name": bot_name} for bot_id, bot_name in self.bot_names()]
        client.push_event({"type": "joined", "room": room, "name": name, "bots": bots})
        history = [m.to_wire() for m in self.history(room, JOIN_HISTORY)]
        client.push_event({"type": "history", "room": room, "messages": history})
        state.clients.add(client)
        joined = f"{previous} is now {name}" if previous and previous != name else f"{name} joined"
        self.notice(room, joined)

    def _say(self, client: _Client, text: object) -> None:
        if client.name is None or client.room is None:
            client.push_event(_error('join first: {"type": "join", "name": …}'))
            return
        if not isinstance(text, str) or not text.strip():
            return
        if len(text) > MAX_TEXT:
            client.push_event(_error(f"messages are limited to {MAX_TEXT} characters"))
            return
        self.say(client.room, client.name, text.strip())

    def _leave(self, client: _Client, *, quiet: bool = False) -> None:
        if client.room is None:
            return
        state = self._rooms.get(client.room)
        if state is not None and client in state.clients:
            state.clients.discard(client)
            if not quiet:
                self.notice(client.room, f"{client.name} left")

    async def _on_shutdown(self, app: web.Application) -> None:
        """Close every websocket so the server can stop without waiting for browsers."""
        clients = [client for state in self._rooms.values() for client in state.clients]
        for client in clients:
            await client.ws.close(code=WSCloseCode.GOING_AWAY, message=b"server shutdown")


def _error(text: str) -> dict[str, object]:
    return {"type": "notice", "level": "error", "text": text}


def _same_origin(request: web.Request) -> bool:
    """True unless a browser sent an Origin naming another host than the one it asked."""
    origin = request.headers.get("Origin")
    if origin is None:
        return True
    return urlsplit(origin).netloc.casefold() == request.host.casefold()
