"""The room's bot budget: bot messages in a room per window, whatever the pair (issue 20).

Each pair's budget (guards/bot_loop.py) sees only the exchanges of its two bots, so three
or more bots in a ring (A→B→C→A, each pair seeing a third of the traffic) stay under
every pair's budget and were cut only by the consecutive-bot-turn cap. The room budget
counts every bot message of a room once, whoever sent it and whoever received it: a
room may have `room_max_events_per_window` bot messages in any sliding window of
`room_window_seconds`; the message that would exceed that is refused and opens a cooldown
of the pair's `cooldown_seconds`, or of the room window when that is longer (so that no
window ever admits more than the budget), during which every bot message of the room is
refused without being recorded. After the cooldown the room starts a fresh window. A
budget of 0 turns the room budget off. The window rules are the pair budget's (an event at t counts
in [t, t + window); a policy change keeps the events held and a running cooldown's end).

The defaults are 20 bot messages per 90 s. 20 is the pair budget's: a ring is cut at
its 21st bot message, where a two-bot ping-pong fast enough for the pair budget (more
than 20 a minute) is cut. The 90 s window cuts rings up to 4.5 s a message that way: a
three-bot ring at 3 s a message, which each pair budget lets through and the bot-turn
cap (30) stops only after 90 s, is cut at 63 s (and so is a ping-pong at that pace),
and quiet for 90 s.
Slower rings meet the bot-turn cap soon after. A room's bots may post 13 messages a
minute on average, in bursts of up to 20: three bots each answering four human messages
a minute (12) are not cut. A room busier than that raises the budget (`/loop set
bot_loop.room_max_events_per_window 40`) or turns it off (0).

The rules are written once, as a pure step over an explicit record: `step_room(record,
policy, now, bot=, key=) -> (record, decision)` over a `RoomRecord`. `RoomBudgets` keeps
the records in memory (a `guards.lru.DrainingTable`: idle rooms are forgotten a few per
call, without a scan); the sqlite and Redis backends load, step and save it (the Lua
script is the one sanctioned second version, held to this step by the conformance suite).

Decisions the design left open:
- A message is one event however many hosted bots (or replicas) receive it: each admitted
  event keeps its message key, and a key already held in the window is admitted again
  without counting twice. A message whose key is "" (none known) counts at each call. A
  message refused is not recorded, so a second receiver of the message that opened the
  cooldown gets `room_cooldown` (one cooldown, one notice either way).
- Each admitted event also keeps its sender's label (the bot's name, as the caller gives
  it): a refusal names the bots of the window, in the order they first posted in it,
  the refused sender last if it had not posted, so the notice can name the ring.
- The room budget is charged only for a bot message its pair budget admitted (a pair in
  cooldown is already quiet), and the pair budget keeps its own reasons and notice.
- `now` must not go backwards for one room; `RoomBudgets` refuses a `now` that is NaN,
  infinite or 1e15 or more in size, as `BotLoopGuard` does.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Literal

from guards.bot_loop import BotLoopPolicy
from guards.lru import DrainingTable

RoomReason = Literal["ok", "room_budget_exceeded", "room_cooldown", "disabled"]

_EARLIEST, _LATEST = -1e15, 1e15
_BAD_NOW = "now must be a finite number of seconds below 1e15 in size (a clock reading)"
# Idle rooms freed per call: n idle rooms give their memory back in n/2 calls.
_RELEASE_PER_CALL = 2


@dataclass(frozen=True, slots=True)
class RoomDecision:
    """The verdict on one bot message under its room's budget."""

    allowed: bool
    reason: RoomReason
    retry_after: float
    count: int
    bots: tuple[str, ...] = ()
    """On a refusal, the bots of the window (first posted first), for the notice."""
    until: float | None = field(default=None, compare=False)
    """A refusal's cooldown end on the state's clock, the same for every replica (None
    when admitted): it names the cooldown, so that its notice is posted once."""


_DISABLED = RoomDecision(True, "disabled", 0.0, 0)
# Admissions differ only by their count: one shared, immutable decision per count.
_ADMITTED = tuple(RoomDecision(True, "ok", 0.0, count) for count in range(65))
_FIRST = _ADMITTED[1]


def _admitted(count: int) -> RoomDecision:
    """The admission with `count` events in the window."""
    return _ADMITTED[count] if count < len(_ADMITTED) else RoomDecision(True, "ok", 0.0, count)


@dataclass(slots=True)
class RoomRecord:
    """Everything a room's budget needs, kept by `step_room`.

    `times`, `bots`, `keys`: the admitted events still held, oldest first, one entry each
    in the three lists (the sender's label, the message key or ""). `cooldown_until`: the
    end of the cooldown, None when none was opened since the window started. `window`: the
    window the events were last counted in. `idle_at`: when the room goes idle and may be
    forgotten (a backend's expiry).
    """

    times: list[float]
    bots: list[str]
    keys: list[str]
    cooldown_until: float | None
    window: float
    idle_at: float


def room_budget_on(policy: BotLoopPolicy) -> bool:
    """Whether the policy has a room budget at all (the guard on and a budget above 0)."""
    return policy.enabled and policy.room_max_events_per_window > 0


def room_cooldown(policy: BotLoopPolicy) -> float:
    """How long a room cooldown lasts: `cooldown_seconds`, or the room window when longer.

    The window after a cooldown is fresh, so a cooldown shorter than the window would let
    a window hold the budget before it and the budget again after it.
    """
    return max(policy.cooldown_seconds, policy.room_window_seconds)


def step_room(
    record: RoomRecord | None, policy: BotLoopPolicy, now: float, *, bot: str, key: str
) -> tuple[RoomRecord | None, RoomDecision]:
    """Apply one bot message of `bot` (message key `key`, "" for none) at `now`.

    The record given is updated in place and returned (a new one when None was given). A
    record that has gone idle (`idle_at <= now`) is as good as none: the message starts a
    fresh window, so forgetting an idle record changes no decision.
    """
    if not (policy.enabled and policy.room_max_events_per_window):
        return record, _DISABLED
    window = policy.room_window_seconds
    if record is None:
        record = RoomRecord([], [], [], None, window, -math.inf)
    if record.idle_at <= now:
        # No event in the window and no running cooldown: a fresh window.
        record.times, record.bots, record.keys = [now], [bot], [key]
        record.cooldown_until = None
        record.window = window
        record.idle_at = now + window
        return record, _FIRST
    record.window = window
    times, bots, keys = record.times, record.bots, record.keys
    gone = 0
    while gone < len(times) and times[gone] + window <= now:
        gone += 1
    if gone:
        del times[:gone], bots[:gone], keys[:gone]
    count = len(times)
    if key and key in keys:
        # Another receiver of a message already counted: the same answer, no second count.
        return record, _admitted(count)
    until = record.cooldown_until
    if until is not None:
        # A running cooldown: refused, not recorded, not extended.
        return record, RoomDecision(
            False, "room_cooldown", until - now, count, _named(bots, bot), until
        )
    if count < policy.room_max_events_per_window:
        times.append(now)
        bots.append(bot)
        keys.append(key)
        record.idle_at = now + window
        return record, _admitted(count + 1)
    cooldown = room_cooldown(policy)
    record.cooldown_until = record.idle_at = now + cooldown
    return record, RoomDecision(
        False,
        "room_budget_exceeded",
        cooldown,
        count,
        _named(bots, bot),
        record.cooldown_until,
    )


def _named(bots: list[str], sender: str) -> tuple[str, ...]:
    """The bots of the window in the order they first posted, then the sender if new."""
    return tuple(dict.fromkeys([*bots, sender]))


def room_view(record: RoomRecord, now: float) -> tuple[int, float] | None:
    """(events counting at `now`, cooldown seconds left) of a live room; None when idle."""
    if record.idle_at <= now:
        return None
    window = record.window
    count = sum(1 for t in record.times if t + window > now)
    until = record.cooldown_until
    return count, (0.0 if until is None else until - now)


_idle_at: Callable[[RoomRecord], float] = attrgetter("idle_at")


class RoomBudgets:
    """Room records in memory, stepped by `step_room`; thread-safe, O(1) amortised."""

    __slots__ = ("_clock", "_lock", "_rooms")

    def __init__(self, *, clock: Callable[[], float] | None = None, max_rooms: int = 100_000):
        self._clock = clock or time.monotonic
        self._rooms: DrainingTable[str, RoomRecord] = DrainingTable(
            _idle_at, cap=max_rooms, frees_per_call=_RELEASE_PER_CALL
        )
        self._lock = threading.Lock()

    def __len__(self) -> int:
        """The rooms held (live ones, and idle ones not yet freed)."""
        return len(self._rooms)

    def decide(
        self,
        scope: str,
        policy: BotLoopPolicy,
        *,
        bot: str,
        key: str = "",
        now: float | None = None,
    ) -> RoomDecision:
        """Step the room's record with one bot message and keep it."""
        if not (policy.enabled and policy.room_max_events_per_window):
            return _DISABLED
        if now is not None and not (_EARLIEST < now < _LATEST):
            raise ValueError(_BAD_NOW)
        lock = self._lock
        lock.acquire()  # half the cost of `with` on CPython 3.11 (see guards/bot_loop.py)
        try:
            at = self._clock() if now is None else now
            rooms = self._rooms
            if at >= rooms.sweep_at:
                rooms.sweep(at)
            held = rooms.use(scope)
            record, decision = step_room(held, policy, at, bot=bot, key=key)
            if held is None and record is not None:
                rooms.add(scope, record)
            return decision
        finally:
            lock.release()

    def reset(self, scope: str | None = None) -> int:
        """Forget one room's budget, or every room's; how many records were dropped."""
        with self._lock:
            if scope is None:
                dropped = len(self._rooms)
                self._rooms.clear()
                return dropped
            return self._rooms.remove_where(lambda held: held == scope)

    def view(self, scope: str, *, now: float | None = None) -> tuple[int, float] | None:
        """(events counting, cooldown left) of a live room; None when idle or unknown."""
        with self._lock:
            record = self._rooms.peek(scope)
            at = self._clock() if now is None else now
            return None if record is None else room_view(record, at)
