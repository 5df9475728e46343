"""The Activity feed over HTTP: JSON for the console and scripts, and a live event stream.

- `GET /admin/activity?since=CURSOR&limit=N&room=R`: the events after `since` (without
  it, the newest `limit`, default 50, at most 1,000), oldest first; `result` is a line per
  event and `events`/`cursor` the same as data. Pass `cursor` as the next `since`.
- `GET /admin/activity/series?span=hour|day&room=R`: the chart, `{span, buckets: [{t, in,
  out, refusals: {guard: n}}]}`, per minute over the last hour or per hour over the last
  day, oldest first (`t` is the bucket's start in Unix seconds).
- `GET /admin/activity/stream?room=R&since=CURSOR`: `text/event-stream` (aiohttp-sse): each
  new event as `id: <id>` and `data: <event JSON>`; a reconnecting client's `Last-Event-ID`
  (else `since`) is where it resumes, and without either the stream starts with the
  newest `STREAM_BATCH` events. A `: ping` comment keeps the connection open every
  `ping_interval` (15 s).
The two JSON routes go through `gateway.app.http.admin_route` (auth, validation, answer
shape); the stream is authorised by the same `AdminAccess` and validated the same way.

Decisions where DESIGN.md is silent:
- A cursor and a limit are whole numbers written with the ASCII digits 0-9, at most 18 of
  them: a sign, an exponent, `inf`, a look-alike digit or 5,000 digits is a 400 naming
  the field. A room is a room key as every admin route takes it (`gateway.app.http.RoomKey`).
- A stream reads the state backend (so it shows every replica's events) after each flush
  of this gateway's feed and at least every `poll_seconds` (0.5 s), at most
  `STREAM_BATCH` events a read. One that falls further behind (a flood) jumps to the
  newest events and says so with an `event: gap` whose data is `{"after": A, "before": B}`
  (the events between were skipped; `/admin/activity?since=A` has them): a console shows
  what happens now, and a stream's cost is bounded whatever the traffic.
- At most `max_streams` (16) streams at once; one more is 503 with Retry-After. A client
  that stops reading is cut off once a write has waited `send_timeout` (10 s), so it
  holds no more than the socket's buffers. Streams end, cleanly, when the gateway stops.
- A stream is `Cache-Control: no-store`, as every admin answer (aiohttp-sse's own
  `no-cache` is replaced).
- A stream is not written to the state store's audit log (a read changes nothing, and a
  console reconnecting would flood it); like every admin call it is logged on
  `loopwarden.audit`. The two JSON routes are audited as every `admin_route` is.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Annotated, Any

from aiohttp import web
from aiohttp_sse import EventSourceResponse, sse_response
from pydantic import BeforeValidator, Field

from gateway.admin.access import (
    AdminAccess,
    AdminBadRequest,
    AdminBody,
    RoomKey,
    parse_admin_request,
)
from gateway.admin.api import admin_route
from gateway.admin.service import AdminAck, AdminService
from gateway.admin.views import iso_time
from gateway.app.errors import StateError
from gateway.observability.activity import ActivityFeed
from gateway.state.activity import ActivityEvent, Span
from gateway.state.base import GLOBAL_SCOPE, AuditStore

audit_log = logging.getLogger("loopwarden.audit")
log = logging.getLogger("loopwarden.activity")

MAX_LIMIT = 1_000
STREAM_BATCH = 100
_MAX_DIGITS = 18


def _whole_number(value: object) -> object:
    """A query number as an int: ASCII digits only; anything else is left to fail as it is."""
    if isinstance(value, str):
        if not (value.isascii() and value.isdigit() and len(value) <= _MAX_DIGITS):
            raise ValueError(
                f"must be a whole number written with the digits 0-9 (at most {_MAX_DIGITS})"
            )
        return int(value)
    return value


WholeNumber = Annotated[int, BeforeValidator(_whole_number)]


class ActivityQuery(AdminBody):
    """`GET /admin/activity`: events after a cursor, or the newest."""

    since: WholeNumber | None = None
    limit: WholeNumber = Field(default=50, ge=1, le=MAX_LIMIT)
    room: RoomKey | None = None


class SeriesQuery(AdminBody):
    """`GET /admin/activity/series`: the chart of the last hour or day."""

    span: Span = "hour"
    room: RoomKey | None = None


class StreamQuery(AdminBody):
    """`GET /admin/activity/stream`: one room's events or all, from a cursor or the newest."""

    since: WholeNumber | None = None
    room: RoomKey | None = None


def activity_line(event: ActivityEvent) -> str:
    """`2026-11-30T10:00:00Z discord:1100 parrot refusal bot_loop cooldown (…) echo: 'hi'`."""
    at = iso_time(event.at)
    what = " ".join(part for part in (event.kind, event.stage, event.code) if part)
    detail = f" ({event.detail})" if event.detail else ""
    where = f"{event.room} {event.bot}" if event.bot else event.room
    return f"{at} {where} {what}{detail} {event.sender}: {event.excerpt!r}"


class ActivityRoutes:
    """The feed's routes: two JSON reads and the live stream, bounded in number."""

    def __init__(
        self,
        admin: AdminService,
        feed: ActivityFeed,
        audit: AuditStore,
        access: AdminAccess,
        *,
        max_streams: int = 16,
        poll_seconds: float = 0.5,
        ping_interval: float = 15.0,
        send_timeout: float = 10.0,
    ) -> None:
        self._admin = admin
        self._feed = feed
        self._audit = audit
        self._access = access
        self._max_streams = max_streams
        self._poll = poll_seconds
        self._ping = ping_interval
        self._send_timeout = send_timeout
        self.streams = 0
        """Streams open now."""

    def routes(self) -> list[web.RouteDef]:
        """`/admin/activity`, `/admin/activity/series` and `/admin/activity/stream`."""
        audit = self._audit
        return [
            admin_route(
                self._admin,
                audit,
                self._access,
                ("GET", "/admin/activity", ActivityQuery, self._events),
            ),
            admin_route(
                self._admin,
                audit,
                self._access,
                ("GET", "/admin/activity/series", SeriesQuery, self._series),
            ),
            web.get("/admin/activity/stream", self._stream),
        ]

    async def _events(self, query: ActivityQuery) -> AdminAck:
        events, cursor = await self._feed.state.activity_since(query.since, query.limit, query.room)
        text = "\n".join(activity_line(e) for e in events) or "no activity"
        return AdminAck(text, data={"events": [e.as_json() for e in events], "cursor": cursor})

    async def _series(self, query: SeriesQuery) -> AdminAck:
        buckets = await self._feed.state.activity_series(query.span, self._feed.clock(), query.room)
        total_in = sum(b.messages_in for b in buckets)
        total_out = sum(b.replies_out for b in buckets)
        refused = sum(sum((b.refusals or {}).values()) for b in buckets)
        text = f"last {query.span}: {total_in} in, {total_out} out, {refused} refused"
        return AdminAck(text, data={"span": query.span, "buckets": [b.as_json() for b in buckets]})

    async def _stream(self, request: web.Request) -> web.StreamResponse:
        """The live feed as server-sent events (after auth, validation and the stream bound)."""
        response = self._refusal(request)
        if response is not None:
            _audit(request, None, response.status)
            return response
        try:
            query = await parse_admin_request(request, StreamQuery)
            resume = _last_event_id(request)
        except AdminBadRequest as exc:
            response = web.json_response({"ok": False, "error": str(exc)}, status=exc.status)
            _audit(request, None, response.status)
            return response
        _audit(request, query.room, 200)
        self.streams += 1
        try:
            async with sse_response(
                request,
                ping_interval=self._ping,
                send_timeout=self._send_timeout,
                response_cls=_NoStoreEvents,
            ) as sse:
                await self._pump(sse, query.since if resume is None else resume, query.room)
        finally:
            self.streams -= 1
        return sse

    def _refusal(self, request: web.Request) -> web.Response | None:
        """The answer when this stream may not open: not authorised, stopping, too many."""
        # The app's AdminAccess (it knows the console's sessions), as every admin route.
        denied = self._access.denied(request)
        if denied is not None:
            return denied
        if self._feed.closed:
            return _busy("the gateway is stopping")
        if self.streams >= self._max_streams:
            return _busy(f"too many activity streams open (at most {self._max_streams})")
        return None

    async def _pump(self, sse: EventSourceResponse, cursor: int | None, room: str | None) -> None:
        """Send the events after `cursor` as they are flushed, until the client or gateway goes."""
        feed = self._feed
        state = feed.state
        try:
            with feed.reading():
                while True:
                    events, following = await state.activity_since(cursor, STREAM_BATCH, room)
                    if cursor is not None and following is not None and len(events) == STREAM_BATCH:
                        newest, head = await state.activity_since(None, STREAM_BATCH, room)
                        if newest and newest[0].id > following:
                            gap = {"after": cursor, "before": newest[0].id}
                            await sse.send(json.dumps(gap), event="gap")
                            events, following = newest, head
                    for event in events:
                        await sse.send(json.dumps(event.as_json()), id=str(event.id))
                    cursor = following
                    # Closed: the read above had the feed's last batch.
                    if feed.closed or not sse.is_connected():
                        return
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(self._poll):
                            await feed.changed()
        except (ConnectionResetError, TimeoutError, StateError) as exc:
            log.debug("activity stream ended: %s", type(exc).__name__)


class _NoStoreEvents(EventSourceResponse):
    """An event stream sent `Cache-Control: no-store`, as every other admin answer.

    aiohttp-sse sets `no-cache` itself after the headers it is given, and a stream's
    headers are sent before the console's `on_response_prepare` could only add a missing
    one, so the stream says it here.
    """

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.headers["Cache-Control"] = "no-store"


def _last_event_id(request: web.Request) -> int | None:
    """A reconnecting client's `Last-Event-ID`, validated as a cursor."""
    raw = request.headers.get("Last-Event-ID")
    if raw is None:
        return None
    try:
        value = _whole_number(raw)
    except ValueError as exc:
        raise AdminBadRequest(f"Last-Event-ID: {exc}") from None
    return value if isinstance(value, int) else None


def _busy(reason: str) -> web.Response:
    return web.json_response(
        {"ok": False, "error": reason}, status=503, headers={"Retry-After": "5"}
    )


def _audit(request: web.Request, room: str | None, status: int) -> None:
    """The admin API's log line for a stream (`room` only once validated)."""
    audit_log.info(
        "admin api %s %s room=%s peer=%s status=%d",
        request.method,
        request.path,
        room or GLOBAL_SCOPE,
        request.remote,
        status,
    )


def activity_routes(
    admin: AdminService, feed: ActivityFeed, audit: AuditStore, access: AdminAccess
) -> list[web.RouteDef]:
    """The Activity feed's admin routes, for the gateway's application (reads audited)."""
    return ActivityRoutes(admin, feed, audit, access).routes()
