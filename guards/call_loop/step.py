"""The call-loop decision as one pure step over an explicit record.

`step_call(record, event, policy, now) -> (record, decision)` is the whole decision on one
LLM call: the circuit's pause, the pauses of the rule groups the call falls in, the
identical calls counted on the circuit and the calls counted per rule key. The guard
(memory) and the SQLite call store load a `CallRecord`, step it and save it; the Lua
script of the Redis call store is the one sanctioned second version, held to this one by
tests/gateway/calls/test_call_store_conformance.py. `step_reopen` (an admin lifts a
pause) and `uncount` (the provider failed) are the two other writes.

Decisions the design left open:
- Counting: an allowed call is counted at once (so concurrent repeats are caught before
  they reach the provider) and hands back a receipt; `uncount` forgets it when the
  provider failed (`is_provider_failure`: 429, 408, 5xx, or no status with an error:
  timeout, dropped connection). Other 4xx and successes stay counted. Refused calls are
  never counted.
- Opening a pause forgets no count: calls before it still count in their window, so even
  a pause shorter than the window never lets more than max_repeats through per window.
  A reopen lifts a pause and forgets the counts before it (`Hold.fresh_from`).
- The policy is the one in force at this call, and records keep none. After a change
  (`/loop set`, a per-room policy) the calls still counted count against the new
  `max_repeats` and in the new window: a shorter window drops those that left it, a
  longer one keeps counting those still held. A running pause keeps the end it was
  opened with; a new `pause_seconds` applies to the next pause.
- Forgetting changes nothing: a record of counted calls is idle once its last call has
  left the window it was counted in (`CountedCalls.idle_at`), a hold once `expires_at`
  has passed, and an idle record or expired hold counts as none. So a backend may drop
  them whenever it likes (swept a few per call, by TTL) and still answer as the others.
  A reopen's fresh start lasts the window in force at the reopen (for a rule group, the
  longest window of all).
- `now` must not go back for one key.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections import deque
from collections.abc import Iterable, Mapping, MutableSequence, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from guards.call_loop.fingerprint import call_identity
from guards.call_loop.policy import (
    CallLoopPolicy,
    RuleKey,
    UniquenessRule,
    is_group,
    rule_key,
)
from guards.call_loop.verdicts import (
    CallDecision,
    allowed_verdict,
    duplicate_verdict,
    loop_verdict,
    paused_verdict,
)

NEVER = -math.inf
"""The fresh start of a hold that never was reopened: every counted call is live."""
# A key holds at most its limit of call times (refused calls are not recorded). Up to
# this limit they are a list (dropping the oldest shifts a few pointers); above it a
# deque, so that a rule allowing thousands of calls per window stays O(1) per call.
_LIST_MAX_LIMIT = 64
# Builds a CallEvent as NamedTuple's __new__ does, without that Python-level call (one
# event per call).
_new_event = tuple.__new__


@dataclass(frozen=True, slots=True)
class Hold:
    """A pause and/or fresh start on a circuit or rule group (events before are forgotten).

    `count` is the number of calls the running pause has refused, the one that opened it
    included; `expires_at` is when the hold changes no decision any more.
    """

    paused_until: float
    fresh_from: float
    expires_at: float
    reason: str
    rule: str | None
    count: int


def pause_hold(
    earlier: Hold | None, now: float, pause: float, *, reason: str, rule: str | None
) -> Hold:
    """A pause from now; an earlier reopen's fresh start (and its lifetime) carries over."""
    if earlier is None:
        return Hold(now + pause, NEVER, now + pause, reason, rule, 1)
    expires = max(earlier.expires_at, now + pause)
    return Hold(now + pause, earlier.fresh_from, expires, reason, rule, 1)


def reopen_hold(earlier: Hold | None, now: float, window: float) -> Hold:
    """No pause, and a fresh start now that lasts as long as a counted call could."""
    reason = earlier.reason if earlier is not None else "reopened"
    rule = earlier.rule if earlier is not None else None
    return Hold(now, now, now + window, reason, rule, 0)


@dataclass(slots=True)
class CountedCalls:
    """The counted calls of one key (a circuit's call, or a rule key), oldest first.

    `idle_at`: when the last of them leaves the window it was counted in; from then on
    the record counts as none (a backend stores it as the record's expiry).
    """

    times: MutableSequence[float]
    idle_at: float


class CallEvent(NamedTuple):
    """One LLM call as the step sees it: its circuit, identity and the rules it falls under.

    `rules` pairs each applicable rule (in the rules' order) with the call's key for it.
    A named tuple: one is built per call, at a third of a frozen dataclass's cost.
    """

    circuit: str
    identity: str
    rules: tuple[tuple[UniquenessRule, RuleKey], ...]


def call_event(
    circuit: str, fingerprint: str, fields: Mapping[str, str], rules: Sequence[UniquenessRule]
) -> CallEvent:
    """The event of a call: its identity and the rules that apply to it (pure)."""
    identity = call_identity(fingerprint, fields)
    if not rules:
        return _new_event(CallEvent, (circuit, identity, ()))
    matched = []
    for rule in rules:
        key = rule_key(rule, fingerprint, fields)
        if key is not None:
            matched.append((rule, key))
    return _new_event(CallEvent, (circuit, identity, tuple(matched)))


@dataclass(slots=True)
class CallRecord:
    """Everything the decision on one call reads and writes (None: nothing stored).

    `hold` is the circuit's and `calls` its counted calls of this call; `group_holds` and
    `rule_calls` hold, per rule of the event and in its order, the rule group's hold and
    the rule key's counted calls.
    """

    hold: Hold | None
    calls: CountedCalls | None
    group_holds: list[Hold | None]
    rule_calls: list[CountedCalls | None]


def step_call(
    record: CallRecord, event: CallEvent, policy: CallLoopPolicy, now: float
) -> tuple[CallRecord, CallDecision]:
    """Decide one call at `now` and update its record: the record after it, and the verdict.

    The record (and the `CountedCalls` in it) is updated in place, so an in-memory table
    pays no copy; a new hold or a new `CountedCalls` is a new object, so a backend can
    tell what to write. An allowed call is counted in every record it falls in.
    """
    circuit = event.circuit
    hold = record.hold
    if hold is not None:
        if hold.expires_at <= now:
            hold = record.hold = None
        elif hold.paused_until > now:
            hold = record.hold = _refused(hold)
            return record, paused_verdict(circuit, hold.paused_until - now, hold.count, None)
    rules = event.rules
    group_holds = record.group_holds
    # any() (in C) skips the loop when no group is held, the common case.
    if any(group_holds):
        for index, earlier in enumerate(group_holds):
            if earlier is None:
                continue
            if earlier.expires_at <= now:
                group_holds[index] = None
            elif earlier.paused_until > now:
                refused = group_holds[index] = _refused(earlier)
                remaining = refused.paused_until - now
                return record, paused_verdict(circuit, remaining, refused.count, refused.rule)
    window = policy.window_seconds
    calls = record.calls
    floor = NEVER if hold is None else hold.fresh_from
    repeats = 0 if calls is None else len(_live(calls, now, window, floor))
    if repeats >= policy.max_repeats:
        pause = policy.pause_seconds
        record.hold = pause_hold(hold, now, pause, reason="loop_detected", rule=None)
        return record, loop_verdict(circuit, repeats + 1, pause)
    if not rules:
        record.calls = _count(calls, now, window, policy.max_repeats)
        return record, allowed_verdict(circuit, event.identity, repeats + 1, now, ())
    rule_calls = record.rule_calls
    for index, (rule, key) in enumerate(rules):
        held = rule_calls[index]
        if held is None:  # nothing counted: under any limit
            continue
        group_hold = group_holds[index]
        floor = NEVER if group_hold is None else group_hold.fresh_from
        times = _live(held, now, rule.window_seconds, floor)
        if len(times) < rule.max_calls:
            continue
        if rule.action == "pause":
            pause = policy.pause_seconds
            reason = f"rule:{rule.name}"
            group_holds[index] = pause_hold(group_hold, now, pause, reason=reason, rule=rule.name)
            return record, duplicate_verdict(circuit, rule, key, len(times) + 1, pause)
        retry_after = times[0] + rule.window_seconds - now
        return record, duplicate_verdict(circuit, rule, key, len(times) + 1, retry_after)
    record.calls = _count(calls, now, window, policy.max_repeats)
    rule_keys = []
    for index, (rule, key) in enumerate(rules):
        rule_calls[index] = _count(rule_calls[index], now, rule.window_seconds, rule.max_calls)
        rule_keys.append((rule.name, key))
    return record, allowed_verdict(circuit, event.identity, repeats + 1, now, tuple(rule_keys))


def step_reopen(hold: Hold | None, now: float, window: float) -> tuple[Hold, bool]:
    """Reopen a circuit or rule group: its hold after it, and whether a pause was lifted."""
    current = _current(hold, now)
    lifted = current is not None and current.paused_until > now
    return reopen_hold(current, now, window), lifted


def reopen_window(policy: CallLoopPolicy, rules: Iterable[UniquenessRule], key: str) -> float:
    """How long the fresh start of a reopened circuit or rule group must be remembered."""
    if not is_group(key):
        return policy.window_seconds
    return max([policy.window_seconds, *(rule.window_seconds for rule in rules)])


def is_provider_failure(status: int | None, error: str | None = None) -> bool:
    """True for outcomes that are not the caller's doing: 408, 429, 5xx, no answer at all."""
    if status is None:
        return error is not None
    return status in (408, 429) or status >= 500


def uncount(calls: CountedCalls | None, at: float) -> bool:
    """Forget the call counted at `at` (the provider failed it), if it is still held."""
    if calls is None:
        return False
    times = calls.times
    index = bisect_left(times, at)
    if index == len(times) or times[index] != at:
        return False
    del times[index]
    return True


def _refused(hold: Hold) -> Hold:
    """The running pause `hold` after refusing one more call."""
    return Hold(
        hold.paused_until, hold.fresh_from, hold.expires_at, hold.reason, hold.rule, hold.count + 1
    )


def _current(hold: Hold | None, now: float) -> Hold | None:
    """The hold while it still changes a decision, else None."""
    return None if hold is None or hold.expires_at <= now else hold


def _live(calls: CountedCalls, now: float, window: float, floor: float) -> Sequence[float]:
    """The counted times in the window (a call at t counts in [t, t + window)), after floor.

    The others are dropped from the record; an idle record is emptied.
    """
    times = calls.times
    if calls.idle_at <= now:
        times.clear()
        return times
    while times and (times[0] + window <= now or times[0] < floor):
        del times[0]
    return times


def _count(calls: CountedCalls | None, now: float, window: float, limit: int) -> CountedCalls:
    """`calls` with one more call at `now` (a new record when there was none)."""
    if calls is None:
        times: MutableSequence[float] = [now] if limit <= _LIST_MAX_LIMIT else deque((now,))
        return CountedCalls(times, now + window)
    calls.times.append(now)
    calls.idle_at = now + window
    return calls
