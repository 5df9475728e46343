"""The memory backend's Activity feed: a ring of events, counters by minute and hour, rooms.

Decisions where DESIGN.md is silent:
- Old counters are dropped as newer events arrive (by the events' own times), so an idle
  process keeps its last hour and day until traffic moves them on.
- A bucket counts at most `ROOMS_KEEP` rooms of its own; past that, a flood of new rooms
  is counted in the total only, so memory stays bounded.
"""

from __future__ import annotations

from collections import Counter, OrderedDict, deque
from collections.abc import Iterable, Sequence
from itertools import islice

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

_Counts = dict[str, dict[str, int]]
"""One bucket's counters: room → field → count."""


class MemoryActivity:
    """Events (ids 1, 2, …), counters and rooms of one process, bounded."""

    def __init__(self) -> None:
        # (id, event as appended): the event under its id is made only when it is read.
        self._events: deque[tuple[int, ActivityEvent]] = deque(maxlen=EVENTS_KEEP)
        self._last_id = 0
        # Message keys by when appended, and the same in that order for the sweep.
        self._seen: dict[str, float] = {}
        self._seen_order: deque[tuple[float, str]] = deque()
        self._counts: dict[str, OrderedDict[int, _Counts]] = {
            resolution: OrderedDict() for resolution in activity.RESOLUTIONS
        }
        self._rooms: OrderedDict[str, float] = OrderedDict()

    def append(self, events: Sequence[ActivityEvent]) -> None:
        """Store and count each event, a message key's `in` once (counted per batch)."""
        tallies: Counter[activity.Tally] = Counter()
        rooms: dict[str, float] = {}
        stored = self._events
        for event in events:
            if not self._fresh(event):
                continue
            self._last_id += 1
            stored.append((self._last_id, event))
            counted = activity.tally(event)
            if counted is not None:
                tallies[counted] += 1
            rooms[event.room] = max(event.at, rooms.get(event.room, event.at))
        latest = max(rooms.values(), default=0.0)
        for counted, n in tallies.items():
            for resolution, start, room, field in activity.counters(counted):
                counts = self._bucket(resolution, start, latest)
                held = counts.get(room)
                if held is None:
                    if len(counts) > ROOMS_KEEP:
                        continue
                    held = counts[room] = {}
                held[field] = held.get(field, 0) + n
        for room, at in rooms.items():
            self._rooms[room] = at
            self._rooms.move_to_end(room)
        while len(self._rooms) > ROOMS_KEEP:
            self._rooms.popitem(last=False)

    def _fresh(self, event: ActivityEvent) -> bool:
        """False for a message in whose key was appended within SEEN_SECONDS."""
        key = activity.dedupe_key(event)
        if key is None:
            return True
        seen, order = self._seen, self._seen_order
        since = event.at - SEEN_SECONDS
        while order and (order[0][0] <= since or len(order) >= _SEEN_KEEP):
            at, old = order.popleft()
            if seen.get(old) == at:
                del seen[old]
        held = seen.get(key)
        if held is not None and held > since:
            return False
        seen[key] = event.at
        order.append((event.at, key))
        return True

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
        newest = events[-1][0] if events else None
        if cursor is not None and (newest is None or cursor > newest):
            cursor = None
        if cursor is None:
            backwards = (e for e in reversed(events) if room is None or e[1].room == room)
            picked = list(islice(backwards, limit))
            picked.reverse()
            return [e.stored(i) for i, e in picked], newest
        # Ids in the ring are consecutive, so the first one after the cursor is found by place.
        start = max(cursor + 1 - events[0][0], 0)
        after: Iterable[tuple[int, ActivityEvent]] = islice(events, start, None)
        if room is not None:
            after = (e for e in after if e[1].room == room)
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
