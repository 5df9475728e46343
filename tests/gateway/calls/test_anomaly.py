"""The spend anomaly detector: the pure step, and every CallStore backend held to it (issue 14).

The step cases run on `gateway.calls.anomaly` alone, on an injected clock with spend
history over 7 days; the conformance cases run the same charges against memory, sqlite
and redis (the Lua second version) and against the step over a plain dict, the
reference, and every alert and every paused agent's refusal must agree.
"""

from __future__ import annotations

import random

import pytest

from gateway.calls.anomaly import (
    MAX_SESSIONS,
    OTHER_SESSIONS,
    AgentSpend,
    AnomalyAlert,
    AnomalyCharge,
    AnomalyEvent,
    AnomalyPolicy,
    anomaly_key,
    anomaly_pause,
    median,
    step_agent_hold,
    step_anomaly,
)
from gateway.calls.budgets import Amount, SpendEvent, SpendHold, nano
from guards.call_loop import Hold, circuit_key
from tests.gateway.calls.store_helpers import START, Clock, MakeStore, fingerprint, redis_replicas

HOUR = 3_600.0
DAY = 86_400.0
AGENT = "billing-bot"
KEY = anomaly_key(AGENT)
POLICY = AnomalyPolicy(window=HOUR, factor=3.0, min_nano=nano(1.0))
PAUSING = AnomalyPolicy(window=HOUR, factor=3.0, min_nano=nano(1.0), action="pause")
NO_HOLD = SpendHold((), Amount())


def charge(usd: float, session: str = "run-1", agent: str = AGENT) -> AnomalyEvent:
    return AnomalyEvent(agent, anomaly_key(agent), session, nano(usd))


def history(days: float, usd_per_hour: float) -> AgentSpend:
    """An agent that spent `usd_per_hour` in every hour of the last `days`, stepped so."""
    record = None
    at = START - days * DAY
    while at < START:
        record, alert = step_anomaly(record, charge(usd_per_hour), POLICY, at)
        at += HOUR
    assert record is not None
    return record


# The pure step


def test_issue14_anomaly_fires_once_per_window_with_the_figures_and_top_sessions() -> None:
    record = history(7, 1.0)
    alerts: list[AnomalyAlert] = []
    # $1 an hour for 7 days: the median is $1, so more than $3 this hour is an anomaly.
    for usd, session in ((1.5, "run-a"), (1.0, "run-b"), (0.5, "run-a"), (0.5, "run-c")):
        record, alert = step_anomaly(record, charge(usd, session), POLICY, START + 60)
        if alert is not None:
            alerts.append(alert)
    assert len(alerts) == 1
    (alert,) = alerts
    assert alert.spent == nano(3.5)
    assert alert.median == nano(1.0)
    assert (alert.factor, alert.min_nano, alert.new_agent) == (3.0, nano(1.0), False)
    assert (alert.window_start, alert.window_end) == (START, START + HOUR)
    assert alert.sessions == (("run-a", nano(2.0)), ("run-b", nano(1.0)), ("run-c", nano(0.5)))
    assert alert.paused is None
    # Not twice in one window; once again in the next one.
    record, again = step_anomaly(record, charge(5.0), POLICY, START + HOUR - 1)
    assert again is None
    record, following = step_anomaly(record, charge(5.0), POLICY, START + HOUR)
    assert following is not None
    assert following.window_start == START + HOUR


def test_issue14_an_agent_under_min_usd_or_under_factor_times_median_is_not_an_anomaly() -> None:
    quiet = history(3, 0.0)
    # The median is 0, but $0.90 is under min_usd ($1).
    quiet, alert = step_anomaly(quiet, charge(0.9), POLICY, START + 10)
    assert alert is None
    busy = history(3, 2.0)
    # $5 is above min_usd but under 3 x the $2 median.
    busy, alert = step_anomaly(busy, charge(5.0), POLICY, START + 10)
    assert alert is None
    busy, alert = step_anomaly(busy, charge(1.5), POLICY, START + 20)
    assert alert is not None
    assert alert.spent == nano(6.5)


def test_issue14_a_new_agent_is_judged_by_min_usd_alone() -> None:
    young = history(0.5, 5.0)
    # Twelve hours of $5: under a day of history, so no median: min_usd decides.
    young, alert = step_anomaly(young, charge(1.01), POLICY, START + 10)
    assert alert is not None
    assert alert.new_agent
    brand_new, alert = step_anomaly(None, charge(0.99), POLICY, START)
    assert alert is None
    brand_new, alert = step_anomaly(brand_new, charge(0.02), POLICY, START + 1)
    assert alert is not None


def test_issue14_the_median_counts_empty_windows_as_zero_and_only_since_the_agent_began() -> None:
    record = None
    # Two days old: $10 in 30 of its 48 hours, nothing in the other 18.
    for hour in range(48):
        usd = 10.0 if hour < 30 else 0.0
        record, _ = step_anomaly(record, charge(usd), POLICY, START - 2 * DAY + hour * HOUR)
    record, _ = step_anomaly(record, charge(0.0), POLICY, START)
    assert record is not None
    # The windows before its first charge do not count: 30 of 48 at $10, the median $10.
    assert record.median == nano(10.0)
    assert median([0, 0, 3, 5]) == 1.5
    assert median([]) == 0.0


def test_issue14_the_median_looks_back_7_days_and_an_idle_record_expires() -> None:
    record = history(9, 1.0)
    assert min(record.past) == record.window - POLICY.windows
    # Seven quiet days later the record is over: the agent starts afresh.
    later = START + 7 * DAY + HOUR
    fresh, alert = step_anomaly(record, charge(1.5), POLICY, later)
    assert fresh is not record
    assert alert is not None
    assert alert.new_agent


def test_issue14_sessions_beyond_the_cap_count_together() -> None:
    record = None
    for n in range(MAX_SESSIONS + 5):
        record, _ = step_anomaly(record, charge(0.001, f"s{n}"), POLICY, START)
    assert record is not None
    assert len(record.sessions) == MAX_SESSIONS + 1
    assert record.sessions[OTHER_SESSIONS] == 5 * nano(0.001)


def test_issue14_a_paused_agent_is_refused_and_counted() -> None:
    hold = anomaly_pause(None, START)
    circuit = circuit_key(AGENT, "run-9")
    after, verdict = step_agent_hold(hold, KEY, circuit, START + 5)
    assert verdict is not None
    assert (verdict.allowed, verdict.code, verdict.circuit) == (False, "loop_paused", circuit)
    assert KEY in verdict.message
    assert after is not None
    assert after.count == 2
    lifted = Hold(START, START, START + 60, "anomaly", None, 0)
    assert step_agent_hold(lifted, KEY, circuit, START + 5) == (lifted, None)


# Every backend alike


def paused_event() -> SpendEvent:
    return SpendEvent((), Amount(), KEY)


async def test_issue14_backends_agree_with_the_anomaly_step_on_a_random_script(
    make: MakeStore, clock: Clock
) -> None:
    store = await make()
    rng = random.Random(1414)
    reference: dict[str, AgentSpend] = {}
    agents = ("billing-bot", "support-bot")
    policy = AnomalyPolicy(window=HOUR, factor=2.5, min_nano=nano(0.5))
    clock.now = START - 9 * DAY
    fired = 0
    for n in range(700):
        # Mostly minutes apart, sometimes hours or days: windows roll, records expire.
        clock.now += rng.choice((30.0, 60.0, 300.0, 900.0, 2 * HOUR))
        if n % 233 == 117:
            clock.now += rng.choice((3 * DAY, 8 * DAY))
        agent = rng.choice(agents)
        usd = rng.choice((0.01, 0.05, 0.2, 0.4, 1.5 if rng.random() < 0.05 else 0.1))
        event = charge(usd, rng.choice(("a", "b", "c", "")), agent)
        record, expected = step_anomaly(reference.get(agent), event, policy, clock.now)
        reference[agent] = record
        settled = await store.settle(NO_HOLD, Amount(event.used, 10), AnomalyCharge(event, policy))
        assert settled.anomaly == expected, n
        fired += expected is not None
    assert fired >= 5


async def test_issue14_pause_action_pauses_the_agent_and_reopen_lifts_it(
    make: MakeStore, clock: Clock
) -> None:
    store = await make()
    circuit = circuit_key(AGENT, "run-1")
    admitted = await store.admit(circuit, fingerprint(0), {}, paused_event())
    assert admitted.call is not None
    assert admitted.call.allowed
    settled = await store.settle(
        NO_HOLD, Amount(nano(1.5), 10), AnomalyCharge(charge(1.5), PAUSING)
    )
    assert settled.anomaly is not None
    assert settled.anomaly.paused == KEY
    for n in range(1, 3):
        # Every circuit of the agent is refused, with or without a session.
        other = circuit_key(AGENT, f"run-{n}" if n == 1 else None)
        refused = await store.admit(other, fingerprint(n), {}, paused_event())
        assert refused.call is not None
        assert (refused.call.allowed, refused.call.code) == (False, "loop_paused")
        assert refused.spend.hold is None
    (paused,) = await store.paused()
    assert (paused.circuit, paused.reason, paused.count) == (KEY, "anomaly", 3)
    assert await store.reopen(KEY)
    assert await store.paused() == []
    again = await store.admit(circuit, fingerprint(7), {}, paused_event())
    assert again.call is not None
    assert again.call.allowed


@pytest.mark.redis
async def test_issue14_replicas_on_one_redis_share_the_detector(
    redis_url: str, clock: Clock
) -> None:
    async with redis_replicas(redis_url, clock, "anomaly-shared:") as replicas:
        alerts = []
        for n in range(8):
            clock.now = START + n
            event = charge(0.3, f"run-{n % 3}")
            settled = await replicas[n % 2].settle(
                NO_HOLD, Amount(event.used, 1), AnomalyCharge(event, PAUSING)
            )
            if settled.anomaly is not None:
                alerts.append((n, settled.anomaly))
        # $0.30 a call, a new agent: the fourth call passes min_usd, on replica 1; only once.
        assert [(n, alert.spent) for n, alert in alerts] == [(3, nano(1.2))]
        refused = await replicas[0].admit(
            circuit_key(AGENT, "x"), fingerprint(1), {}, paused_event()
        )
        assert refused.call is not None
        assert refused.call.code == "loop_paused"
        assert await replicas[0].reopen(KEY)
        lifted = await replicas[1].admit(
            circuit_key(AGENT, "x"), fingerprint(2), {}, paused_event()
        )
        assert lifted.call is not None
        assert lifted.call.allowed
