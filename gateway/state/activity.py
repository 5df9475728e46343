"""The Activity feed's records and counters, shared by every StateStore backend (DESIGN.md §4).

An `ActivityEvent` is one thing the gateway did or decided, as the console's Activity page
lists it; `ActivityBucket` is one bar of its chart. What a backend keeps, and how it counts,
is written here once:
- Events get ids from the backend, one more per event, so an id is a cursor: a reader asks
  for the events after the last one it saw. A message reaching a hosted bot (`in`) is
  appended once per message key, however many hosted bots or replicas report it; a
  message key seen within `SEEN_SECONDS` is not appended again.
- `counter_field` says which counter an event adds one to: `in`, `out` (a reply
  delivered), `r:<stage>` (a refusal, by the guard or stage that made it); shadow verdicts,
  notices and routine refusals (`ROUTINE_CODES`: every hosted bot turns away each message
  not meant for it) are listed but not counted, so the chart shows what the guards did.
  Every event is counted in its minute and its hour, for its room and for every room
  (`TOTAL`): a batch's `tallies`, each spread over its `counters`.
- `encode` / `decode`: the JSON form the sqlite and redis backends store (ASCII); a record
  that is not one (not JSON, a field missing or of the wrong type) decodes to None and is
  skipped.
Retention: the newest `EVENTS_KEEP` events; minute counters for `MINUTE_KEEP_SECONDS`,
hour counters for `HOUR_KEEP_SECONDS`; the `ROOMS_KEEP` most recently seen rooms.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal, NamedTuple, get_args

Kind = Literal["in", "reply", "refusal", "shadow", "notice"]
ROUTINE_CODES = frozenset({"not_addressed"})
"""Refusal codes that are routine, not news: listed in the feed, not counted in the chart."""
Span = Literal["hour", "day"]

KINDS: frozenset[str] = frozenset(get_args(Kind))
TOTAL = "*"
"""The room name the counters of every room together are kept under."""

EVENTS_KEEP = 10_000
ROOMS_KEEP = 10_000
SEEN_SECONDS = 120.0
"""Seconds a message key is remembered: every hosted bot sees a message within moments."""
MINUTE_KEEP_SECONDS = 3_660
HOUR_KEEP_SECONDS = 90_000

RESOLUTIONS = ("m", "h")
"""Counter resolutions: per minute and per hour (`starts`)."""

_SPANS: dict[Span, tuple[str, int, int]] = {"hour": ("m", 60, 60), "day": ("h", 3_600, 24)}
"""A chart span: the counters it reads, their bucket seconds, and how many buckets."""


class ActivityEvent(NamedTuple):
    """One event of the feed; `id` is 0 until a backend has appended it.

    A NamedTuple rather than a frozen dataclass: the gateway makes one per decision, tens
    of thousands a second under load, and a frozen dataclass takes four times as long to
    build.

    `at` is wall time; `bot` the hosted bot's id; `stage` and `code` the stage and the
    decision's code (`delivery`/`sent` for a reply); `detail` the decision's reason in
    words; `excerpt` the start of the message text on one line (of the reply's text for
    a reply), shown as text, never as markup; `message` the message's key.
    """

    id: int
    at: float
    room: str
    bot: str
    sender: str
    kind: Kind
    stage: str
    code: str
    detail: str
    excerpt: str
    message: str

    def stored(self, event_id: int) -> ActivityEvent:
        """This event under the id a backend gave it."""
        return ActivityEvent._make((event_id, *self[1:]))  # `_replace` takes twice as long

    def as_json(self) -> dict[str, object]:
        """The event as the admin API and the live stream answer it."""
        return {
            "id": self.id,
            "at": self.at,
            "room": self.room,
            "bot": self.bot,
            "sender": self.sender,
            "kind": self.kind,
            "stage": self.stage,
            "code": self.code,
            "detail": self.detail,
            "excerpt": self.excerpt,
            "message": self.message,
            "routine": self.kind == "refusal" and self.code in ROUTINE_CODES,
        }


@dataclass(frozen=True, slots=True)
class ActivityBucket:
    """One bar of the chart: the bucket's start (Unix seconds) and what was counted in it."""

    t: int
    messages_in: int = 0
    replies_out: int = 0
    refusals: Mapping[str, int] | None = None

    def as_json(self) -> dict[str, object]:
        """`{t, in, out, refusals: {guard: n}}`."""
        return {
            "t": self.t,
            "in": self.messages_in,
            "out": self.replies_out,
            "refusals": dict(self.refusals or {}),
        }


def dedupe_key(event: ActivityEvent) -> str | None:
    """The key an event is appended once per (a message in: its message key), else None."""
    return event.message if event.kind == "in" else None


def counter_field(event: ActivityEvent) -> str | None:
    """The counter an event adds one to, None when it is not counted."""
    if event.kind == "in":
        return "in"
    if event.kind == "reply":
        return "out"
    if event.kind == "refusal" and event.code not in ROUTINE_CODES:
        return "r:" + event.stage
    return None


def starts(at: float) -> tuple[int, int]:
    """The starts of the minute and the hour an instant falls in."""
    return int(at // 60) * 60, int(at // 3_600) * 3_600


Tally = tuple[str, str, int]
"""What events count, before they are spread over counters: room, field, minute start."""


def tallies(events: Iterable[ActivityEvent]) -> dict[Tally, int]:
    """How many of `events` each (room, field, minute) counts: a batch is counted at once."""
    # Keyed by the minute's number while counting: one division per event, no int().
    by_minute: dict[tuple[str, str, float], int] = {}
    for event in events:
        field = counter_field(event)
        if field is not None:
            counted = (event.room, field, event.at // 60)
            by_minute[counted] = by_minute.get(counted, 0) + 1
    return {
        (room, field, starts(minute * 60)[0]): n for (room, field, minute), n in by_minute.items()
    }


def counters(counted: Tally) -> tuple[tuple[str, int, str, str], ...]:
    """The counters (resolution, bucket start, room, field) a tally adds to."""
    room, field, at = counted
    minute, hour = starts(at)
    return (
        ("m", minute, room, field),
        ("m", minute, TOTAL, field),
        ("h", hour, room, field),
        ("h", hour, TOTAL, field),
    )


def span_buckets(span: Span, now: float) -> tuple[str, list[int]]:
    """The counters a chart span reads and its buckets' starts, oldest first, ending at `now`."""
    resolution, seconds, count = _SPANS[span]
    newest = int(now // seconds) * seconds
    return resolution, [newest - seconds * back for back in range(count - 1, -1, -1)]


def bucket(t: int, counts: Mapping[str, int]) -> ActivityBucket:
    """The bar of bucket `t` from its counters (`in`, `out`, `r:<stage>`)."""
    refusals = {field[2:]: n for field, n in counts.items() if field.startswith("r:") and n}
    return ActivityBucket(t, counts.get("in", 0), counts.get("out", 0), refusals)


def encode(event: ActivityEvent) -> str:
    """The JSON record (ASCII) of an event, its id left out (the backend keeps it)."""
    return json.dumps(event[1:], separators=(",", ":"))


def decode(event_id: int, raw: object) -> ActivityEvent | None:
    """The event a record holds under `event_id`; None when it is not a readable one."""
    if not isinstance(raw, str | bytes):
        return None
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, list) or len(data) != 10:
        return None
    at, *texts = data
    if not isinstance(at, int | float) or not all(isinstance(text, str) for text in texts):
        return None
    room, bot, sender, kind, stage, code, detail, excerpt, message = texts
    if kind not in KINDS:
        return None
    return ActivityEvent(
        event_id, float(at), room, bot, sender, kind, stage, code, detail, excerpt, message
    )
