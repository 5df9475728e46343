"""Bot-to-bot pair budget: stop two bots from answering each other forever.

One event is one bot-authored message a hosted bot received from another bot. The two
bot ids form a direction-independent pair, separately per scope (room). A pair may have
`max_events_per_window` events in any sliding window of `window_seconds`; the event that
would exceed that is refused and opens a cooldown of `cooldown_seconds`, during which
every event of the pair is refused without being recorded. After the cooldown the pair
starts a fresh window.

Memory: pairs live in two generations rotated once per period (the longer of window and
cooldown). A pair untouched for a whole generation is idle and is forgotten one to two
periods after its last event or the end of its cooldown; forgotten pairs are freed two
per call, so n idle pairs give their memory back within about n/2 calls.

Decisions the design left open:
- `now` must not go backwards (the default clock is read under the lock, so it never
  does); with earlier injected times the window is approximate, still bounded.
- `reset()` and `snapshot()` take `scope=None` to mean every scope, so the global scope
  (None) cannot be addressed alone; gateways name their scopes (`"*"` for global).
- `snapshot()` lists live pairs only (an event in the window or a running cooldown);
  idle pairs not yet forgotten are skipped.
- `from_dict` treats a key whose value is None as absent, accepts numeric strings
  ("20", "1.5") because admin commands and environment variables deliver text, and
  rejects a non-whole `max_events_per_window` and infinite or NaN durations.
- `max_pairs` is an LRU cap at generation granularity: a new pair displaces one that was
  not touched since the last rotation, even one in cooldown (when every pair is young,
  they all age first). The cap bounds memory; set it far above any real room count.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, MutableSequence
from dataclasses import dataclass
from typing import Literal

Reason = Literal["ok", "budget_exceeded", "cooldown", "disabled"]
PairKey = tuple[str | None, str, str]

_NO_COOLDOWN = -math.inf
_OK, _BUDGET_EXCEEDED, _COOLDOWN = 0, 1, 2
_REASONS: tuple[Reason, Reason, Reason] = ("ok", "budget_exceeded", "cooldown")

# Retired (idle) pairs freed per call: n idle pairs give their memory back in n/2 calls.
_RELEASE_PER_CALL = 2
# Up to this budget a pair's event times are a list: evicting the oldest shifts at most
# this many pointers, which costs less than a deque and a fraction of its memory (a deque
# allocates a 64-slot block per pair). Larger budgets get a deque to stay O(1).
_LIST_MAX_BUDGET = 64

_TRUE_WORDS = frozenset({"true", "1", "yes", "on"})
_FALSE_WORDS = frozenset({"false", "0", "no", "off"})


def pair_key(a: str, b: str) -> tuple[str, str]:
    """The two bot ids in sorted order: (A, B) and (B, A) share one budget."""
    return (a, b) if a <= b else (b, a)


@dataclass(frozen=True, slots=True)
class BotLoopPolicy:
    """How many bot-to-bot events a pair may have per window, and how long it cools down."""

    enabled: bool = True
    max_events_per_window: int = 20
    window_seconds: float = 60.0
    cooldown_seconds: float = 60.0

    def __post_init__(self) -> None:
        if self.max_events_per_window < 1:
            # A budget of 0 would refuse every bot message forever; `enabled` says that.
            object.__setattr__(self, "max_events_per_window", 1)
        if not (math.isfinite(self.window_seconds) and self.window_seconds > 0):
            raise ValueError(
                "window_seconds must be a finite number of seconds above 0 (e.g. 60), "
                f"got {self.window_seconds!r}"
            )
        if not (math.isfinite(self.cooldown_seconds) and self.cooldown_seconds >= 0):
            raise ValueError(
                "cooldown_seconds must be a finite number of seconds, 0 or more (e.g. 60), "
                f"got {self.cooldown_seconds!r}"
            )

    @classmethod
    def from_dict(cls, data: Mapping[str, object] | None) -> BotLoopPolicy:
        """A policy from a config mapping; None or {} gives the defaults, unknown keys ignored."""
        if not data:
            return cls()
        default = cls()
        budget = _number("max_events_per_window", data.get("max_events_per_window"))
        if budget is not None and not float(budget).is_integer():
            raise ValueError(
                f"max_events_per_window must be a whole number (e.g. 20), got {budget!r}"
            )
        window = _number("window_seconds", data.get("window_seconds"))
        cooldown = _number("cooldown_seconds", data.get("cooldown_seconds"))
        return cls(
            enabled=_flag("enabled", data.get("enabled"), default=default.enabled),
            max_events_per_window=(
                default.max_events_per_window if budget is None else int(budget)
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
    number: int | float
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
    else:
        number = math.nan
    if not math.isfinite(number):
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
    """Mutable per-pair state: admitted event times (oldest first) and cooldown end."""

    __slots__ = ("cooldown_until", "times")

    def __init__(self, times: MutableSequence[float]) -> None:
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
        # A pair untouched for this long has no event in its window and no running cooldown.
        self._period = max(self._window, self._cooldown)
        self._clock = clock or time.monotonic
        self._max_pairs = max_pairs
        self._new_times = _short_times if self._budget <= _LIST_MAX_BUDGET else _long_times
        # Two generations instead of an LRU list: `young` holds the pairs touched since
        # the last rotation, `old` those touched in the generation before and not since.
        # A rotation happens once per period, so when the next one comes every pair still
        # in `old` has been untouched for a whole period: it is idle and is retired as a
        # whole. The hot path pays one dict lookup, and each generation is a fresh dict,
        # so a table that shrank gives its memory back without an explicit rebuild.
        self._young: dict[PairKey, _Pair] = {}
        self._old: dict[PairKey, _Pair] = {}
        # Retired generations are freed a few pairs per call: dropping a million-pair
        # dict at once would stall one unlucky caller for a noticeable fraction of a second.
        self._retired: list[dict[PairKey, _Pair]] = []
        self._next_rotation = -math.inf
        self._maintain_at = -math.inf
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
        return len(self._young) + len(self._old)

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
            pair = self._young[key]
            # `_admit` evicted expired events unless it stopped at a running cooldown.
            count = _live_count(pair, at, self._window) if code == _COOLDOWN else len(pair.times)
            retry_after = 0.0 if code == _OK else pair.cooldown_until - at
        return PairDecision(
            allowed=code == _OK, reason=_REASONS[code], retry_after=retry_after, count=count
        )

    def reset(self, scope: str | None = None, bot_id: str | None = None) -> None:
        """Forget pairs: all of them, one scope's, one bot's, or one bot's in one scope."""
        with self._lock:
            if scope is None and bot_id is None:
                self._young, self._old, self._retired = {}, {}, []
                self._maintain_at = self._next_rotation
                return
            for table in (self._young, self._old):
                doomed = [
                    key
                    for key in table
                    if (scope is None or key[0] == scope) and (bot_id is None or bot_id in key[1:])
                ]
                for key in doomed:
                    del table[key]

    def snapshot(self, scope: str | None = None, *, now: float | None = None) -> list[PairSnapshot]:
        """The live pairs (of one scope, or all), the older generation first."""
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
                for table in (self._old, self._young)
                for key, pair in table.items()
                if (scope is None or key[0] == scope) and _is_live(pair, at, self._window)
            ]

    def _admit(self, key: PairKey, now: float) -> int:
        """Apply one event to its pair (lock held); returns _OK, _BUDGET_EXCEEDED or _COOLDOWN."""
        if now >= self._maintain_at:
            self._maintain(now)
        young = self._young
        pair = young.get(key)
        if pair is None:
            pair = self._old.pop(key, None)
            if pair is None:
                if len(young) + len(self._old) >= self._max_pairs:
                    self._evict_one(now)
                self._young[key] = _Pair(self._new_times(now))
                return _OK
            young[key] = pair
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

    def _maintain(self, now: float) -> None:
        """Rotate generations when due and free a few retired pairs (lock held)."""
        if now >= self._next_rotation:
            # The first call at or after the due time rotates, so a rotation overdue by a
            # whole period means no call at all since then: the young pairs are idle too.
            if self._old:
                self._retired.append(self._old)
            if now >= self._next_rotation + self._period:
                if self._young:
                    self._retired.append(self._young)
                self._old = {}
            else:
                self._old = self._young
            self._young = {}
            self._next_rotation = now + self._period
        retired = self._retired
        if retired:
            pending = retired[-1]
            for _ in range(_RELEASE_PER_CALL):
                pending.popitem()
                if not pending:
                    retired.pop()
                    break
        self._maintain_at = -math.inf if retired else self._next_rotation

    def _evict_one(self, now: float) -> None:
        """Make room under `max_pairs`: drop a pair of the older generation (lock held)."""
        if not self._old:
            # Everything is young: age it now; it is retired a full period from now.
            self._old, self._young = self._young, {}
            self._next_rotation = now + self._period
            if not self._retired:
                self._maintain_at = self._next_rotation
        self._old.popitem()


def _is_live(pair: _Pair, now: float, window: float) -> bool:
    """A pair is live while it cools down or has an event inside the window."""
    if pair.cooldown_until != _NO_COOLDOWN:
        # A finished cooldown means a fresh window: the events before it no longer count.
        return now < pair.cooldown_until
    times = pair.times
    return bool(times) and times[-1] + window > now


def _live_count(pair: _Pair, now: float, window: float) -> int:
    """Events of the pair that still count at `now` (0 after a finished cooldown)."""
    if pair.cooldown_until != _NO_COOLDOWN and now >= pair.cooldown_until:
        return 0
    return sum(1 for t in pair.times if t + window > now)
