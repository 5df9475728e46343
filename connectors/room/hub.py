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
  `admins.room` lists. It is a local demo platform; keep it on loopback. Who may reach it
  (Host, Origin) is decided in `access.py`: anything else gets 403.
- A human may not join under a name that reads as a hosted bot's id or display name, or
  as the name of another connected client (look-alike letters, zero-width characters,
  case and whitespace folded). The very same name is the same identity (a second tab, a
  reload racing the old socket's close) and is let in.
- Every post is synchronous: it takes the next id, joins the bounded transcript and is
  queued to every client and every other bot in that order, so everyone sees one order.
  A client whose unsent frames pass `client.QUEUE_BYTES` is dropped (see `client.py`).
- Bounds per client: `MAX_CONNECTIONS_PER_ADDRESS` open websockets per remote address
  (429 beyond), `MAX_JOINS` join frames per connection, frames up to `MAX_FRAME_BYTES`
  (aiohttp closes with 1009 beyond; a text frame that is not UTF-8 gets 1007). A frame
  that is not acceptable JSON (gateway.app.jsonbody: too deep, 5,000-digit numbers, NaN) or is
  binary gets an error notice and the socket stays open.
- At most `MAX_ROOMS` rooms besides the lobby. When a join needs a new room and none is
  left, the rooms without clients are reclaimed (transcript and all). The lobby is never
  reclaimed, nor counted; bots sit in every room, so no other room is theirs to keep.
  A room opened again numbers its messages past every id the hub has issued: the
  gateway's receipts remember `room` + id, and must not take new messages for old ones.
  The gateway's memory of a reclaimed room (its transcript in the state store) is
  forgotten too, once the bots have handled what was posted there (`reclaim.py`).
- A room's own history (what joiners and `/room/history` get) keeps its newest
  `HISTORY_LIMIT` messages within `HISTORY_BYTES` of text and names (the memory they
  hold, `sys.getsizeof`), the newest message always: the hub holds at most 65 of these.
  A notice posted with `keep=True` (the demo's scenario notices) joins that history, so
  whoever opens the room later reads it too; joins and leaves do not.
- The gateway's own answers (`Reply.system`: `/loop` commands) are posted by
  `SYSTEM_NAME`, not by the hosted bot that ran the command: `system: true` on the wire,
  never handed to the bots (they are the gateway talking to people), and no human may
  join under that name.
- `offer(label, text)` puts a button on the room page that says `text` as the person who
  presses it (the demo's "Run the scenarios again", `/demo`): the `joined` event lists
  these as `actions`; the hub gives the text no meaning of its own.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from typing import Protocol

from aiohttp import WSCloseCode, WSMsgType, web

from connectors.room.access import RoomAccess, name_key
from connectors.room.client import RoomClient
from connectors.room.reclaim import ForgetRoom, Reclaimed
from gateway.app.jsonbody import JsonBodyError, parse_json

log = logging.getLogger("loopwarden.room")

DEFAULT_ROOM = "lobby"
SYSTEM_NAME = "loopwarden"
"""The sender of the gateway's own answers in the room."""
MAX_TEXT = 4000
HISTORY_LIMIT = 500
HISTORY_BYTES = 256 * 1024
JOIN_HISTORY = 100
JOIN_HISTORY_BYTES = 256 * 1024
MAX_ROOMS = 64
MAX_CONNECTIONS_PER_ADDRESS = 16
MAX_JOINS = 50
MAX_FRAME_BYTES = 64 * 1024

_NAME = re.compile(r"[\w.-]{1,32}")
_ROOM = re.compile(r"[\w.-]{1,40}")
_LIMIT = re.compile(r"[0-9]{1,4}")
_ROOM_RULE = "1-40 letters, digits, '.', '-' or '_'"
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
    system: bool = False

    def to_wire(self) -> dict[str, object]:
        """The `message` event sent to websocket clients and the history endpoint."""
        return {
            "type": "message",
            "id": self.id,
            "room": self.room,
            "sender_id": self.sender_id,
            "sender_name": self.sender_name,
            "is_bot": self.is_bot,
            "system": self.system,
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

    def after_handled(self, done: Callable[[], None]) -> None: ...


@dataclass(slots=True)
class _Room:
    """One room's transcript (bounded in entries and bytes), id counter and clients."""

    next_id: int
    transcript: deque[RoomEvent] = field(default_factory=deque)
    size: int = 0
    clients: set[RoomClient] = field(default_factory=set)

    def keep(self, message: RoomEvent) -> None:
        """Append to the transcript; the oldest go past `HISTORY_LIMIT` or `HISTORY_BYTES`."""
        transcript = self.transcript
        transcript.append(message)
        self.size += _held(message)
        while len(transcript) > HISTORY_LIMIT or (
            self.size > HISTORY_BYTES and len(transcript) > 1
        ):
            self.size -= _held(transcript.popleft())


ROOM_HUB: web.AppKey[RoomHub] = web.AppKey("loopwarden_room_hub")


class RoomHub:
    """Rooms, their transcripts, the websocket clients and the hosted bots, for one app."""

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.time,
        http_host: str = "127.0.0.1",
        forget: ForgetRoom | None = None,
    ) -> None:
        self._clock = clock
        self._access = RoomAccess(http_host)
        self._rooms: dict[str, _Room] = {}
        self._clients: set[RoomClient] = set()
        self._issued = 0
        self._members: dict[str, RoomMember] = {}
        self._listeners: list[Listener] = []
        self._actions: list[dict[str, str]] = []
        self._reclaimed = None if forget is None else Reclaimed(forget, self._seated)
        self._assets = {
            name: resources.files("connectors.room").joinpath("static", name).read_bytes()
            for name in _ASSETS
        }

    @classmethod
    def for_app(
        cls,
        app: web.Application,
        *,
        http_host: str = "127.0.0.1",
        forget: ForgetRoom | None = None,
    ) -> RoomHub:
        """The app's hub, created (with its routes) on first use; call before the app starts.

        `http_host` is the address the server binds (`http.host`), accepted as a Host;
        `forget` empties the gateway's memory of a room the hub reclaims (by its name).
        """
        hub = app.get(ROOM_HUB)
        if hub is None:
            hub = cls(http_host=http_host, forget=forget)
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

    @property
    def clients(self) -> frozenset[RoomClient]:
        """Every open websocket connection, joined to a room or not."""
        return frozenset(self._clients)

    def rooms(self) -> list[str]:
        """The names of the rooms the hub holds now (reclaimed rooms are gone)."""
        return list(self._rooms)

    def history_bytes(self, room: str) -> int:
        """The bytes a room's history holds, as counted against `HISTORY_BYTES`."""
        state = self._rooms.get(room)
        return 0 if state is None else state.size

    @property
    def forgetting(self) -> bool:
        """True while a reclaimed room's memory waits to be forgotten (or is being)."""
        return self._reclaimed is not None and not self._reclaimed.idle

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

    def offer(self, label: str, text: str) -> None:
        """Show a button labelled `label` on the room page that says `text` when pressed."""
        self._actions.append({"label": label, "say": text})

    def _seated(self) -> list[RoomMember]:
        return list(self._members.values())

    def bot_names(self) -> list[tuple[str, str]]:
        """(user id, display name) of every seated bot."""
        return [(m.user_id, m.display_name) for m in self._members.values()]

    # Posting

    def say(self, room: str, name: str, text: str) -> RoomMessage:
        """Post a human's message (the websocket path, and the demo's scripted kick-off)."""
        return self.post(room, sender_id=name, sender_name=name, is_bot=False, text=text)

    def post(
        self,
        room: str,
        *,
        sender_id: str,
        sender_name: str,
        is_bot: bool,
        text: str,
        system: bool = False,
    ) -> RoomMessage:
        """Append a message to the room and hand it to every client and every other bot.

        A `system` message (the gateway's own answer) reaches the clients, not the bots.
        """
        state = self._room(room)
        message = RoomMessage(
            id=state.next_id,
            room=room,
            sender_id=sender_id,
            sender_name=sender_name,
            is_bot=is_bot,
            text=text,
            ts=self._clock(),
            system=system,
        )
        state.next_id += 1
        self._issued = max(self._issued, message.id)
        state.keep(message)
        self._broadcast(state, message.to_wire())
        self._tell_listeners(message)
        if system:
            return message
        for member in list(self._members.values()):
            if member.user_id != sender_id:
                member.deliver(message)
        return message

    def post_system(self, room: str, text: str) -> RoomMessage:
        """Post the gateway's own answer (to a `/loop` command) as `SYSTEM_NAME`."""
        return self.post(
            room,
            sender_id=SYSTEM_NAME,
            sender_name=SYSTEM_NAME,
            is_bot=False,
            text=text,
            system=True,
        )

    def notice(self, room: str, text: str, *, keep: bool = False) -> RoomNotice:
        """Post a notice from the room itself (not part of the chat, not seen by bots).

        With `keep`, the notice joins the room's history, for whoever joins later.
        """
        notice = RoomNotice(room=room, text=text, ts=self._clock())
        state = self._room(room)
        if keep:
            state.keep(notice)
        self._broadcast(state, notice.to_wire())
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
        """The newest `limit` messages of a room, oldest first (kept notices left out)."""
        messages = [e for e in self.events(room) if isinstance(e, RoomMessage)]
        return messages[-limit:] if limit > 0 else []

    def events(self, room: str, limit: int = HISTORY_LIMIT) -> list[RoomEvent]:
        """The newest `limit` entries of a room's history, kept notices too, oldest first."""
        state = self._rooms.get(room)
        if state is None or limit <= 0:
            return []
        return list(state.transcript)[-limit:]

    def _room(self, name: str) -> _Room:
        state = self._rooms.get(name)
        if state is None:
            state = self._rooms[name] = _Room(next_id=self._issued + 1)
        return state

    def _room_for_one_more(self, mover: RoomClient) -> bool:
        """Whether a new room fits under `MAX_ROOMS`, reclaiming empty rooms if need be.

        The room the joining client is about to leave counts as empty when it is alone there.
        """
        if len(self._rooms.keys() - {DEFAULT_ROOM}) < MAX_ROOMS:
            return True
        empty = [
            name
            for name, state in self._rooms.items()
            if name != DEFAULT_ROOM and not state.clients - {mover}
        ]
        for name in empty:
            del self._rooms[name]
        if self._reclaimed is not None:
            self._reclaimed.add(empty)
        return len(self._rooms.keys() - {DEFAULT_ROOM}) < MAX_ROOMS

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

    def _admit(self, request: web.Request) -> None:
        refusal = self._access.refusal(request)
        if refusal is not None:
            raise web.HTTPForbidden(text=refusal)

    async def _page(self, request: web.Request) -> web.Response:
        self._admit(request)
        return self._asset_response("index.html")

    async def _asset(self, request: web.Request) -> web.Response:
        self._admit(request)
        return self._asset_response(request.path.rsplit("/", 1)[-1])

    def _asset_response(self, name: str) -> web.Response:
        return web.Response(
            body=self._assets[name],
            content_type=_ASSETS[name],
            charset="utf-8",
            headers={"Cache-Control": "no-cache"},
        )

    async def _history(self, request: web.Request) -> web.Response:
        self._admit(request)
        room = request.query.get("room", DEFAULT_ROOM)
        if not _ROOM.fullmatch(room):
            raise web.HTTPBadRequest(text=f"room must be {_ROOM_RULE}")
        limit = request.query.get("limit", str(HISTORY_LIMIT))
        if not _LIMIT.fullmatch(limit) or not 1 <= int(limit) <= HISTORY_LIMIT:
            raise web.HTTPBadRequest(text=f"limit must be a whole number from 1 to {HISTORY_LIMIT}")
        messages = [m.to_wire() for m in self.events(room, int(limit))]
        return web.json_response({"room": room, "messages": messages})

    async def _websocket(self, request: web.Request) -> web.WebSocketResponse:
        self._admit(request)
        address = request.remote or "?"
        if sum(c.address == address for c in self._clients) >= MAX_CONNECTIONS_PER_ADDRESS:
            raise web.HTTPTooManyRequests(
                text=f"at most {MAX_CONNECTIONS_PER_ADDRESS} room connections per address"
            )
        ws = web.WebSocketResponse(heartbeat=30.0, max_msg_size=MAX_FRAME_BYTES)
        client = RoomClient(ws, request.transport, address)
        self._clients.add(client)
        try:
            await ws.prepare(request)
            async for frame in ws:
                if frame.type is WSMsgType.TEXT:
                    self._on_frame(client, frame.data)
                elif frame.type is WSMsgType.BINARY:
                    client.push_event(_error("send JSON objects as text frames, not binary"))
                elif frame.type is WSMsgType.ERROR:
                    break
        finally:
            self._clients.discard(client)
            self._leave(client)
            await client.finish()
        return ws

    def _on_frame(self, client: RoomClient, data: str) -> None:
        try:
            payload = parse_json(data)
        except JsonBodyError as exc:
            client.push_event(_error(f"frame refused ({exc}); send JSON objects: join or say"))
            return
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

    def _join(self, client: RoomClient, name: object, room: object) -> None:
        client.joins += 1
        if client.joins > MAX_JOINS:
            client.push_event(_error(f"at most {MAX_JOINS} joins per connection; reconnect"))
            return
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            client.push_event(_error("a name is 1-32 letters, digits, '.', '-' or '_'"))
            return
        if not isinstance(room, str) or not _ROOM.fullmatch(room):
            client.push_event(_error(f"a room name is {_ROOM_RULE}"))
            return
        refusal = self._unavailable(client, name, room)
        if refusal is not None:
            client.push_event(_error(refusal))
            return
        previous = client.name
        self._leave(client, quiet=True)
        client.name, client.room = name, room
        state = self._room(room)
        bots = [{"id": bot_id, "name": bot_name} for bot_id, bot_name in self.bot_names()]
        client.push_event(
            {"type": "joined", "room": room, "name": name, "bots": bots, "actions": self._actions}
        )
        client.push_event({"type": "history", "room": room, "messages": self._recent(room)})
        state.clients.add(client)
        joined = f"{previous} is now {name}" if previous and previous != name else f"{name} joined"
        self.notice(room, joined)

    def _unavailable(self, client: RoomClient, name: str, room: str) -> str | None:
        """Why a well-formed join is refused (the name passes for another, no room left)."""
        key = name_key(name)
        if key == name_key(SYSTEM_NAME):
            return f"{name} is, or looks like, the gateway's own name here; pick another"
        if key in {name_key(part) for pair in self.bot_names() for part in pair}:
            return f"{name} is, or looks like, a bot's name here; pick another"
        for other in self._clients:
            if other is client or other.name is None or other.name == name:
                continue
            if name_key(other.name) == key:
                return f"{name} looks like {other.name}, who is here; pick another"
        if room == DEFAULT_ROOM or room in self._rooms or self._room_for_one_more(client):
            return None
        return "this server has too many rooms; join an existing one"

    def _recent(self, room: str) -> list[dict[str, object]]:
        """A joiner's history: the newest `JOIN_HISTORY` messages that fit `JOIN_HISTORY_BYTES`."""
        picked: list[dict[str, object]] = []
        size = 0
        for message in reversed(self.events(room, JOIN_HISTORY)):
            wire = message.to_wire()
            size += len(json.dumps(wire))
            if size > JOIN_HISTORY_BYTES:
                break
            picked.append(wire)
        picked.reverse()
        return picked

    def _say(self, client: RoomClient, text: object) -> None:
        if client.name is None or client.room is None:
            client.push_event(_error('join first: {"type": "join", "name": …}'))
            return
        if not isinstance(text, str) or not text.strip():
            return
        if len(text) > MAX_TEXT:
            client.push_event(_error(f"messages are limited to {MAX_TEXT} characters"))
            return
        self.say(client.room, client.name, text.strip())

    def _leave(self, client: RoomClient, *, quiet: bool = False) -> None:
        if client.room is None:
            return
        state = self._rooms.get(client.room)
        if state is not None and client in state.clients:
            state.clients.discard(client)
            if not quiet:
                self.notice(client.room, f"{client.name} left")

    async def _on_shutdown(self, app: web.Application) -> None:
        """Close every websocket so the server can stop without waiting for browsers.

        Forgets of reclaimed rooms already running are awaited, not left pending.
        """
        for client in list(self._clients):
            if client.ws.prepared and not client.dropped:  # mid-handshake, or reset already
                await client.ws.close(code=WSCloseCode.GOING_AWAY, message=b"server shutdown")
        if self._reclaimed is not None:
            await self._reclaimed.aclose()


def _held(entry: RoomEvent) -> int:
    """The memory an entry's text (and a message's sender name) hold."""
    if isinstance(entry, RoomNotice):
        return sys.getsizeof(entry.text)
    return sys.getsizeof(entry.text) + sys.getsizeof(entry.sender_name)


def _error(text: str) -> dict[str, object]:
    return {"type": "notice", "level": "error", "text": text}
