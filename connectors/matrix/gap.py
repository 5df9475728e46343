"""A sync gap: the events a `limited` timeline left out, paged back with `/messages`.

When more events arrived in a room than a sync's timeline limit (the gateway was down, or
busy with the previous batch), the sync gives only the newest of them with `limited: true`
and a `prev_batch` token; the older ones were never seen. `fill_gap` asks `/messages`
backwards from `prev_batch` to the previous sync position (the `to` token), page by page,
and gives the missed events oldest first, so the connector hands them over before the batch.

Decisions where DESIGN.md is silent:
- Paging stops at the previous sync position (an empty page, or no `end` token), at an
  event older than the connector's first sync (those are never answered), or after
  `max_pages` pages: a gap still open then is `complete=False`, and the connector logs it
  and counts it once (`sync_gap`); the newest missed events, the fetched ones, are still
  handed over, so a reply never skips past the messages right before the batch.
- `M_LIMIT_EXCEEDED` waits the homeserver's `retry_after_ms` and asks the same page again
  (the attempt counts against `max_pages`); any other Matrix error answer leaves the gap
  open (`complete=False`, its errcode in `why`), since a room the bot can no longer read
  would otherwise stop its syncing for good. A connection failure or timeout is raised:
  the connector syncs the batch again after a pause.
- An event the batch itself holds is left out, so nothing is handed over twice.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from nio import AsyncClient, MessageDirection, RoomMessagesResponse
from nio.responses import Timeline

from connectors.matrix.outbound import LIMIT_EXCEEDED, errcode, retry_after


@dataclass(frozen=True, slots=True)
class Gap:
    """The missed events of one room's timeline (oldest first), and whether all were found."""

    events: list[object] = field(default_factory=list)
    complete: bool = True
    why: str = ""


async def fill_gap(
    client: AsyncClient,
    room_id: str,
    timeline: Timeline,
    *,
    since: str,
    since_ms: int,
    page_size: int,
    max_pages: int,
    events_filter: dict[str, Any] | None = None,
    sleep: Callable[[float], Awaitable[None]],
) -> Gap:
    """The events between the sync position `since` and a limited `timeline` of `room_id`.

    `events_filter` is the room event filter of the sync (e.g. `not_senders`), so a page
    holds the kind of events the timeline does.
    """
    if not timeline.limited or not timeline.prev_batch:
        return Gap()
    held = {_event_id(e.source) for e in timeline.events} - {None}
    newest_first: list[object] = []
    start: str = timeline.prev_batch
    for _ in range(max_pages):
        answer = await client.room_messages(
            room_id,
            start=start,
            end=since,
            direction=MessageDirection.back,
            limit=page_size,
            message_filter=events_filter,
        )
        if not isinstance(answer, RoomMessagesResponse):
            why = errcode(answer)
            if why != LIMIT_EXCEEDED:
                return Gap(_oldest_first(newest_first, held), complete=False, why=why)
            await sleep(retry_after(answer.retry_after_ms))
            continue
        page = [event.source for event in answer.chunk]
        newest_first.extend(page)
        if not page or not answer.end or _before(page[-1], since_ms):
            return Gap(_oldest_first(newest_first, held))
        start = answer.end
    return Gap(_oldest_first(newest_first, held), complete=False, why=f"{max_pages} pages")


def _oldest_first(newest_first: list[object], held: set[str | None]) -> list[object]:
    """The fetched events oldest first, each once, without those the batch holds."""
    seen = set(held)
    events: list[object] = []
    for event in reversed(newest_first):
        event_id = _event_id(event)
        if event_id is not None:
            if event_id in seen:
                continue
            seen.add(event_id)
        events.append(event)
    return events


def _event_id(event: object) -> str | None:
    value = event.get("event_id") if isinstance(event, Mapping) else None
    return value if isinstance(value, str) else None


def _before(event: object, since_ms: int) -> bool:
    """True when `event` was sent before the first sync (or says no time: fail closed)."""
    sent = event.get("origin_server_ts") if isinstance(event, Mapping) else None
    return not isinstance(sent, int) or sent < since_ms
