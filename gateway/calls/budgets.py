"""Spend budgets as one pure step over an explicit record: admit, charge, alert.

`step_spend(record, event, now) -> (record, verdict)` is the whole admission decision on
one LLM call against every budget group it falls in; `step_charge` replaces the estimate
an admitted call held with what it really used (and says which alert threshold that
crossed); `step_release` gives a hold back (the provider failed, or the repeat guard
refused the call after the budgets admitted it). The memory and SQLite call stores load a
`SpendRecord`, step it and save it; the Redis call store's Lua is the one sanctioned
second version, held to this one by tests/gateway/calls/test_call_store_conformance.py.
Stdlib only, no I/O.

Decisions the design left open:
- Money is counted in whole nano-dollars (`NANO_PER_USD`) and tokens in whole tokens:
  integers add up exactly on every backend (a Lua number holds integers exactly up to
  2**53, far above the largest limit config accepts), so "reaching the limit exactly is
  allowed" means the same everywhere. A cost is rounded up to the next nano-dollar.
- A call is refused when `spent + held + estimate` would pass a limit of one of its
  groups (reaching it exactly is allowed). Its estimate is held in every group until
  `step_charge` replaces it: "calls in flight" are the ones admitted before the crossing,
  so concurrent calls overshoot a limit by at most the calls already admitted.
- A group's limit is the budget's (from config, given with each event, so a changed
  config applies to the next call) unless an admin set one for this period
  (`SpendRecord.overrides`), which lapses when the period ends.
- Alerts: a group crosses 50, 80 and 100 percent of its limit (the larger of its dollar
  and token shares) by what it was charged, holds not counted; each threshold alerts once
  per group and period (`GroupSpend.alerted` keeps the highest sent); a charge that
  crosses two at once sends the higher one only. The first refusal of a group that has
  not reached 100 percent sends the 100 percent alert: its calls stop there.
- A group's record counts as none once its period has ended (`ends_at <= now`), so a
  backend may drop it then (by TTL, or swept a few per call) and still answer alike.
- Holds have owners (issue 20): the sqlite and Redis stores keep, beside each group's
  `held`, what each store instance (one process run, `OWNER_SECONDS` lease renewed while
  it runs) holds there. A SIGKILLed proxy never charges its calls in flight, so once its
  lease lapses another instance gives its holds back (`dead_hold`, `step_release`),
  instead of the period's end. A charge gives back no more than its owner still holds
  in the group (`owned`): an owner whose lease lapsed while it was only slow must not
  give its holds back twice.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal, NamedTuple
from zoneinfo import ZoneInfo

Period = Literal["day", "week", "month"]
PERIODS: tuple[Period, ...] = ("day", "week", "month")
PER_FIELDS = ("agent", "session", "customer", "user", "feature", "model")
NONE_VALUE = "(none)"
"""The group value of a call that lacks a `per` field: leaving a header out never escapes."""
THRESHOLDS = (50, 80, 100)
OWNER_SECONDS = 10.0
"""How long a store instance's holds are its own after its last lease renewal (every third)."""
NANO_PER_USD = 1_000_000_000
_SEP = "\x1f"


def nano(usd: float) -> int:
    """Dollars as whole nano-dollars, rounded up (a cost is never rounded down to free)."""
    return math.ceil(round(usd * NANO_PER_USD, 3))


def usd(nanos: int) -> float:
    """Nano-dollars as dollars."""
    return nanos / NANO_PER_USD


@dataclass(frozen=True, slots=True)
class Limits:
    """A group's limits: nano-dollars and/or tokens per period (None: no such limit)."""

    nano_usd: int | None = None
    tokens: int | None = None


@dataclass(frozen=True, slots=True)
class Budget:
    """One budget: its groups (`per` fields), limits, period and value filters."""

    name: str
    per: tuple[str, ...]
    limits: Limits
    period: Period
    filters: tuple[tuple[str, str], ...] = ()

    def matches(self, fields: Mapping[str, str]) -> bool:
        """True when the call's fields pass every filter (a trailing `*` is a prefix)."""
        for name, wanted in self.filters:
            value = fields.get(name, "")
            if wanted.endswith("*"):
                if not value.startswith(wanted[:-1]):
                    return False
            elif value != wanted:
                return False
        return True

    def group(self, fields: Mapping[str, str]) -> str:
        """The group a call falls in, as shown: `agent=billing-bot customer=acme`, or `all`."""
        if not self.per:
            return "all"
        return " ".join(f"{name}={fields.get(name) or NONE_VALUE}" for name in self.per)

    def values(self, fields: Mapping[str, str]) -> tuple[str, ...]:
        """The call's values of the `per` fields, `(none)` for a missing one."""
        return tuple(fields.get(name) or NONE_VALUE for name in self.per)


@dataclass(frozen=True, slots=True)
class PeriodSpan:
    """One period of a budget: its label (the local start date) and its end (epoch)."""

    label: str
    ends_at: float


def period_span(period: Period, zone: ZoneInfo, now: float) -> PeriodSpan:
    """The period holding `now` in `zone`: days from midnight, weeks from Monday, months."""
    local = datetime.fromtimestamp(now, zone)
    start = local.replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "week":
        start -= timedelta(days=start.weekday())
    elif period == "month":
        start = start.replace(day=1)
    if period == "month":
        year, month = (start.year + 1, 1) if start.month == 12 else (start.year, start.month + 1)
        end = start.replace(year=year, month=month)
    else:
        end = start + timedelta(days=7 if period == "week" else 1)
    # The wall-clock end in the zone, so a day with a DST change is 23 or 25 hours.
    ends_at = end.replace(tzinfo=None).replace(tzinfo=zone).timestamp()
    return PeriodSpan(start.date().isoformat(), ends_at)


def group_key(budget: str, label: str, values: Sequence[str]) -> str:
    """The storage key of a group in one period (JSON values: no two groups share one)."""
    return f"{budget}{_SEP}{label}{_SEP}{json.dumps(list(values), ensure_ascii=False)}"


def limit_key(budget: str, label: str) -> str:
    """The storage key of an admin's limit for one budget and period."""
    return f"{budget}{_SEP}{label}"


class GroupKey(NamedTuple):
    """What a group's storage key holds: the budget, the period label and the values."""

    budget: str
    label: str
    values: tuple[str, ...]


def parse_group_key(key: str) -> GroupKey | None:
    """The parts of a group's storage key (None: not one)."""
    parts = key.split(_SEP, 2)
    if len(parts) != 3:
        return None
    try:
        values = json.loads(parts[2])
    except ValueError:
        return None
    if not isinstance(values, list):
        return None
    return GroupKey(parts[0], parts[1], tuple(str(value) for value in values))


@dataclass(frozen=True, slots=True)
class Amount:
    """Money (nano-dollars) and tokens: an estimate held, or what a call used."""

    nano_usd: int = 0
    tokens: int = 0


@dataclass(frozen=True, slots=True)
class SpendGroup:
    """One group of one budget in the call's period, as the step sees it."""

    budget: str
    group: str
    key: str
    limit_key: str
    limits: Limits
    ends_at: float


@dataclass(frozen=True, slots=True)
class SpendEvent:
    """One call as the budgets see it: the groups it falls in and its estimated cost.

    `agent_hold` is the hold key of the call's agent when the anomaly detector may pause
    it (`gateway.calls.anomaly.anomaly_key`): the store checks it before the budgets.
    """

    groups: tuple[SpendGroup, ...]
    estimate: Amount
    agent_hold: str | None = None


@dataclass(slots=True)
class GroupSpend:
    """A group's record in one period: charged, held (calls in flight), alerts sent."""

    spent: Amount = field(default_factory=Amount)
    held: Amount = field(default_factory=Amount)
    alerted: int = 0
    ends_at: float = 0.0


@dataclass(slots=True)
class SpendRecord:
    """Everything the spend step reads and writes, per group of the event in its order.

    `groups[i]` is the record of `event.groups[i]` (None: nothing stored), `overrides[i]`
    the admin's limits for that group's budget and period (None: the config's).
    """

    groups: list[GroupSpend | None]
    overrides: list[Limits | None]


@dataclass(frozen=True, slots=True)
class SpendAlert:
    """A threshold a group crossed: which, and the figures the alert states."""

    budget: str
    group: str
    threshold: int
    spent: Amount
    limits: Limits
    ends_at: float


@dataclass(frozen=True, slots=True)
class SpendHold:
    """What an admitted call holds, so its charge can replace it."""

    groups: tuple[SpendGroup, ...]
    amount: Amount


@dataclass(frozen=True, slots=True)
class SpendVerdict:
    """The budgets' verdict on one call; `refused` names the group that would be passed.

    `unavailable`: refused because the shared state the budgets live in is unreachable
    and `state.on_error` is `deny` (`refused` is then the call's first group, `limits`
    None): the call may well have fit, so it is answered `state_unavailable`, not
    `budget_exceeded`.
    """

    allowed: bool
    hold: SpendHold | None = None
    refused: SpendGroup | None = None
    limits: Limits | None = None
    retry_after: float = 0.0
    alert: SpendAlert | None = None
    unavailable: bool = False


ADMITTED_FREE = SpendVerdict(True)
"""The verdict on a call no budget applies to."""


def effective(group: SpendGroup, override: Limits | None) -> Limits:
    """The limits in force for a group: an admin's for this period, else the config's."""
    return group.limits if override is None else override


def _live(record: GroupSpend | None, now: float) -> GroupSpend | None:
    """The record while its period lasts, else None (an ended period counts as none)."""
    return None if record is None or record.ends_at <= now else record


def _passes(limits: Limits, spent: Amount, held: Amount, estimate: Amount) -> bool:
    """True when spent + held + estimate would pass a limit (reaching it is allowed)."""
    if limits.nano_usd is not None and spent.nano_usd + held.nano_usd + estimate.nano_usd > (
        limits.nano_usd
    ):
        return True
    return limits.tokens is not None and spent.tokens + held.tokens + estimate.tokens > (
        limits.tokens
    )


def percent(limits: Limits, spent: Amount) -> float:
    """The share of its limit a group has spent, in percent (the larger of the two)."""
    shares = [0.0]
    if limits.nano_usd is not None:
        shares.append(100.0 * spent.nano_usd / limits.nano_usd if limits.nano_usd else math.inf)
    if limits.tokens is not None:
        shares.append(100.0 * spent.tokens / limits.tokens if limits.tokens else math.inf)
    return max(shares)


def crossed(limits: Limits, spent: Amount, alerted: int) -> int:
    """The highest threshold `spent` has reached above `alerted` (0: none)."""
    share = percent(limits, spent)
    reached = [t for t in THRESHOLDS if t > alerted and share >= t]
    return reached[-1] if reached else 0


def step_spend(
    record: SpendRecord, event: SpendEvent, now: float
) -> tuple[SpendRecord, SpendVerdict]:
    """Check the call against every group; an admitted call's estimate is held in each.

    A refused call holds nothing; the first refusal of a group below 100 percent marks
    the 100 percent alert sent and returns it. Records are updated in place.
    """
    if not event.groups:
        return record, ADMITTED_FREE
    estimate = event.estimate
    groups = record.groups
    for index, group in enumerate(event.groups):
        current = groups[index] = _live(groups[index], now)
        limits = effective(group, record.overrides[index])
        spent = Amount() if current is None else current.spent
        held = Amount() if current is None else current.held
        if not _passes(limits, spent, held, estimate):
            continue
        alert = None
        if current is None or current.alerted < 100:
            if current is None:
                current = groups[index] = GroupSpend(ends_at=group.ends_at)
            current.alerted = 100
            alert = SpendAlert(group.budget, group.group, 100, spent, limits, group.ends_at)
        verdict = SpendVerdict(
            False,
            refused=group,
            limits=limits,
            retry_after=max(0.0, group.ends_at - now),
            alert=alert,
        )
        return record, verdict
    for index, group in enumerate(event.groups):
        current = groups[index]
        if current is None:
            current = groups[index] = GroupSpend(ends_at=group.ends_at)
        current.held = _add(current.held, estimate)
    return record, SpendVerdict(True, hold=SpendHold(event.groups, estimate))


def step_charge(
    record: SpendRecord,
    hold: SpendHold,
    used: Amount | None,
    now: float,
    released: Sequence[Amount] | None = None,
) -> tuple[SpendRecord, list[SpendAlert]]:
    """Replace a hold with what the call used (None: nothing, a release); the alerts due.

    `released` is what to take off each group's `held` (`owned`; None: the hold's
    amount). A group reset since the hold was taken (or whose period ended) gets the
    charge afresh; a hold is never given back twice (held never goes below zero).
    """
    alerts: list[SpendAlert] = []
    for index, group in enumerate(hold.groups):
        current = record.groups[index]
        if current is None or current.ends_at <= now:
            if used is None:
                continue
            current = record.groups[index] = GroupSpend(ends_at=group.ends_at)
        current.held = _sub(current.held, hold.amount if released is None else released[index])
        if used is None:
            continue
        current.spent = _add(current.spent, used)
        limits = effective(group, record.overrides[index])
        threshold = crossed(limits, current.spent, current.alerted)
        if threshold:
            current.alerted = threshold
            alerts.append(
                SpendAlert(
                    group.budget, group.group, threshold, current.spent, limits, group.ends_at
                )
            )
    return record, alerts


def step_release(record: SpendRecord, hold: SpendHold, now: float) -> SpendRecord:
    """Give a hold back: the call cost nothing (refused, or failed by the provider)."""
    record, _ = step_charge(record, hold, None, now)
    return record


def owned(amount: Amount, still_held: Amount) -> Amount:
    """What a charge takes off a group's `held`: its hold, at most what its owner holds there."""
    return Amount(min(amount.nano_usd, still_held.nano_usd), min(amount.tokens, still_held.tokens))


def dead_hold(key: str, amount: Amount) -> SpendHold:
    """What an owner known dead held on the group stored under `key`, to `step_release`."""
    parts = parse_group_key(key)
    budget, label = (parts.budget, parts.label) if parts is not None else ("", "")
    group = SpendGroup(budget, "", key, limit_key(budget, label), Limits(), 0.0)
    return SpendHold((group,), amount)


def _add(a: Amount, b: Amount) -> Amount:
    return Amount(a.nano_usd + b.nano_usd, a.tokens + b.tokens)


def _sub(a: Amount, b: Amount) -> Amount:
    return Amount(max(0, a.nano_usd - b.nano_usd), max(0, a.tokens - b.tokens))
