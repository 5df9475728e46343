"""Bot-to-bot pair budget: stop two bots from answering each other forever.

One event is one bot-authored message a hosted bot received from another bot. The two
bot ids form a direction-independent pair, separately per scope (room). A pair may have
`max_events_per_window` events in any sliding window of `window_seconds`; the event that
would exceed that is refused and opens a cooldown of `cooldown_seconds`, during which
every event of the pair is refused without being recorded. After the cooldown the pair
starts a fresh window.

The rules are written once, as a pure step over an explicit record: `step_pair(record,
policy, now) -> (record, decision)` over a `PairRecord` (admitted event times, cooldown
end, the window they were counted in, the instant the pair goes idle). `BotLoopGuard`
keeps the records in memory and calls the step's in-place form, `_step`, which returns
the decision alone (no tuple per event on the hot path); the sqlite and Redis backends
load a record, step it and save it (the Lua script is the one sanctioned second
version). `PairRecord.idle_at` says when a record may be forgotten (a backend's expiry)
and `pair_view` what a status command shows. `step_bot_turns` is the consecutive-bot-turn
count: a bot message adds one, a human one resets it to 0.

Memory: the pairs are one `guards.lru.DrainingTable` in least-recently-used order. A pair
with no event in its window and no running cooldown is idle, and forgetting it changes no
decision. A new pair takes over the record and the place of the least recently used pair
when that one has gone idle (one look, and none before the instant it was last seen to
go idle). The other idle pairs are freed by a sweep, due when the least recently used
pair goes idle but at most once every sixteenth of the window (`_SWEEP_GAP`): it frees
the idle pairs at the front, up to `_SWEEP_MAX` in one pass, into the spare records that
new pairs take (up to `_SPARES_MAX`), and runs again on the next call after a full pass.
So n idle pairs are freed within about n/256 calls once a sweep is due, without any
scan, and a pair is forgotten within a sixteenth of the window of going idle while
traffic goes on. (Issue 24: a look at the front on every call, as before, made the
guard dearer than praisonaiagents' on pairs drawn at random, which go idle between most
of their events.)
A table that has shrunk to a quarter of its peak is replaced by a fresh one, the
survivors moved over a few per call (no stall). `max_pairs` caps the table: a new pair
displaces the least recently used one.

Decisions the design left open:
- `now` must not go backwards (the default clock is read under the lock, so it never
  does); with earlier injected times the window is approximate, still bounded. An
  injected `now` that is NaN, infinite or 1e15 or more in size is refused (ValueError):
  it would leave a record no later event could count against.
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
- A policy change mid-window (a call's `policy=` differs from the pair's last one) keeps
  the pair's events: those still held count against the new budget and in the new
  window, and a running cooldown keeps its end. Once a pair has gone idle under the
  window it was last counted in, it starts afresh whatever the new window is: so when
  it is forgotten (here, or by another backend's expiry) changes nothing.
- One guard may serve policies with different windows; the sweep then frees an idle
  pair up to the longest window or cooldown late (it looks at the front pair only).
- `enabled` and `policy` are the guard's own policy, used when a call brings none.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, MutableSequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Literal

from guards.lru import DrainingTable

Reason = Literal["ok", "budget_exceeded", "cooldown", "disabled"]
PairKey = tuple[str | None, str, str]

# Idle pairs freed per call while a table drains (`guards.lru`).
_RELEASE_PER_CALL = 2
# Idle pairs freed by one sweep at most: a backlog is freed this many a call.
_SWEEP_MAX = 256
# Sweeps of pairs going idle one by one come at most this share of the window apart.
_SWEEP_GAP = 1 / 16
# Freed records kept for new pairs to take over: building one costs more than keeping it,
# and a sweep frees a batch that the new pairs until the next one take over.
_SPARES_MAX = 512
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
    """How many bot-to-bot events a pair (and a room) may have per window, and the cooldown."""

    enabled: bool = True
    max_events_per_window: int = 20
    window_seconds: float = 60.0
    cooldown_seconds: float = 60.0
    room_max_events_per_window: int = 20
    """The room budget (guards/room_budget.py): bot messages per room window, 0 for none."""
    room_window_seconds: float = 90.0

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
        room_budget = self.room_max_events_per_window
        if isinstance(room_budget, bool) or not isinstance(room_budget, int):
            raise TypeError(
                "room_max_events_per_window must be a whole number (e.g. 20, 0 for none), "
                f"got {room_budget!r}"
            )
        if room_budget < 0:
            raise ValueError(
                "room_max_events_per_window must be 0 (no room budget) or more, "
                f"got {room_budget!r}"
            )
        room_window = self.room_window_seconds
        if not (_is_number(room_window) and math.isfinite(room_window) and room_window > 0):
            raise ValueError(
                "room_window_seconds must be a finite number of seconds above 0 (e.g. 60), "
                f"got {room_window!r}"
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
        room_budget = _number("room_max_events_per_window", data.get("room_max_events_per_window"))
        if room_budget is not None and not float(room_budget).is_integer():
            raise ValueError(
                "room_max_events_per_window must be a whole number (e.g. 20, 0 for none), "
                f"got {room_budget!r}"
            )
        room_window = _number("room_window_seconds", data.get("room_window_seconds"))
        return cls(
            enabled=_flag("enabled", data.get("enabled"), default=default.enabled),
            max_events_per_window=(
                default.max_events_per_window if budget is None else max(1, int(budget))
            ),
            window_seconds=default.window_seconds if window is None else float(window),
            cooldown_seconds=default.cooldown_seconds if cooldown is None else float(cooldown),
            room_max_events_per_window=(
                default.room_max_events_per_window if room_budget is None else int(room_budget)
            ),
            room_window_seconds=(
                default.room_window_seconds if room_window is None else float(room_window)
            ),
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
    until: float | None = field(default=None, compare=False)
    """A refusal's cooldown end on the state's clock, the same for every replica that asks
    (None when admitted): it names the cooldown, e.g. to announce it once."""


@dataclass(frozen=True, slots=True)
class PairSnapshot:
    """One live pair for status commands: its events in the window and cooldown left."""

    scope: str | None
    bot_a: str
    bot_b: str
    count: int
    cooldown_remaining: float


@dataclass(slots=True)
class PairRecord:
    """Everything a pair's budget needs, kept by `step_pair`.

    `times`: the admitted events still held, oldest first (refused events are never
    recorded). `cooldown_until`: the end of the cooldown, None when none was opened since
    the window started. `window`: the window the events were last counted in, so that
    the record alone says what it shows. `idle_at`: when the pair goes idle and may be
    forgotten (its cooldown's end, or its last event's time + window); a backend stores
    it as the record's expiry.
    """

    times: MutableSequence[float]
    cooldown_until: float | None
    window: float
    idle_at: float


# The table reads a record's idle instant in C, not through a Python function.
_idle_at: Callable[[PairRecord], float] = attrgetter("idle_at")
# `DrainingTable.sweep_at` meaning "sweep on the next call", one float shared by every call.
_SWEEP_NOW = -math.inf
# An injected `now` beyond this (about 30 million years of seconds) is no clock reading:
# NaN, the infinities and huge numbers break the window arithmetic, so they are refused.
_EARLIEST, _LATEST = -1e15, 1e15
_BAD_NOW = "now must be a finite number of seconds below 1e15 in size (a clock reading)"
_DISABLED = PairDecision(allowed=True, reason="disabled", retry_after=0.0, count=0)
# Admissions differ only by their count: one shared, immutable decision per count.
_ADMITTED = tuple(PairDecision(True, "ok", 0.0, count) for count in range(_LIST_MAX_BUDGET + 1))


def step_pair(
    record: PairRecord | None, policy: BotLoopPolicy, now: float
) -> tuple[PairRecord | None, PairDecision]:
    """Apply one event at `now` to a pair's record (None: no state); the record after it.

    The record given is updated in place and returned (a new one when None was given),
    so an in-memory table pays no copy; a caller that needs the record before the event
    copies it first. A record that has gone idle (`idle_at <= now`) is as good as none:
    the event starts a fresh window whatever the policy is now, so forgetting an idle
    record, on any backend and at any time, changes no decision. `now` must not go back
    for one pair (with earlier times the window is approximate, still bounded).

    The policy is the one in force at this event, and the record keeps no policy: after
    a policy change the events still held count against the new budget and in the new
    window (a shorter window drops the events that left it, a longer one keeps counting
    those still held), and a running cooldown keeps the end it was opened with.
    """
    if not policy.enabled:
        return record, _DISABLED
    if record is None:
        record = _idle_record()
    return record, _step(record, policy, now)


def _idle_record() -> PairRecord:
    """A record that holds nothing: `_step` starts it afresh, like a pair never seen."""
    return PairRecord([], None, 0.0, -math.inf)


def _step(record: PairRecord, policy: BotLoopPolicy, now: float) -> PairDecision:
    """`step_pair`'s rules for an enabled policy, the record updated in place; the decision.

    The in-memory guard calls this directly: no tuple to build and unpack per event.
    """
    window = policy.window_seconds
    if now < record.idle_at:
        record.window = window  # cheaper than comparing first: it rarely changes
        times = record.times
        while times and times[0] + window <= now:  # an event at t counts in [t, t + window)
            del times[0]
        count = len(times)
        until = record.cooldown_until
        if until is not None:
            # A running cooldown: refused, not recorded, not extended.
            return PairDecision(False, "cooldown", until - now, count, until)
        if count < policy.max_events_per_window:
            times.append(now)
            record.idle_at = now + window
            try:  # free on CPython 3.11 unless raised: cheaper than a bounds check
                return _ADMITTED[count + 1]
            except IndexError:
                return PairDecision(True, "ok", 0.0, count + 1)
        # A finished cooldown means a fresh window: the pair is idle once it ends.
        record.cooldown_until = record.idle_at = now + policy.cooldown_seconds
        # Exactly the cooldown: `(now + cooldown) - now` may round below it.
        return PairDecision(
            False, "budget_exceeded", policy.cooldown_seconds, count, record.cooldown_until
        )
    # No event in the window and no running cooldown: a fresh window.
    record.times = [now] if policy.max_events_per_window <= _LIST_MAX_BUDGET else deque((now,))
    record.cooldown_until = None
    record.window = window
    record.idle_at = now + window
    return _ADMITTED[1]


def pair_view(record: PairRecord, now: float) -> tuple[int, float] | None:
    """(events counting at `now`, cooldown seconds left) of a live pair; None when idle."""
    if record.idle_at <= now:
        return None
    window = record.window
    count = sum(1 for t in record.times if t + window > now)
    until = record.cooldown_until
    return count, (0.0 if until is None else until - now)


def step_bot_turns(count: int, *, is_bot: bool) -> int:
    """A room's consecutive-bot-turn count after one message: a human one resets it to 0."""
    return count + 1 if is_bot else 0


class BotLoopGuard:
    """Admits or drops bot-to-bot events per pair and room; thread-safe, O(1) amortised.

    The rules are `step_pair`'s; the guard holds the records in a `DrainingTable`. Each
    call may bring its own policy (`policy=`, default the guard's), so one guard serves
    rooms with different policies and a policy change keeps the pair's events.
    """

    __slots__ = ("_clock", "_lock", "_pairs", "_policy", "_spares", "_take_at")

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
        self._clock = clock or time.monotonic
        self._pairs: DrainingTable[PairKey, PairRecord] = DrainingTable(
            _idle_at, cap=max_pairs, frees_per_call=_RELEASE_PER_CALL
        )
        self._lock = threading.Lock()
        # Idle records the sweep freed, for new pairs to take over instead of building one.
        self._spares: list[PairRecord] = []
        # When the least recently used pair goes idle, as last seen: until then a new pair
        # need not look at it (every other pair was used after it).
        self._take_at = -math.inf

    @property
    def enabled(self) -> bool:
        """Whether the guard's own policy refuses anything at all."""
        return self._policy.enabled

    @property
    def policy(self) -> BotLoopPolicy:
        """The policy this guard enforces when a call brings none."""
        return self._policy

    def __len__(self) -> int:
        """The number of pairs held (live ones, and idle ones not yet freed)."""
        return len(self._pairs)

    def observe(
        self,
        *,
        self_bot_id: str,
        sender_bot_id: str,
        now: float | None = None,
        scope: str | None = None,
        policy: BotLoopPolicy | None = None,
    ) -> bool:
        """Record one bot-authored event of the pair; True to admit it, False to drop it.

        The common cases are done here, without a method call: a known pair, a new pair
        taking over an idle least recently used pair or a spare record; a sweep (due once
        in a while) and a draining table are `_decide`'s.
        """
        if policy is None:
            policy = self._policy
        if not policy.enabled:
            return True
        if self_bot_id <= sender_bot_id:
            key = (scope, self_bot_id, sender_bot_id)
        else:
            key = (scope, sender_bot_id, self_bot_id)
        # acquire/release on the lock itself: half the cost of `with` on CPython 3.11, and
        # less than bound methods kept on the guard, which the interpreter cannot specialise.
        lock = self._lock
        lock.acquire()
        try:
            if now is None:
                now = self._clock()
            elif not (now < _LATEST and now > _EARLIEST):
                raise ValueError(_BAD_NOW)
            pairs = self._pairs
            if now >= pairs.sweep_at:
                return self._decide(key, now, policy).allowed
            recent = pairs.recent
            record = pairs.recent_get(key)
            if record is not None:
                recent.move_to_end(key)
                return _step(record, policy, now).allowed
            # A new pair, and no table draining (a sweep would be due): it takes over the
            # least recently used pair's record and place when that pair has gone idle
            # (`_step` starts it afresh; the size stays), else a spare or a new record.
            if now >= self._take_at and recent:
                front_key, front = recent.popitem(False)  # positional: a keyword costs more
                idle_at = front.idle_at
                if idle_at <= now:
                    recent[key] = front
                    return _step(front, policy, now).allowed
                recent[front_key] = front
                recent.move_to_end(front_key, False)
                self._take_at = idle_at
            spares = self._spares
            record = spares.pop() if spares else _idle_record()
            if len(recent) < pairs.peak:  # under its peak, so under the cap: no displacing
                recent[key] = record
            else:
                pairs.add(key, record)
            return _step(record, policy, now).allowed
        finally:
            lock.release()

    def decide(
        self,
        *,
        self_bot_id: str,
        sender_bot_id: str,
        now: float | None = None,
        scope: str | None = None,
        policy: BotLoopPolicy | None = None,
    ) -> PairDecision:
        """Like `observe`, with the reason, the seconds until retry and the window count."""
        if policy is None:
            policy = self._policy
        if not policy.enabled:
            return _DISABLED
        key = (scope, *pair_key(self_bot_id, sender_bot_id))
        if now is not None and not (now < _LATEST and now > _EARLIEST):
            raise ValueError(_BAD_NOW)
        with self._lock:
            return self._decide(key, self._clock() if now is None else now, policy)

    def reset(self, scope: str | None = None, bot_id: str | None = None) -> None:
        """Forget pairs: all of them, one scope's, one bot's, or one bot's in one scope."""
        with self._lock:
            self._take_at = -math.inf  # the front may be another pair now
            if scope is None and bot_id is None:
                self._pairs.clear()
            else:
                self._pairs.remove_where(
                    lambda key: (
                        (scope is None or key[0] == scope) and (bot_id is None or bot_id in key[1:])
                    )
                )

    def snapshot(self, scope: str | None = None, *, now: float | None = None) -> list[PairSnapshot]:
        """The live pairs (of one scope, or all), least recently used first."""
        with self._lock:
            at = self._clock() if now is None else now
            found = []
            for key, record in self._pairs.items():
                if scope is None or key[0] == scope:
                    view = pair_view(record, at)
                    if view is not None:
                        found.append(PairSnapshot(key[0], key[1], key[2], *view))
            return found

    def _decide(self, key: PairKey, now: float, policy: BotLoopPolicy) -> PairDecision:
        """Sweep if due, step the pair's record with one event and keep it (lock held)."""
        pairs = self._pairs
        freed = None
        if now >= pairs.sweep_at:
            if pairs.draining is None:
                self._sweep(now, policy.window_seconds)
            if pairs.draining is not None:  # moves a few survivors a call (`guards.lru`)
                freed = pairs.sweep(now)
        return self._place(key, now, policy, freed)

    def _sweep(self, now: float, window: float) -> None:
        """Free the pairs gone idle at the front, `_SWEEP_MAX` at most, into the spares.

        The next sweep is due when the front pair goes idle, but not sooner than a
        sixteenth of the window from now (`_SWEEP_GAP`): pairs that go idle one by one
        are freed in batches, not one look per call; after a full batch (a backlog), on
        the next call.
        """
        pairs = self._pairs
        recent = pairs.recent
        spares = self._spares
        pop = recent.popitem
        pairs.swept_at = now
        for _ in range(_SWEEP_MAX):
            if not recent:
                pairs.sweep_at = now + window * _SWEEP_GAP
                break
            front_key, front = pop(False)  # positional: a keyword costs more
            idle_at = front.idle_at
            if idle_at > now:  # live: back to the front; nothing to free before then
                recent[front_key] = front
                recent.move_to_end(front_key, False)
                self._take_at = idle_at
                later = now + window * _SWEEP_GAP
                pairs.sweep_at = idle_at if idle_at > later else later
                break
            if len(spares) < _SPARES_MAX:
                front.idle_at = _SWEEP_NOW  # so `_step` starts it afresh, whatever `now`
                spares.append(front)
        else:
            pairs.sweep_at = _SWEEP_NOW  # a full batch: more may be idle
        if len(recent) * 4 <= pairs.peak:
            pairs.shrink()

    def _place(
        self, key: PairKey, now: float, policy: BotLoopPolicy, freed: PairRecord | None
    ) -> PairDecision:
        """Step the pair's record and keep it, after the sweep (`freed`: what it freed last)."""
        pairs = self._pairs
        recent = pairs.recent  # read after the sweep, which may replace it
        record = recent.get(key)
        if record is not None:
            recent.move_to_end(key)
        elif pairs.draining is not None:
            record = pairs.use(key)
        if record is not None:
            if freed is not None:
                self._keep_spare(freed)
            return _step(record, policy, now)
        if freed is not None:
            # A new pair takes over the record just freed (idle: `_step` starts it
            # afresh) and its place: the table does not grow, no record is built.
            recent[key] = freed
            return _step(freed, policy, now)
        if now >= self._take_at and recent and pairs.draining is None:  # as `observe` does
            front_key, front = recent.popitem(False)
            idle_at = front.idle_at
            if idle_at <= now:
                recent[key] = front
                return _step(front, policy, now)
            recent[front_key] = front
            recent.move_to_end(front_key, False)
            self._take_at = idle_at
        spares = self._spares
        record = spares.pop() if spares else _idle_record()
        pairs.add(key, record)
        return _step(record, policy, now)

    def _keep_spare(self, record: PairRecord) -> None:
        """Keep a freed record for a new pair to take over (a few at most), idle at any time."""
        spares = self._spares
        if len(spares) < _SPARES_MAX:
            record.idle_at = _SWEEP_NOW  # so `_step` starts it afresh, whatever `now` comes
            spares.append(record)
