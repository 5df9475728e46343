"""Spend budgets: the pure step, and every CallStore backend held to it (issue 14).

The step cases run on `gateway.calls.budgets` alone; the conformance cases run the same
calls against memory, sqlite and redis (an injected clock everywhere) and against the
step over a plain dict, the reference, and every verdict, alert and record must agree.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from datetime import datetime
from typing import get_args
from zoneinfo import ZoneInfo

import pytest

from gateway.calls.budgets import (
    NONE_VALUE,
    PER_FIELDS,
    Amount,
    Budget,
    GroupSpend,
    Limits,
    Period,
    SpendAlert,
    SpendEvent,
    SpendGroup,
    SpendHold,
    SpendRecord,
    SpendVerdict,
    group_key,
    limit_key,
    nano,
    parse_group_key,
    period_span,
    step_charge,
    step_spend,
)
from gateway.calls.store import ShadowGuards
from gateway.config.proxy import PerField
from guards.call_loop import CallLoopPolicy, UniquenessRule, circuit_key
from tests.gateway.calls.store_helpers import START, Clock, MakeStore, fingerprint, redis_replicas

DAY_END = datetime(2027, 1, 16, tzinfo=ZoneInfo("UTC")).timestamp()


def group(
    name: str = "daily",
    values: Sequence[str] = ("billing-bot",),
    *,
    usd: float | None = 1.0,
    tokens: int | None = None,
    ends_at: float = DAY_END,
    label: str = "2027-01-15",
) -> SpendGroup:
    return SpendGroup(
        name,
        " ".join(values),
        group_key(name, label, values),
        limit_key(name, label),
        Limits(None if usd is None else nano(usd), tokens),
        ends_at,
    )


def event(*groups: SpendGroup, usd: float = 0.1, tokens: int = 100) -> SpendEvent:
    return SpendEvent(groups, Amount(nano(usd), tokens))


def empty(spend: SpendEvent | SpendHold) -> SpendRecord:
    return SpendRecord([None] * len(spend.groups), [None] * len(spend.groups))


# The pure step


def test_issue14_reaching_a_limit_exactly_is_allowed_passing_it_is_refused() -> None:
    daily = group(usd=0.3)
    record = empty(event(daily))
    for _ in range(3):
        record, verdict = step_spend(record, event(daily), START)
        assert verdict.allowed
        assert verdict.hold is not None
        record, _ = step_charge(record, verdict.hold, Amount(nano(0.1), 100), START)
    # 0.1 + 0.2 is not 0.3 in floats; in nano-dollars it is, so the 3rd call fits exactly.
    spent = record.groups[0]
    assert spent is not None
    assert spent.spent == Amount(nano(0.3), 300)
    assert spent.held == Amount()
    record, verdict = step_spend(record, event(daily), START)
    assert not verdict.allowed
    assert verdict.refused == daily
    assert verdict.retry_after == DAY_END - START


def test_issue14_admitted_estimates_are_held_until_charged_so_concurrency_cannot_pass() -> None:
    daily = group(usd=1.0)
    record = empty(event(daily))
    admitted = []
    for _ in range(50):
        record, verdict = step_spend(record, event(daily, usd=0.1), START)
        if verdict.allowed:
            admitted.append(verdict)
    # Nothing charged yet: the holds alone stop the 11th call.
    assert len(admitted) == 10
    held = record.groups[0]
    assert held is not None
    assert held.held.nano_usd == nano(1.0)
    # Each call really used more than its estimate: the overshoot is the calls in flight.
    for verdict in admitted:
        assert verdict.hold is not None
        record, _ = step_charge(record, verdict.hold, Amount(nano(0.12), 100), START)
    charged = record.groups[0]
    assert charged is not None
    assert charged.spent.nano_usd == nano(1.2)
    assert charged.held == Amount()


def test_issue14_alerts_at_50_80_100_once_each_and_the_first_refusal_sends_100() -> None:
    daily = group(usd=1.0)
    record = empty(event(daily))
    alerts: list[SpendAlert] = []
    for used in (0.3, 0.25, 0.1, 0.2, 0.1):
        record, verdict = step_spend(record, event(daily, usd=0.0), START)
        assert verdict.hold is not None
        record, crossed = step_charge(record, verdict.hold, Amount(nano(used), 1), START)
        alerts += crossed
    assert [a.threshold for a in alerts] == [50, 80]
    record, refused = step_spend(record, event(daily, usd=0.1), START)
    assert refused.alert is not None
    assert refused.alert.threshold == 100
    record, again = step_spend(record, event(daily, usd=0.1), START)
    assert not again.allowed
    assert again.alert is None


def test_issue14_a_charge_crossing_two_thresholds_sends_the_higher_one() -> None:
    daily = group(usd=1.0)
    record, verdict = step_spend(empty(event(daily)), event(daily, usd=0.0), START)
    assert verdict.hold is not None
    _, alerts = step_charge(record, verdict.hold, Amount(nano(0.9), 1), START)
    assert [a.threshold for a in alerts] == [80]


def test_issue14_a_token_limit_and_an_ended_period_counts_as_none() -> None:
    tokens = group(usd=None, tokens=1000)
    record = empty(event(tokens))
    record, verdict = step_spend(record, event(tokens, tokens=1000), START)
    assert verdict.allowed
    record, verdict = step_spend(record, event(tokens, tokens=1), START)
    assert not verdict.allowed
    # After the period's end the old record decides nothing.
    record, verdict = step_spend(record, event(tokens, tokens=1000), DAY_END)
    assert verdict.allowed


def test_issue14_a_missing_per_field_is_the_none_group_and_filters_take_a_prefix() -> None:
    budget = Budget(
        "cust", ("customer", "feature"), Limits(tokens=10), "day", (("feature", "inv*"),)
    )
    assert budget.group({"feature": "invoice"}) == f"customer={NONE_VALUE} feature=invoice"
    assert budget.values({"feature": "invoice"}) == (NONE_VALUE, "invoice")
    assert budget.matches({"feature": "invoice"})
    assert not budget.matches({"feature": "chat"})
    assert not budget.matches({})
    key = group_key("cust", "2027-01-15", budget.values({"customer": "a b\x1f"}))
    parsed = parse_group_key(key)
    assert parsed is not None
    assert parsed.values == ("a b\x1f", NONE_VALUE)


@pytest.mark.parametrize(
    ("period", "now", "label", "end"),
    [
        ("day", "2027-03-28T12:00", "2027-03-28", "2027-03-29T00:00"),
        ("week", "2027-03-28T12:00", "2027-03-22", "2027-03-29T00:00"),
        ("month", "2027-12-31T23:59", "2027-12-01", "2028-01-01T00:00"),
    ],
)
def test_issue14_periods_in_the_budget_time_zone(
    period: Period, now: str, label: str, end: str
) -> None:
    zone = ZoneInfo("Europe/Berlin")
    at = datetime.fromisoformat(now).replace(tzinfo=zone).timestamp()
    span = period_span(period, zone, at)
    assert span.label == label
    assert span.ends_at == datetime.fromisoformat(end).replace(tzinfo=zone).timestamp()


def test_issue14_a_dst_day_is_23_hours() -> None:
    zone = ZoneInfo("Europe/Berlin")
    at = datetime(2027, 3, 28, 12, tzinfo=zone).timestamp()
    start = datetime(2027, 3, 28, tzinfo=zone).timestamp()
    assert period_span("day", zone, at).ends_at - start == 23 * 3600


# Every backend alike


CIRCUIT = circuit_key("billing-bot", "run-1")


async def test_issue14_backends_agree_with_the_step_on_a_random_script(
    make: MakeStore, clock: Clock
) -> None:
    store = await make()
    daily = group("daily", ("billing-bot",), usd=2.0)
    tokens = group("tokens", ("acme",), usd=None, tokens=5_000)
    total = group("all", (), usd=3.0, ends_at=DAY_END + 86_400 * 10, label="2027-01-01")
    spend_event = (daily, tokens, total)
    reference: dict[str, GroupSpend] = {}
    overrides: dict[str, Limits] = {}
    rng = random.Random(14)
    holds: list[SpendHold] = []
    for n in range(160):
        action = rng.random()
        clock.now = START + n
        if action < 0.5 or not holds:
            picked = tuple(g for g in spend_event if rng.random() < 0.8) or (daily,)
            call = SpendEvent(
                picked, Amount(nano(rng.choice((0.05, 0.2, 0.5))), rng.randrange(900))
            )
            record = SpendRecord(
                [reference.get(g.key) for g in picked], [overrides.get(g.limit_key) for g in picked]
            )
            record, expected = step_spend(record, call, clock.now)
            _keep(reference, picked, record)
            admission = await store.admit(CIRCUIT, fingerprint(n), {}, call)
            assert _same(admission.spend, expected), n
            if admission.spend.hold is not None:
                holds.append(admission.spend.hold)
        elif action < 0.85:
            hold = holds.pop(rng.randrange(len(holds)))
            used = None if rng.random() < 0.2 else Amount(nano(rng.random()), rng.randrange(2000))
            record = SpendRecord(
                [reference.get(g.key) for g in hold.groups],
                [overrides.get(g.limit_key) for g in hold.groups],
            )
            record, expected_alerts = step_charge(record, hold, used, clock.now)
            _keep(reference, hold.groups, record)
            assert await store.charge(hold, used) == expected_alerts, n
        elif action < 0.93:
            target = rng.choice(spend_event)
            reference.pop(target.key, None)
            await store.reset_spend(target.key)
        else:
            raised = Limits(nano(rng.choice((2.5, 4.0))), 8_000)
            overrides[daily.limit_key] = raised
            await store.set_spend_limit(daily.limit_key, raised, daily.ends_at)
    stored = dict(await store.spend_groups())
    assert stored == {key: g for key, g in reference.items() if g.ends_at > clock.now}
    assert await store.spend_limits() == overrides


def _keep(table: dict[str, GroupSpend], groups: Sequence[SpendGroup], record: SpendRecord) -> None:
    for spend_group, current in zip(groups, record.groups, strict=True):
        if current is None:
            table.pop(spend_group.key, None)
        else:
            table[spend_group.key] = GroupSpend(
                current.spent, current.held, current.alerted, current.ends_at
            )


def _same(got: SpendVerdict, expected: SpendVerdict) -> bool:
    return (
        got.allowed == expected.allowed
        and got.refused == expected.refused
        and got.limits == expected.limits
        and got.retry_after == pytest.approx(expected.retry_after)
        and got.alert == expected.alert
        and got.hold == expected.hold
    )


async def test_issue14_fifty_concurrent_calls_on_a_nearly_spent_budget(
    make: MakeStore, clock: Clock
) -> None:
    store = await make()
    daily = group(usd=10.0)
    first = await store.admit(CIRCUIT, fingerprint(0), {}, event(daily, usd=9.0))
    assert first.spend.hold is not None
    await store.charge(first.spend.hold, Amount(nano(9.0), 1))
    # $1 left, $0.15 a call: six fit; the 44 others are refused while six are in flight.
    calls = [
        store.admit(circuit_key("billing-bot", f"s{n}"), fingerprint(n), {}, event(daily, usd=0.15))
        for n in range(1, 51)
    ]
    admissions = await asyncio.gather(*calls)
    admitted = [a.spend.hold for a in admissions if a.spend.allowed]
    assert len(admitted) == 6
    # Each used twice its estimate: the overshoot is bounded by the six in flight.
    for hold in admitted:
        assert hold is not None
        await store.charge(hold, Amount(nano(0.30), 1))
    ((_, spent),) = await store.spend_groups()
    assert spent.spent.nano_usd == nano(9.0 + 6 * 0.30)
    assert spent.spent.nano_usd - nano(10.0) <= len(admitted) * nano(0.30)
    assert spent.held == Amount()


async def test_issue14_a_budget_refusal_is_not_counted_by_the_repeat_guard(
    make: MakeStore,
) -> None:
    store = await make()
    daily = group(usd=0.1)
    refused = await store.admit(CIRCUIT, fingerprint(1), {}, event(daily, usd=0.2))
    assert refused.call is None
    assert not refused.spend.allowed
    # Five identical calls fit the repeat guard: none was counted by the refused one.
    for _ in range(5):
        admitted = await store.admit(CIRCUIT, fingerprint(1), {}, event(daily, usd=0.0))
        assert admitted.call is not None
        assert admitted.call.allowed
    looped = await store.admit(CIRCUIT, fingerprint(1), {}, event(daily, usd=0.01))
    assert looped.call is not None
    assert looped.call.code == "loop_detected"
    # The repeat guard refused it after the budget admitted it: only the five stay held.
    ((_, spent),) = await store.spend_groups()
    assert spent.held == Amount(0, 5 * 100)


async def test_issue20_a_refusal_in_shadow_mode_keeps_its_hold(make: MakeStore) -> None:
    rules = [
        UniquenessRule.from_dict(
            {"name": "one-per-step", "fields": ["step"], "max_calls": 1, "window_seconds": 60}
        ),
        UniquenessRule.from_dict(
            {"name": "one-per-user", "fields": ["user"], "max_calls": 1, "window_seconds": 60}
        ),
    ]
    store = await make(CallLoopPolicy(max_repeats=1), rules)
    daily = group(usd=1.0)
    shadow = ShadowGuards(circuit=True, rules=frozenset({"one-per-user"}))
    calls = [
        (fingerprint(1), {}, "ok"),
        (fingerprint(1), {}, "loop_detected"),  # the circuit's, in shadow: held
        (fingerprint(2), {"user": "u", "step": "s"}, "loop_paused"),  # its pause: held
    ]
    for print_, fields, code in calls:
        admitted = await store.admit(CIRCUIT, print_, fields, event(daily), shadow=shadow)
        assert admitted.call is not None
        assert admitted.call.code == code
    a, b, c = (circuit_key("billing-bot", f"run-{n}") for n in (2, 3, 4))
    await store.admit(a, fingerprint(3), {"user": "u", "step": "s"}, event(daily))
    # The rule in shadow refuses a second call of user u (held); the enforced one step s.
    user = await store.admit(b, fingerprint(4), {"user": "u"}, event(daily), shadow=shadow)
    step = await store.admit(c, fingerprint(5), {"step": "s"}, event(daily), shadow=shadow)
    assert user.call is not None
    assert (user.call.code, user.call.rule) == ("duplicate_call", "one-per-user")
    assert step.call is not None
    assert (step.call.code, step.call.rule) == ("duplicate_call", "one-per-step")
    ((_, spent),) = await store.spend_groups()
    assert spent.held == Amount(nano(0.1) * 5, 500)
    # Enforced, the same refusal gives its hold back.
    again = await store.admit(CIRCUIT, fingerprint(1), {}, event(daily))
    assert again.call is not None
    assert again.call.code == "loop_paused"
    ((_, spent),) = await store.spend_groups()
    assert spent.held == Amount(nano(0.1) * 5, 500)


async def test_issue24_charging_a_zero_dollar_hold_beside_others_in_flight(
    make: MakeStore,
) -> None:
    # An unpriced model under a token budget: every estimate holds $0 and some tokens. The
    # charge gives back part of what this owner holds in the group, a zero amount of
    # dollars included (the Lua once sent HINCRBY "-0", which Redis refuses).
    store = await make()
    tokens = group("tokens", ("acme",), usd=None, tokens=5_000)
    admissions = [
        await store.admit(
            circuit_key("billing-bot", f"s{n}"), fingerprint(n), {}, event(tokens, usd=0.0)
        )
        for n in range(3)
    ]
    holds = [a.spend.hold for a in admissions]
    assert all(hold is not None for hold in holds)
    first, second, third = (hold for hold in holds if hold is not None)
    assert await store.charge(first, Amount(0, 80)) == []
    await store.charge(second, None)
    ((_, spent),) = await store.spend_groups()
    assert spent.spent == Amount(0, 80)
    assert spent.held == Amount(0, 100)
    assert await store.charge(third, Amount(0, 120)) == []
    ((_, spent),) = await store.spend_groups()
    assert (spent.spent, spent.held) == (Amount(0, 200), Amount())


async def test_issue14_decide_without_budgets_still_answers_as_before(make: MakeStore) -> None:
    store = await make()
    policy = CallLoopPolicy(max_repeats=1)
    assert (await store.decide(CIRCUIT, fingerprint(2), {}, policy=policy)).allowed
    assert (await store.decide(CIRCUIT, fingerprint(2), {}, policy=policy)).code == "loop_detected"


@pytest.mark.redis
async def test_issue14_two_replicas_on_one_redis_share_every_counter(
    redis_url: str, clock: Clock
) -> None:
    async with redis_replicas(redis_url, clock, "spend-shared:") as replicas:
        daily = group(usd=1.0)
        calls = [
            replicas[n % 2].admit(
                circuit_key("billing-bot", f"s{n}"), fingerprint(n), {}, event(daily, usd=0.1)
            )
            for n in range(30)
        ]
        admissions = await asyncio.gather(*calls)
        holds = [a.spend.hold for a in admissions if a.spend.hold is not None]
        assert len(holds) == 10
        # The first refusal, on whichever replica, sends the 100% alert; once for both.
        refusal_alerts = [a.spend.alert for a in admissions if a.spend.alert is not None]
        assert [alert.threshold for alert in refusal_alerts] == [100]
        for n, hold in enumerate(holds):
            assert await replicas[n % 2].charge(hold, Amount(nano(0.1), 10)) == []
        # A limit raised through one replica holds on the other at the next call.
        await replicas[0].set_spend_limit(daily.limit_key, Limits(nano(2.0)), daily.ends_at)
        more = await replicas[1].admit(CIRCUIT, fingerprint(99), {}, event(daily, usd=0.5))
        assert more.spend.allowed
        views = [dict(await replica.spend_groups()) for replica in replicas]
        assert views[0] == views[1]
        assert views[0][daily.key].spent.nano_usd == nano(1.0)


def test_issue14_the_config_per_fields_are_the_step_s() -> None:
    assert get_args(PerField) == PER_FIELDS
