"""The draining table: an LRU table of entries that go idle, freed and given back bit by bit.

A guard that keeps one entry per key (a bot pair, a call window) must forget the keys
that went quiet without ever scanning, and give the memory back: a Python dict never
shrinks by itself. `DrainingTable` does both at O(1) amortised per call:

- Entries are kept least recently used first. Each `sweep` looks at the front entry
  and frees it (and the next few) when it is idle, so n idle entries are gone within
  about n / `frees_per_call` calls once idle. Every entry was used after the front one,
  so, give or take one idle period, none goes idle before it: until the front's idle
  instant (`sweep_at`) a caller need not sweep at all.
- A table that has shrunk to a quarter of its peak is not copied at once (about a
  microsecond per entry): it becomes the draining table, all of it less recently used
  than the new one, and is emptied `moves_per_call` entries per sweep, its live entries
  moving to the front of the new table in order and its idle ones dropped. Then it is
  let go, with the arrays sized for its peak.
- `cap` bounds the entries: a new key displaces the least recently used one.

`recent` is public so that a hot path can do the common cases itself, without a method
call:
- While `now < sweep_at`, an entry found in `recent` is made the most recently used with
  `recent.move_to_end(key)`, and a miss is a new key: while a table drains, `sweep_at`
  stays -inf (every call has entries to move), so nothing drains then. Otherwise, on a
  miss, `use(key)` looks in the draining table (when `draining` is not None).
- A new key may be put straight into `recent` in the place of the entry `sweep` has just
  freed (the table does not grow, so neither the cap nor the peak can be passed);
  otherwise `add` holds it.
- A caller may free idle front entries itself, as `sweep` does, when no table drains:
  pop the front of `recent`, put a live one back at the front, and set `sweep_at` (not
  before the front's idle instant) and `swept_at = now`; then, when `len(recent) * 4 <=
  peak`, `shrink()`, which may start draining. guards/bot_loop.py frees them in batches
  and lets a new key take over an idle front's place.
`recent_get` is `recent.get`, bound once per table (a cheaper call on the hot path).
Callers never hold on to `recent` or `recent_get` across a `sweep` or a `shrink`, which
may replace them.

`sweep` frees one idle front entry per call, and up to `frees_per_call` while they went
idle before the previous sweep (a backlog): entries that go idle one by one, as in a
room that wakes up, talks and goes quiet, cost one look per call.

The pairs of guards/bot_loop.py and the counted calls of guards/call_loop/guard.py are
each one of these tables.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

# A table is replaced once it has shrunk to a quarter of its peak, if that peak was at
# least this big: rebuilding a small table would give back nothing worth the copy.
REBUILD_MIN = 1024


def _ordered_dict() -> OrderedDict[K, V]:
    """An empty OrderedDict whose method calls (`get`, `move_to_end`) CPython can specialise.

    CPython 3.11 leaves a method lookup on an OrderedDict generic while the object has no
    instance dict; creating that (empty) dict once makes each lookup on the hot path cheap.
    """
    table: OrderedDict[K, V] = OrderedDict()
    vars(table)
    return table


class DrainingTable(Generic[K, V]):
    """Entries by key in LRU order; idle ones are swept a few per call and memory given back."""

    __slots__ = (
        "_cap",
        "_frees",
        "_idle_from",
        "_moves",
        "peak",
        "draining",
        "recent",
        "recent_get",
        "sweep_at",
        "swept_at",
    )

    def __init__(
        self,
        idle_from: Callable[[V], float],
        *,
        cap: int,
        frees_per_call: int = 2,
        moves_per_call: int = 2,
    ) -> None:
        if cap < 1:
            raise ValueError(f"cap must be 1 or more, got {cap!r}")
        self._idle_from = idle_from
        self._cap = cap
        self._frees = frees_per_call
        self._moves = moves_per_call
        # The number of entries held at the peak since the table was last replaced (public
        # for the inline sweep's shrink check).
        self.peak = 0
        self.recent: OrderedDict[K, V] = _ordered_dict()
        # `recent.get`, bound once per table: CPython 3.11 specialises a call of a bound
        # builtin but not `recent.get(key)` (dict.get on an OrderedDict is no exact match).
        self.recent_get: Callable[[K], V | None] = self.recent.get
        self.draining: OrderedDict[K, V] | None = None
        # When the front entry goes idle: until then `sweep` would free nothing.
        self.sweep_at = -math.inf
        # When `sweep` last ran: an entry idle since before then is part of a backlog.
        self.swept_at = -math.inf

    def __len__(self) -> int:
        """The entries held: live ones, and idle ones not yet freed."""
        draining = self.draining
        return len(self.recent) + (len(draining) if draining else 0)

    def peek(self, key: K) -> V | None:
        """The key's entry, leaving the order as it is."""
        value = self.recent.get(key)
        draining = self.draining
        if value is None and draining is not None:
            return draining.get(key)
        return value

    def use(self, key: K) -> V | None:
        """The key's entry, now the most recently used of all; None when not held."""
        recent = self.recent
        value = recent.get(key)
        if value is not None:
            recent.move_to_end(key)
            return value
        draining = self.draining
        value = None if draining is None else draining.pop(key, None)
        if value is not None:
            recent[key] = value
        return value

    def add(self, key: K, value: V) -> None:
        """Hold a key not held yet, as the most recently used; displaces the LRU one when full."""
        recent = self.recent
        draining = self.draining
        size = len(recent) + (len(draining) if draining else 0)
        if size >= self._cap:
            (draining or recent).popitem(last=False)
            self.sweep_at = -math.inf  # a new front: look at it on the next sweep
            size -= 1
        recent[key] = value
        if size >= self.peak:
            self.peak = size + 1

    def discard(self, key: K) -> None:
        """Forget one key, if it is held."""
        if self.recent.pop(key, None) is None and self.draining is not None:
            self.draining.pop(key, None)
        self.sweep_at = -math.inf

    def remove_where(self, doomed: Callable[[K], bool]) -> int:
        """Forget every key `doomed` says so of (a scan: for admin resets); how many went."""
        removed = 0
        for table in self._tables():
            keys = [key for key in table if doomed(key)]
            for key in keys:
                del table[key]
            removed += len(keys)
        self.sweep_at = -math.inf
        self.shrink()
        return removed

    def clear(self) -> None:
        """Forget everything and let go of the arrays."""
        self.recent = _ordered_dict()
        self.recent_get = self.recent.get
        self.draining = None
        self.peak = 0
        self.sweep_at = -math.inf

    def items(self) -> Iterator[tuple[K, V]]:
        """Every entry, least recently used first."""
        for table in self._tables():
            yield from table.items()

    def sweep(self, now: float) -> V | None:
        """Free a few idle front entries, move a few draining ones; the last entry freed, if any.

        The freed entry is returned so that a caller about to hold a new key can reuse it
        instead of building one.
        """
        idle_from = self._idle_from
        recent = self.recent
        draining = self.draining
        if draining is not None:
            for _ in range(self._moves):
                if not draining:
                    break
                key, value = draining.popitem()
                if idle_from(value) > now:  # an idle entry is not worth moving
                    recent[key] = value
                    recent.move_to_end(key, last=False)
        # Entries that went idle before the last sweep are a backlog, freed several per
        # call; otherwise entries go idle one by one and one look per call keeps up.
        backlog_before, self.swept_at = self.swept_at, now
        freed = None
        self.sweep_at = -math.inf
        frees = self._frees
        front = draining or recent
        while front:
            key, value = front.popitem(last=False)
            idle_at = idle_from(value)
            if idle_at > now:  # live: back to the front, and nothing to do until it idles
                front[key] = value
                front.move_to_end(key, last=False)
                if not draining:  # while draining, every call has entries to move
                    self.sweep_at = idle_at
                break
            freed = value
            frees -= 1
            if not frees or idle_at >= backlog_before:
                break
            front = draining or recent
        if draining is not None and not draining:
            self.draining = None  # let go of it and its arrays sized for the peak
        if freed is not None and len(self.recent) * 4 <= self.peak:
            self.shrink()
        return freed

    def _tables(self) -> list[OrderedDict[K, V]]:
        """The tables, least recently used first."""
        draining = self.draining
        return [self.recent] if draining is None else [draining, self.recent]

    def shrink(self) -> None:
        """Start draining the table if it has shrunk to a quarter of its peak (see above)."""
        if self.draining is None and self.peak >= REBUILD_MIN:
            size = len(self.recent)
            if size * 4 <= self.peak:
                self.draining, self.recent = self.recent, _ordered_dict()
                self.recent_get = self.recent.get
                self.peak = size
                self.sweep_at = -math.inf
