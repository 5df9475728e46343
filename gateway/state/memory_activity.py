"""The memory backend's Activity feed: a ring of events, counters by minute and hour, rooms.

Decisions where DESIGN.md is silent:
- Old counters are dropped as newer events arrive (by the events' own times), so an idle
  process keeps its last hour and day until traffic moves them on.
- A bucket counts at most `ROOMS_KEEP` rooms of its own; past that, a flood of new rooms
  is counted in the total only, so memory stays bounded.
- The ring holds the events as appended (id 0): ids in it are consecutive, so an event's
  id is known from its place and the event under its id is made only when it is read.
- Message keys older than `SEEN_SECONDS` are forgotten once per batch (measured from the
  batch's first event) rather than per event; each `in` is still judged by its own time.
- A batch's rooms are moved to the front in the order of their newest events, so `rooms`
  is newest first within a batch too, as if its events had come one by one.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence
from itertools import count, islice
from operator import itemgetter

from gateway.state import activity
from gateway.state.activity import (
    EVENTS_KEEP,
    ROOMS_KEEP,
    SEEN_SECONDS,
    TOTAL,
    ActivityBucket,
    ActivityEvent,
    Span,
)

_KEEP_SECONDS = {"m": activity.MINUTE_KEEP_SECONDS, "h": activity.HOUR_KEEP_SECONDS}
# Message keys remembered at most, whatever their age: a flood cannot grow the set.
_SEEN_KEEP = 100_000
_NEVER = float("-inf")

_Counts = dict[str, dict[str, int]]
"""One bucket's counters: room → field → count."""


class MemoryActivity:
    """Events (ids 1, 2, …), counters and rooms of one process, bounded."""

    def __init__(self) -> None:
        self._events: deque[ActivityEvent] = deque(maxlen=EVENTS_KEEP)
        self._last_id = 0
        # Message keys by when appended, and the same in that order for forgetting them.
        self._seen: dict[str, float] = {}
        self._seen_order: deque[tuple[float, str]] = deque()
        self._counts: dict[str, OrderedDict[int, _Counts]] = {
            resolution: OrderedDict() for resolution in activity.RESOLUTIONS
        }
        self._rooms: OrderedDict[str, float] = OrderedDict()

    def append(self, events: Sequence[ActivityEvent]) -> None:
        """Store and count each event, a message key's `in` once (counted per batch)."""
        if not events:
            return
        self._forget_seen(events[0].at - SEEN_SECONDS)
        seen, order, dedupe_key = self._seen, self._seen_order, activity.dedupe_key
        kept: list[ActivityEvent] = []
        rooms: dict[str, float] = {}
        for event in events:
            at = event.at
            key = dedupe_key(event)
            if key is not None:
                held = seen.get(key)
                if held is not None and held > at - SEEN_SECONDS:
                    continue
                if len(order) >= _SEEN_KEEP:
                    self._forget_seen(at - SEEN_SECONDS)
                seen[key] = at
                order.append((at, key))
            kept.append(event)
            if rooms.get(event.room, _NEVER) < at:
                rooms[event.room] = at
        self._events.extend(kept)
        self._last_id += len(kept)
        tallies = activity.tallies(kept)
        latest = max(rooms.values(), default=0.0)
        for counted, n in tallies.items():
            for resolution, start, room, field in activity.counters(counted):
                counts = self._bucket(resolution, start, latest)
                held_counts = counts.get(room)
                if held_counts is None:
                    if len(counts) > ROOMS_KEEP:
                        continue
                    held_counts = counts[room] = {}
                held_counts[field] = held_counts.get(field, 0) + n
        for room, at in sorted(rooms.items(), key=itemgetter(1)):  # newest last
            self._rooms[room] = at
            self._rooms.move_to_end(room)
        while len(self._rooms) > ROOMS_KEEP:
            self._rooms.popitem(last=False)

    def _forget_seen(self, since: float) -> None:
        """Forget message keys appended at or before `since`, and the oldest past the cap."""
        seen, order = self._seen, self._seen_order
        while order and (order[0][0] <= since or len(order) >= _SEEN_KEEP):
            at, old = order.popleft()
            if seen.get(old) == at:
                del seen[old]

    def _bucket(self, resolution: str, start: int, now: float) -> _Counts:
        """The counters of one bucket; buckets older than the resolution keeps go first."""
        buckets = self._counts[resolution]
        counts = buckets.get(start)
        if counts is None:
            cutoff = now - _KEEP_SECONDS[resolution]
            while buckets and next(iter(buckets)) < cutoff:
                buckets.popitem(last=False)
            counts = buckets[start] = {}
        return counts

    def since(
        self, cursor: int | None, limit: int, room: str | None
    ) -> tuple[list[ActivityEvent], int | None]:
        """Events after `cursor` (None: the newest), oldest first, and the next cursor."""
        events = self._events
        newest = self._last_id if events else None
        if cursor is not None and (newest is None or cursor > newest):
            cursor = None
        if cursor is None:
            backwards: Iterable[tuple[int, ActivityEvent]] = zip(
                count(self._last_id, -1), reversed(events), strict=False
            )
            if room is not None:
                backwards = ((i, e) for i, e in backwards if e.room == room)
            picked = list(islice(backwards, limit))
            picked.reverse()
            return [e.stored(i) for i, e in picked], newest
        first = self._last_id - len(events) + 1
        start = max(cursor + 1 - first, 0)
        after: Iterable[tuple[int, ActivityEvent]] = zip(
            count(first + start), islice(events, start, None), strict=False
        )
        if room is not None:
            after = ((i, e) for i, e in after if e.room == room)
        found = [e.stored(i) for i, e in islice(after, limit)]
        return found, found[-1].id if len(found) == limit else newest

    def series(self, span: Span, now: float, room: str | None) -> list[ActivityBucket]:
        """The chart's buckets, oldest first."""
        resolution, starts = activity.span_buckets(span, now)
        buckets = self._counts[resolution]
        name = TOTAL if room is None else room
        return [activity.bucket(t, buckets.get(t, {}).get(name, {})) for t in starts]

    def rooms(self) -> list[tuple[str, float]]:
        """Rooms seen, newest first."""
        return [(room, at) for room, at in reversed(self._rooms.items())]
