"""The console's Rooms data and its Forget button: `GET /admin/rooms`, `POST /admin/forget`.

`GET /admin/rooms` answers `{"rooms": [room object, ...]}` (`gateway.admin.views.room_json`)
beside a text `result`; `?room=R` answers that one room. Everything is read from the
state backend, so two replicas on one Redis answer the same. The Rooms page's other
buttons are the admin API's `reset`, `pause` and `resume` (gateway/app/http.py).

Decisions where DESIGN.md is silent:
- The rooms "seen" are the union of the rooms the config's channel rules name (a
  platform and a channel without glob characters), the linked rooms (`links:`; each
  shows its link's pairs), the rooms holding live bot pairs, the
  rooms of the newest `MAX_ROOMS` entries of the audit trail's admin log but the admin
  API's reads (where an admin paused, set or reset: the backends do not list pauses and
  overrides; a non-admin's attempts show no room) and those of each
  `RoomSource` given (the activity feed's). The newest seen come first (a source's time
  is wall-clock seconds; a live pair counts as seen now, since bots spoke there within
  its window), then the configured rooms no source timed, by key; at most `limit` (1 to
  500, default 500).
- `?room=R` answers R whether or not it was seen, as `status` does.
- A room is a room key as every admin route takes it (`gateway.app.http.RoomKey`:
  `platform:channel`, at most 256 characters, none of them a control character), taken
  as given: a look-alike of another room's key is another room, and a `<script>` in it is
  a string in the JSON answer, never markup. A room seen that no admin route would take
  (an older entry's, a platform's) is not listed, so the page shows no button that
  cannot work.
- `forget` takes an optional `thread` (a thread id of the room) to empty that thread's
  transcript only; without it, the room's and all its threads'. A room with no
  transcript answers ok, 0 messages forgotten.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Protocol

from aiohttp import web
from pydantic import Field

from gateway.admin.access import MAX_ROOM_CHARS, AdminAccess, AdminBody, RoomKey, room_key_problem
from gateway.admin.api import admin_route
from gateway.admin.service import AdminAck, AdminService
from gateway.admin.views import room_json
from gateway.config import Config
from gateway.state.base import AuditStore, DecisionStore
from guards.bot_loop import PairSnapshot

MAX_ROOMS = 500
_GLOB_CHARS = frozenset("*?[")
# How the admin API audits a read (`GET /admin/status {"room": ...}`, gateway/app/http.py):
# looking at a room is not seeing it, or every room key typed into a URL would be listed.
_API_READ = "GET "

RoomSource = Callable[[], Awaitable[Sequence[tuple[str, float]]]]
"""Rooms some part of the gateway has seen, each with when it last saw it (wall clock)."""


class RoomsQuery(AdminBody):
    """`GET /admin/rooms`: every room seen (newest first, at most `limit`), or one `room`."""

    room: RoomKey | None = None
    limit: int = Field(default=MAX_ROOMS, ge=1, le=MAX_ROOMS)


class ForgetBody(AdminBody):
    """`POST /admin/forget`: empty a room's transcript, or one `thread`'s of it."""

    room: RoomKey
    thread: str | None = Field(default=None, min_length=1, max_length=MAX_ROOM_CHARS)


class RoomsState(DecisionStore, AuditStore, Protocol):
    """What the Rooms page reads: the pairs held, and the rooms admins acted in."""


class Rooms:
    """Lists the rooms seen and reads each one's view through `AdminService.room_view`."""

    def __init__(
        self,
        admin: AdminService,
        state: RoomsState,
        config: Config,
        *,
        sources: Iterable[RoomSource] = (),
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._admin = admin
        self._state = state
        self._configured = tuple(_configured_rooms(config))
        self._links = config.room_links
        self._sources = tuple(sources)
        self._clock = clock

    async def show(self, query: RoomsQuery) -> AdminAck:
        """The rooms' objects as data; the text is one room's `status`, or the rooms' keys."""
        if query.room is not None:
            status = await self._admin.status_ack(query.room)
            return AdminAck(status.text, data={"rooms": [status.data]})
        pairs = await self._state.pair_snapshot(None)
        by_room: dict[str, list[PairSnapshot]] = {}
        for pair in pairs:
            if pair.scope is not None:  # the state backends always store a pair's room
                by_room.setdefault(pair.scope, []).append(pair)
        rooms = await self._seen(by_room, query.limit)
        views = [
            await self._admin.room_view(room, pairs=by_room.get(self._links.scope(room), ()))
            for room in rooms
        ]
        return AdminAck(
            "\n".join(rooms) or "no rooms seen", data={"rooms": [room_json(v) for v in views]}
        )

    async def _seen(self, paired: Iterable[str], limit: int) -> list[str]:
        """The `limit` rooms seen most recently, then the untimed ones by key."""
        seen: dict[str, float | None] = dict.fromkeys(self._configured)
        now = self._clock()
        timed = [(room, now) for room in paired]
        timed.extend(
            (entry.room, entry.at)
            for entry in await self._state.recent_audit(MAX_ROOMS, kind="admin")
            if not entry.command.startswith(_API_READ)
        )
        for source in self._sources:
            timed.extend(await source())
        for room, at in timed:
            last = seen.get(room)
            seen[room] = at if last is None else max(last, at)
        rooms = [room for room in seen if _is_room(room)]
        rooms.sort(key=lambda room: (seen[room] is None, -(seen[room] or 0.0), room))
        return rooms[:limit]

    async def forget(self, body: ForgetBody) -> AdminAck:
        """`forget`, as the chat command does it in the room or in one of its threads."""
        return AdminAck(await self._admin.forget(body.room, thread_id=body.thread))


def room_routes(
    admin: AdminService,
    state: RoomsState,
    config: Config,
    access: AdminAccess,
    *,
    sources: Iterable[RoomSource] = (),
) -> list[web.RouteDef]:
    """`GET /admin/rooms` and `POST /admin/forget`, with the admin API's auth and audit."""
    rooms = Rooms(admin, state, config, sources=sources)
    return [
        admin_route(admin, state, access, ("GET", "/admin/rooms", RoomsQuery, rooms.show)),
        admin_route(admin, state, access, ("POST", "/admin/forget", ForgetBody, rooms.forget)),
    ]


def _configured_rooms(config: Config) -> Iterable[str]:
    """The rooms the channel rules name (a platform and a channel that is not a glob), then
    the linked rooms (`links:`)."""
    for rule in config.channels:
        match = rule.match
        if match.platform is not None and not _GLOB_CHARS & set(match.channel):
            yield f"{match.platform}:{match.channel}"
    yield from config.room_links.rooms()


def _is_room(room: str) -> bool:
    """Whether `room` is a room key the page can act on (not the global `*`, no half key)."""
    return room_key_problem(room) is None
