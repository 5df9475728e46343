"""CallLoopGuard: the call-loop step (`guards.call_loop.step`) over in-memory tables.

`check` refuses the call that would be the (max_repeats + 1)-th identical one on its
circuit inside the window (`loop_detected`) and pauses the circuit: until the pause ends
or `reopen`, every call on it gets `loop_paused`. Uniqueness rules cap calls that share
chosen fields (`duplicate_call`); the call that trips a "pause" rule gets
`duplicate_call` and later calls of its group `loop_paused`. `paused()` and `reopen()`
list and take both circuit keys and rule-group keys.

Decisions the design left open:
- Memory: the counted calls are one `guards.lru.DrainingTable` keyed by (circuit, call),
  and one per rule keyed by rule key, in the order of their last counted call. Records
  gone idle are freed a few per call, a table that shrank to a quarter of its peak is
  replaced a few entries per call (no call copies it whole), and `max_circuits` caps
  each table (the least recently counted record goes first). Holds are swept by halving
  rebuilds and capped alike. `now` must not go backwards.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from operator import attrgetter
from types import MappingProxyType

from guards.call_loop.policy import (
    CallLoopPolicy,
    LoggedCall,
    UniquenessRule,
    is_group,
    rule_group,
    rules_by_name,
)
from guards.call_loop.step import (
    CallEvent,
    CallRecord,
    CountedCalls,
    Hold,
    call_event,
    is_provider_failure,
    reopen_window,
    step_call,
    step_reopen,
    uncount,
)
from guards.call_loop.verdicts import CallDecision, PausedCircuit
from guards.lru import DrainingTable

# Idle records freed per call (a backlog: n idle records are gone within n/4 calls), and
# entries of a replaced table moved over (or dropped, when idle) per call.
FREES_PER_CALL = 4
MOVES_PER_CALL = 4

_EMPTY_FIELDS: Mapping[str, str] = MappingProxyType({})
# The tables read a record's idle instant in C, not through a Python function.
_idle_at: Callable[[CountedCalls], float] = attrgetter("idle_at")


class _Holds:
    """Holds by key, swept by halving rebuilds (amortised O(1)) and capped."""

    __slots__ = ("_cap", "_limit", "_table")

    _MIN_LIMIT = 64

    def __init__(self, cap: int) -> None:
        self._cap = cap
        self._limit = self._MIN_LIMIT
        self._table: dict[str, Hold] = {}

    def __bool__(self) -> bool:
        return bool(self._table)

    def get(self, key: str, now: float) -> Hold | None:
        hold = self._table.get(key)
        if hold is not None and hold.expires_at <= now:
            del self._table[key]
            return None
        return hold

    def put(self, key: str, hold: Hold | None, now: float) -> None:
        """Set (None: drop) a key's hold; a set hold becomes the most recently used."""
        table = self._table
        table.pop(key, None)
        if hold is None:
            return
        table[key] = hold
        if len(table) > self._limit:
            live = {name: item for name, item in table.items() if item.expires_at > now}
            if len(live) > self._cap:
                # Keep the most recently set holds: insertion order is the LRU order here.
                live = dict(list(live.items())[-self._cap :])
            self._table = live
            self._limit = max(self._MIN_LIMIT, 2 * len(live))

    def items(self) -> list[tuple[str, Hold]]:
        return list(self._table.items())


def _table(cap: int) -> DrainingTable[tuple[str, ...], CountedCalls]:
    """A table of counted calls, freed as they go idle."""
    return DrainingTable(
        _idle_at, cap=cap, frees_per_call=FREES_PER_CALL, moves_per_call=MOVES_PER_CALL
    )


class CallLoopGuard:
    """Refuses repeated LLM calls per circuit and enforces uniqueness rules; thread-safe."""

    def __init__(
        self,
        policy: CallLoopPolicy | None = None,
        rules: Iterable[UniquenessRule] = (),
        *,
        clock: Callable[[], float] | None = None,
        max_circuits: int = 100_000,
    ) -> None:
        if max_circuits < 1:
            raise ValueError(f"max_circuits must be 1 or more, got {max_circuits!r}")
        self._policy = policy or CallLoopPolicy()
        self._clock = clock or time.monotonic
        self._lock = threading.Lock()
        self._rules = tuple(rules_by_name(rules).values())
        self._calls = _table(max_circuits)
        self._rule_calls = {rule.name: _table(max_circuits) for rule in self._rules}
        self._circuit_holds = _Holds(max_circuits)
        self._group_holds = _Holds(max_circuits)
        # One record per path, refilled under the lock for every call: building one per
        # call cost more than the step's own work. No call sees another's.
        self._record = CallRecord(None, None, [], [])
        self._rules_record = CallRecord(None, None, [], [])

    @property
    def policy(self) -> CallLoopPolicy:
        """The policy this guard enforces when a call brings none."""
        return self._policy

    @property
    def rules(self) -> tuple[UniquenessRule, ...]:
        """The uniqueness rules this guard enforces, in order."""
        return self._rules

    def __len__(self) -> int:
        """The number of (circuit, call) records held."""
        return len(self._calls)

    def check(
        self,
        *,
        circuit: str,
        fingerprint: str,
        fields: Mapping[str, str] = _EMPTY_FIELDS,
        now: float | None = None,
        policy: CallLoopPolicy | None = None,
    ) -> CallDecision:
        """Decide one call and, when it is allowed, count it (see `record_outcome`).

        `policy` is the circuit's policy for this call (a gateway room's), None the guard's
        own; the calls already counted in the window count against whichever applies.
        """
        event = call_event(circuit, fingerprint, fields, self._rules)
        with self._lock:
            when = self._clock() if now is None else now
            calls = self._calls
            if when >= calls.sweep_at:
                calls.sweep(when)
            hold = self._circuit_holds.get(circuit, when)
            call = (circuit, event.identity)
            if not event.rules:  # the common case, without the rules' bookkeeping
                held = calls.peek(call)
                record = self._record
                record.hold = hold
                record.calls = held
                record, decision = step_call(record, event, policy or self._policy, when)
                if record.hold is not hold:
                    self._circuit_holds.put(circuit, record.hold, when)
                _keep(calls, call, held, record.calls, decision.allowed)
                return decision
            return self._check_with_rules(event, call, hold, when, policy or self._policy)

    def record_outcome(
        self, decision: CallDecision, *, status: int | None = None, error: str | None = None
    ) -> bool:
        """Uncount an allowed call the provider failed (429, 408, 5xx, timeout, dropped).

        Other outcomes (success, other 4xx) stay counted: sending again a body the
        provider rejects is a loop. True when the call was uncounted.
        """
        receipt = decision.receipt
        if receipt is None or not is_provider_failure(status, error):
            return False
        with self._lock:
            removed = uncount(self._calls.peek(receipt.call), receipt.at)
            for name, key in receipt.rule_keys:
                table = self._rule_calls.get(name)
                if table is not None:
                    uncount(table.peek(key), receipt.at)
            return removed

    def reopen(self, circuit: str, *, now: float | None = None) -> bool:
        """Lift the pause of a circuit (or rule group) and forget its counts so far.

        True when a running pause was lifted.
        """
        with self._lock:
            when = self._clock() if now is None else now
            holds = self._group_holds if is_group(circuit) else self._circuit_holds
            window = reopen_window(self._policy, self._rules, circuit)
            hold, lifted = step_reopen(holds.get(circuit, when), when, window)
            holds.put(circuit, hold, when)
            return lifted

    def paused(self, *, now: float | None = None) -> list[PausedCircuit]:
        """The circuits and rule groups paused now, by key."""
        with self._lock:
            when = self._clock() if now is None else now
            found = [
                PausedCircuit(
                    circuit=key,
                    remaining=hold.paused_until - when,
                    reason=hold.reason,
                    count=hold.count,
                )
                for holds in (self._circuit_holds, self._group_holds)
                for key, hold in holds.items()
                if hold.paused_until > when
            ]
        return sorted(found, key=_paused_key)

    def _check_with_rules(
        self,
        event: CallEvent,
        call: tuple[str, str],
        hold: Hold | None,
        now: float,
        policy: CallLoopPolicy,
    ) -> CallDecision:
        """`check` for a call some rules apply to: their group holds and counts join in."""
        tables = self._rule_calls
        for table in tables.values():
            if now >= table.sweep_at:
                table.sweep(now)
        rules = event.rules
        holds = self._group_holds
        # Without any group hold, no group key is worked out (but for a group paused now).
        groups = [rule_group(rule, key) for rule, key in rules] if holds else None
        group_holds: list[Hold | None] = (
            [None] * len(rules) if groups is None else [holds.get(g, now) for g in groups]
        )
        # Loops, not comprehensions: in 3.11 each comprehension is a function call.
        held_rules: list[CountedCalls | None] = []
        for rule, key in rules:
            held_rules.append(tables[rule.name].peek(key))
        held = self._calls.peek(call)
        record = self._rules_record
        record.hold = hold
        record.calls = held
        record.group_holds = group_holds.copy()
        record.rule_calls = held_rules.copy()
        record, decision = step_call(record, event, policy, now)
        if record.hold is not hold:
            self._circuit_holds.put(event.circuit, record.hold, now)
        counted = decision.allowed
        _keep(self._calls, call, held, record.calls, counted)
        after_holds = record.group_holds
        # The step sets a new hold or None when one changes: the lists compare by identity
        # first, in C, so the common case (none changed) costs no loop.
        if after_holds != group_holds:
            for index, (rule, key) in enumerate(rules):
                after = after_holds[index]
                if after is not group_holds[index]:
                    group = rule_group(rule, key) if groups is None else groups[index]
                    holds.put(group, after, now)
        after_calls = record.rule_calls
        for index, (rule, key) in enumerate(rules):
            _keep(tables[rule.name], key, held_rules[index], after_calls[index], counted)
        return decision


def _keep(
    table: DrainingTable[tuple[str, ...], CountedCalls],
    key: tuple[str, ...],
    held: CountedCalls | None,
    calls: CountedCalls | None,
    counted: bool,
) -> None:
    """Save a record the step saw (`held`: before it): counted, the most recent; emptied, gone."""
    if calls is None:
        return
    if calls is not held:  # the step's new record: the table held none
        table.add(key, calls)
    elif counted:
        table.use(key)
    elif not calls.times:
        table.discard(key)


def preview_rule(
    rule: UniquenessRule, calls: Iterable[LoggedCall], *, pause_seconds: float = 300.0
) -> int:
    """How many of these logged calls the rule alone would have refused (or paused).

    The calls are replayed in time order through a guard holding only this rule; each
    call gets a circuit of its own, so loop detection never interferes.
    """
    guard = CallLoopGuard(CallLoopPolicy(max_repeats=1, pause_seconds=pause_seconds), (rule,))
    refused = 0
    for index, call in enumerate(sorted(calls, key=_logged_at)):
        decision = guard.check(
            circuit=str(index), fingerprint=call.fingerprint, fields=call.fields, now=call.at
        )
        refused += not decision.allowed
    return refused


def _logged_at(call: LoggedCall) -> float:
    """Sort key of a logged call: its time."""
    return call.at


def _paused_key(paused: PausedCircuit) -> str:
    """Sort key of a paused entry: its key."""
    return paused.circuit
