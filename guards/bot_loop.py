"""Bot-to-bot pair budget: stop two bots from answering each other forever.

One event is one bot-authored message a hosted bot received from another bot. The two
bot ids form a direction-independent pair, separately per scope (room). A pair may have
`max_events_per_window` events in any sliding window of `window_seconds`; the event that
would exceed that is refused and opens a cooldown of `cooldown_seconds`, during which
every event of the pair is refused without being recorded. After the cooldown the pair
starts a fresh window.

Memory: the pairs are one table in least-recently-used order. A pair with no event in
its window and no running cooldown is idle, and forgetting it changes no decision. Each
call looks at the least recently used pair and frees it (and the next) when idle, so n
idle pairs are freed within about n/2 calls once they are idle, without any scan. A dict
never gives its memory back by itself, so a table that has shrunk to a quarter of its
peak is replaced by a fresh one, the survivors moved over a few per call (no stall).
`max_pairs` caps the table: a new pair displaces the least recently used one.

Decisions the design left open:
- `now` must not go backwards (the default clock is read under the lock, so it never
  does); with earlier injected times the window is approximate, still bounded.
- `reset()` and `snapshot()` take `scope=None` to mean every scope, so the global scope
  (None) cannot be addressed alone; gateways name their scopes (`"*"` for global).
- `snapshot()` lists live pairs only (an event in the window or a running cooldown);
  idle pairs not yet forgotten are skipped.
- `from_dict` treats a key whose value is None as absent, accepts numeric strings
  ("20", "1.5") because admin commands and environment variables deliver text, clamps
  any budget below 1 (even 0.5) to 1, and rejects a non-whole budget of 1 or more and
  infinite or NaN durations. Building a policy directly with a non-bool `enabled` or a
  non-int budget is a programming error (TypeError), not a config error.
- An event, refused or not, makes its pair the most recently used: a pair that keeps
  trying during its cooldown is never the one `max_pairs` displaces. The displaced pair
  may be in cooldown; set `max_pairs` far above any real pair count.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping, MutableSequence
from dataclasses import dataclass
from typing import Literal

Reason = Literal["ok", "budget_exceeded", "cooldown", "disabled"]
PairKey = tuple[str | None, str, str]

_NO_COOLDOWN = -math.inf
_OK, _BUDGET_EXCEEDED, _COOLDOWN = 0, 1, 2
_REASONS: tuple[Reason, Reason, Reason] = ("ok", "budget_exceeded", "cooldown")

# Idle pairs freed per call: n idle pairs give their memory back in n/2 calls.
_RELEASE_PER_CALL = 2
# A table is rebuilt once it has shrunk to a quarter of its peak (and the peak was at
# least this big: rebuilding a small table would give back nothing worth the copy).
_REBUILD_MIN = 1024
# Up to this budget a pair's event times are a list: evicting the oldest shifts at most
# this many pointers, which costs less than a deque and a fraction of its memory (a deque
# allocates a 64-slot block per pair). Larger budgets get a deque to stay O(1).
_LIST_MAX_BUDGET = 64

_TRUE_WORDS = frozenset({"true", "1", "yes", "on"})
_FALSE_WORDS = frozenset({"false", "0", "no", "off"})


def pair_key(a: str, b: str) -> tuple[str, str]:
    """The two bot ids in sorted order: (A, B) and (B, A) share one budget."""
    return (a, b) if a <= b else (b, a)


def _is_number(value: object) -> bool:
    """True for an int or float that is not a bool."""
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True)
class BotLoopPolicy:
    """How many bot-to-bot events a pair may have per window, and how long it cools down."""

    enabled: bool = True
    max_events_per_window: int = 20
    window_seconds: float = 60.0
    cooldown_seconds: float = 60.0

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise TypeError(f"enabled must be true or false, got {self.enabled!r}")
        budget = self.max_events_per_window
        if isinstance(budget, bool) or not isinstance(budget, int):
            raise TypeError(
                f"max_events_per_window must be a whole number (e.g. 20), got {budget!r}"
            )
        if budget < 1:
            # A budget of 0 would refuse every bot message forever; `enabled` says that.
            object.__setattr__(self, "max_events_per_window", 1)
        window = self.window_seconds
        if not (_is_number(window) and math.isfinite(window) and window > 0):
            raise ValueError(
                "window_seconds must be a finite number of seconds above 0 (e.g. 60), "
                f"got {window!r}"
            )
        cooldown = self.cooldown_seconds
        if not (_is_number(cooldown) and math.isfinite(cooldown) and cooldown >= 0):
            raise ValueError(
                "cooldown_seconds must be a finite number of seconds, 0 or more (e.g. 60), "
                f"got {cooldown!r}"
            )

    @classmethod
    def from_dict(cls, data: Mapping[str, object] | None) -> BotLoopPolicy:
        """A policy from a config mapping; None or {} gives the defaults, unknown keys ignored."""
        if not data:
            return cls()
        default = cls()
        budget = _number("max_events_per_window", data.get("max_events_per_window"))
        if budget is not None and budget >= 1 and not float(budget).is_integer():
            raise ValueError(
                f"max_events_per_window must be a whole number (e.g. 20), got {budget!r}"
            )
        window = _number("window_seconds", data.get("window_seconds"))
        cooldown = _number("cooldown_seconds", data.get("cooldown_seconds"))
        return cls(
            enabled=_flag("enabled", data.get("enabled"), default=default.enabled),
            max_events_per_window=(
                default.max_events_per_window if budget is None else max(1, int(budget))
            ),
            window_seconds=default.window_seconds if window is None else float(window),
            cooldown_seconds=default.cooldown_seconds if cooldown is None else float(cooldown),
        )


def _flag(field: str, value: object, *, default: bool) -> bool:
    """A boolean config value: a bool, 0/1, or a word such as "false", "no", "on"."""
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        word = value.strip().casefold()
        if word in _TRUE_WORDS:
            return True
        if word in _FALSE_WORDS:
            return False
    raise ValueError(f"{field} must be true or false (or yes/no, on/off, 1/0), got {value!r}")


def _number(field: str, value: object) -> int | float | None:
    """A finite numeric config value (numbers or numeric strings; bools are not numbers)."""
    if value is None:
        return None
    number: int | float = math.nan
    if isinstance(value, int | float) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str):
        text = value.strip()
        try:
            number = int(text)
        except ValueError:
            try:
                number = float(text)
            except ValueError:
                number = math.nan
    try:
        finite = math.isfinite(number)
    except OverflowError:  # an int too large for a float is no duration either
        finite = False
    if not finite:
        raise ValueError(f"{field} must be a finite number (e.g. 60), got {value!r}")
    return number


@dataclass(frozen=True, slots=True)
class PairDecision:
    """The verdict on one event: admit it or not, why, and when to try again."""

    allowed: bool
    reason: Reason
    retry_after: float
    count: int


@dataclass(frozen=True, slots=True)
class PairSnapshot:
    """One live pair for status commands: its events in the window and cooldown left."""

    scope: str | None
    bot_a: str
    bot_b: str
    count: int
    cooldown_remaining: float


class _Pair:
    """Mutable per-pair state: its table key, admitted event times (oldest first), cooldown end."""

    __slots__ = ("cooldown_until", "key", "times")

    def __init__(self, key: PairKey, times: MutableSequence[float]) -> None:
        # The stored key makes `move_to_end` compare by identity, a third cheaper.
        self.key = key
        # Refused events are never recorded, so `times` holds at most the budget.
        self.times = times
        self.cooldown_until = _NO_COOLDOWN


def _short_times(first: float) -> MutableSequence[float]:
    """Event times for a small budget: a list."""
    return [first]


def _long_times(first: float) -> MutableSequence[float]:
    """Event times for a large budget: a deque, O(1) at both ends."""
    return deque((first,))


class BotLoopGuard:
    """Admits or drops bot-to-bot events per pair and room; thread-safe, O(1) amortised."""

    def __init__(
        self,
        policy: BotLoopPolicy | None = None,
        *,
        clock: Callable[[], float] | None = None,
        max_pairs: int = 100_000,
    ) -> None:
        if max_pairs < 1:
            raise ValueError(f"max_pairs must be 1 or more, got {max_pairs!r}")
        self._policy = policy or BotLoopPolicy()
        self._enabled = self._policy.enabled
        self._budget = self._policy.max_events_per_window
        self._window = self._policy.window_seconds
        self._cooldown = self._policy.cooldown_seconds
        self._clock = clock or time.monotonic
        self._max_pairs = max_pairs
        self._new_times = _short_times if self._budget <= _LIST_MAX_BUDGET else _long_times
        # Least recently used first: the front is the pair to free or displace next.
        self._pairs: OrderedDict[PairKey, _Pair] = OrderedDict()
        # A table that shrank is not copied at once (a stall of about a microsecond per
        # pair): it becomes `_draining`, all of it less recently used than `_pairs`, and
        # is emptied a few pairs per call, then dropped with its oversized arrays.
        self._draining: OrderedDict[PairKey, _Pair] | None = None
        # The number of pairs held at the peak since the table was last replaced.
        self._peak = 0
        # When the front pair goes idle: until then no pair needs a look (see `_sweep`).
        self._sweep_at = -math.inf
        self._lock = threading.Lock()
        # acquire/release cost half of `with` on CPython 3.11, and `observe` is the hot path.
        self._acquire = self._lock.acquire
        self._release = self._lock.release

    @property
    def enabled(self) -> bool:
        """Whether the guard refuses anything at all."""
        return self._enabled

    @property
    def policy(self) -> BotLoopPolicy:
        """The policy this guard enforces."""
        return self._policy

    def __len__(self) -> int:
        """The number of pairs held (live ones, and idle ones not yet freed)."""
        draining = self._draining
        return len(self._pairs) + (len(draining) if draining else 0)

    def observe(
        self,
        *,
        self_bot_id: str,
        sender_bot_id: str,
        now: float | None = None,
        scope: str | None = None,
    ) -> bool:
        """Record one bot-authored event of the pair; True to admit it, False to drop it."""
        if not self._enabled:
            return True
        if self_bot_id <= sender_bot_id:
            key = (scope, self_bot_id, sender_bot_id)
        else:
            key = (scope, sender_bot_id, self_bot_id)
        self._acquire()
        try:
            return self._admit(key, self._clock() if now is None else now) == _OK
        finally:
            self._release()

    def decide(
        self,
        *,
        self_bot_id: str,
        sender_bot_id: str,
        now: float | None = None,
        scope: str | None = None,
    ) -> PairDecision:
        """Like `observe`, with the reason, the seconds until retry and the window count."""
        if not self._enabled:
            return PairDecision(allowed=True, reason="disabled", retry_after=0.0, count=0)
        a, b = pair_key(self_bot_id, sender_bot_id)
        key = (scope, a, b)
        with self._lock:
            at = self._clock() if now is None else now
            code = self._admit(key, at)
            pair = self._pairs[key]
            # `_admit` evicted expired events unless it stopped at a running cooldown.
            count = _live_count(pair, at, self._window) if code == _COOLDOWN else len(pair.times)
            if code == _OK:
                retry_after = 0.0
            elif code == _BUDGET_EXCEEDED:
                # Exactly the cooldown: `(at + cooldown) - at` may round below it.
                retry_after = self._cooldown
            else:
                retry_after = pair.cooldown_until - at
        return PairDecision(
            allowed=code == _OK, reason=_REASONS[code], retry_after=retry_after, count=count
        )

    def reset(self, scope: str | None = None, bot_id: str | None = None) -> None:
        """Forget pairs: all of them, one scope's, one bot's, or one bot's in one scope."""
        with self._lock:
            self._sweep_at = -math.inf  # the front may change: look at it on the next call
            if scope is None and bot_id is None:
                self._pairs = OrderedDict()
                self._draining = None
                self._peak = 0
                return
            for table in self._tables():
                doomed = [
                    key
                    for key in table
                    if (scope is None or key[0] == scope) and (bot_id is None or bot_id in key[1:])
                ]
                for key in doomed:
                    del table[key]
            self._shrink()

    def snapshot(self, scope: str | None = None, *, now: float | None = None) -> list[PairSnapshot]:
        """The live pairs (of one scope, or all), least recently used first."""
        with self._lock:
            at = self._clock() if now is None else now
            return [
                PairSnapshot(
                    scope=key[0],
                    bot_a=key[1],
                    bot_b=key[2],
                    count=_live_count(pair, at, self._window),
                    cooldown_remaining=max(0.0, pair.cooldown_until - at),
                )
                for table in self._tables()
                for key, pair in table.items()
                if (scope is None or key[0] == scope) and _idle_from(pair, self._window) > at
            ]

    def _tables(self) -> list[OrderedDict[PairKey, _Pair]]:
        """The tables, least recently used first."""
        draining = self._draining
        return [self._pairs] if draining is None else [draining, self._pairs]

    def _admit(self, key: PairKey, now: float) -> int:
        """Apply one event to its pair (lock held); returns _OK, _BUDGET_EXCEEDED or _COOLDOWN."""
        if now >= self._sweep_at:
            self._sweep(now)
        pairs = self._pairs
        pair = pairs.get(key)
        if pair is not None:
            pairs.move_to_end(pair.key)
        else:
            draining = self._draining
            pair = None if draining is None else draining.pop(key, None)
            if pair is None:
                if len(self) >= self._max_pairs:
                    (draining or pairs).popitem(last=False)
                pairs[key] = _Pair(key, self._new_times(now))
                self._peak = max(self._peak, len(self))
                return _OK
            pairs[key] = pair
        times = pair.times
        if pair.cooldown_until != _NO_COOLDOWN:
            if now < pair.cooldown_until:
                return _COOLDOWN
            pair.cooldown_until = _NO_COOLDOWN
            times.clear()
        window = self._window
        while times and times[0] + window <= now:
            del times[0]
        if len(times) < self._budget:
            times.append(now)
            return _OK
        pair.cooldown_until = now + self._cooldown
        return _BUDGET_EXCEEDED

    def _sweep(self, now: float) -> None:
        """Free the least recently used pairs while they are idle, a few per call (lock held).

        Every pair was used after the front one, so none can be idle before the front is,
        give or take one window or cooldown: until the front goes idle (`_sweep_at`) the
        hot path skips this altogether. A draining table is emptied a few pairs per call:
        its most recently used live pairs move to the front of the new table, keeping the
        order, and idle ones are dropped.
        """
        draining = self._draining
        window = self._window
        if draining is not None:
            pairs = self._pairs
            for _ in range(_RELEASE_PER_CALL):
                if not draining:
                    break
                key, pair = draining.popitem()
                if _idle_from(pair, window) > now:  # an idle pair is not worth moving
                    pairs[key] = pair
                    pairs.move_to_end(key, last=False)
        for _ in range(_RELEASE_PER_CALL):
            table = draining or self._pairs
            if not table:
                break
            key, pair = next(iter(table.items()))
            idle_from = _idle_from(pair, window)
            if idle_from > now:
                self._sweep_at = idle_from
                break
            del table[key]
        else:
            # Both were idle: the next one may be too, so look again on the next call.
            self._sweep_at = -math.inf
        if draining is not None:
            if draining:
                self._sweep_at = -math.inf
            else:
                self._draining = None  # drop it and its arrays sized for the peak
        self._shrink()

    def _shrink(self) -> None:
        """Start draining the table once it has shrunk to a quarter of its peak (lock held)."""
        if self._draining is None and self._peak >= _REBUILD_MIN:
            size = len(self._pairs)
            if size * 4 <= self._peak:
                self._draining, self._pairs = self._pairs, OrderedDict()
                self._peak = size
                self._sweep_at = -math.inf


def _idle_from(pair: _Pair, window: float) -> float:
    """When the pair goes idle: its cooldown ends, or its last event leaves the window."""
    if pair.cooldown_until != _NO_COOLDOWN:
        # A finished cooldown means a fresh window: the events before it no longer count.
        return pair.cooldown_until
    return pair.times[-1] + window


def _live_count(pair: _Pair, now: float, window: float) -> int:
    """Events of the pair that still count at `now` (0 after a finished cooldown)."""
    if pair.cooldown_until != _NO_COOLDOWN and now >= pair.cooldown_until:
        return 0
    return sum(1 for t in pair.times if t + window > now)
