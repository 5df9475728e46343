"""The pair budget as one pure step (issue 10): `step_pair`, `pair_view`, `step_bot_turns`."""

from __future__ import annotations

import math
from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from guards.bot_loop import (
    BotLoopGuard,
    BotLoopPolicy,
    PairDecision,
    PairRecord,
    PairSnapshot,
    pair_key,
    pair_view,
    step_bot_turns,
    step_pair,
)


def _policy(budget: int = 3, window: float = 10.0, cooldown: float = 30.0) -> BotLoopPolicy:
    return BotLoopPolicy(
        max_events_per_window=budget, window_seconds=window, cooldown_seconds=cooldown
    )


def _run(
    policy: BotLoopPolicy, times: list[float], record: PairRecord | None = None
) -> tuple[PairRecord | None, list[PairDecision]]:
    """Step one pair through events at `times`; the record after them and every decision."""
    decisions = []
    for now in times:
        record, decision = step_pair(record, policy, now)
        decisions.append(decision)
    return record, decisions


def test_issue10_first_event_builds_a_record() -> None:
    record, decision = step_pair(None, _policy(), 5.0)
    assert decision == PairDecision(True, "ok", 0.0, 1)
    assert record == PairRecord([5.0], None, 10.0, 15.0)


def test_issue10_budget_then_refusal_opens_a_cooldown_from_its_time() -> None:
    record, decisions = _run(_policy(budget=2), [0.0, 1.0, 2.0, 3.0])
    assert [d.reason for d in decisions] == ["ok", "ok", "budget_exceeded", "cooldown"]
    assert decisions[2] == PairDecision(False, "budget_exceeded", 30.0, 2)
    assert decisions[3] == PairDecision(False, "cooldown", 29.0, 2)
    assert record is not None
    assert record.cooldown_until == 32.0
    assert record.idle_at == 32.0


def test_issue10_event_at_t_plus_window_no_longer_counts() -> None:
    _, decisions = _run(_policy(budget=1), [0.0, 10.0])
    assert decisions[1] == PairDecision(True, "ok", 0.0, 1)
    # Just before t + window it still counts: the budget of one is spent.
    _, decisions = _run(_policy(budget=1, cooldown=0.0), [0.0, math.nextafter(10.0, 0.0)])
    assert decisions[1].reason == "budget_exceeded"


def test_issue10_cooldown_ending_exactly_now_admits_into_a_fresh_window() -> None:
    policy = _policy(budget=2, window=100.0, cooldown=30.0)
    record, decisions = _run(policy, [0.0, 1.0, 2.0])
    assert decisions[-1].reason == "budget_exceeded"  # the cooldown ends at 32
    record, before = step_pair(record, policy, math.nextafter(32.0, 0.0))
    assert before.reason == "cooldown"
    record, at_end = step_pair(record, policy, 32.0)
    # Events 0 and 1 are still inside the 100 s window, yet the window is fresh.
    assert at_end == PairDecision(True, "ok", 0.0, 1)
    assert record is not None
    assert list(record.times) == [32.0]
    assert record.cooldown_until is None


def test_issue10_cooldown_is_not_extended_nor_recorded() -> None:
    policy = _policy(budget=1, window=10.0, cooldown=30.0)
    record, decisions = _run(policy, [0.0, 1.0, 5.0, 20.0, 30.9])
    assert [d.reason for d in decisions][1:] == ["budget_exceeded"] + ["cooldown"] * 3
    assert [d.retry_after for d in decisions[2:]] == [26.0, 11.0, pytest.approx(0.1)]
    assert record is not None
    assert list(record.times) == []  # event 0 left the window; no refused event was kept
    assert step_pair(record, policy, 31.0)[1].reason == "ok"


def test_issue10_budget_lowered_mid_window_counts_the_events_held() -> None:
    # Budget 10, five events, `/loop set … 6`, three more: the sixth is admitted, the
    # seventh refused and opens the cooldown, the eighth finds it running.
    record, decisions = _run(_policy(budget=10, window=60.0), [0.0, 1.0, 2.0, 3.0, 4.0])
    assert all(d.allowed for d in decisions)
    record, after = _run(_policy(budget=6, window=60.0, cooldown=20.0), [5.0, 6.0, 7.0], record)
    assert after == [
        PairDecision(True, "ok", 0.0, 6),
        PairDecision(False, "budget_exceeded", 20.0, 6),
        PairDecision(False, "cooldown", 19.0, 6),
    ]


def test_issue10_budget_raised_mid_window_admits_up_to_the_new_budget() -> None:
    record, _ = _run(_policy(budget=2, window=60.0), [0.0, 1.0])
    record, after = _run(_policy(budget=4, window=60.0), [2.0, 3.0, 4.0], record)
    assert [d.reason for d in after] == ["ok", "ok", "budget_exceeded"]
    assert [d.count for d in after] == [3, 4, 4]


def test_issue10_shorter_window_drops_the_events_that_left_it() -> None:
    record, _ = _run(_policy(budget=3, window=60.0), [0.0, 10.0, 20.0])
    record, decision = step_pair(record, _policy(budget=3, window=15.0), 30.0)
    # Under 15 s only the event at 20 still counts.
    assert decision == PairDecision(True, "ok", 0.0, 2)
    assert record is not None
    assert list(record.times) == [20.0, 30.0]


def test_issue10_longer_window_keeps_counting_the_events_held() -> None:
    record, _ = _run(_policy(budget=3, window=10.0), [0.0, 5.0])
    # At 12, event 0 has left the 10 s window but was not dropped yet: a 60 s window
    # counts it again, so the budget of three is reached.
    record, decisions = _run(_policy(budget=3, window=60.0), [12.0, 13.0], record)
    assert [(d.reason, d.count) for d in decisions] == [("ok", 3), ("budget_exceeded", 3)]


def test_issue10_idle_record_starts_afresh_whatever_the_new_window() -> None:
    record, _ = _run(_policy(budget=2, window=10.0), [0.0, 1.0])
    assert record is not None
    assert record.idle_at == 11.0
    # Idle at 11 under its own window: forgetting it or not must give the same answer.
    kept, decision = step_pair(record, _policy(budget=2, window=60.0), 11.0)
    assert decision == step_pair(None, _policy(budget=2, window=60.0), 11.0)[1]
    assert decision.count == 1
    assert kept is record


def test_issue10_running_cooldown_keeps_its_end_when_cooldown_seconds_change() -> None:
    record, _ = _run(_policy(budget=1, cooldown=30.0), [0.0, 1.0])  # cooldown until 31
    record, shorter = step_pair(record, _policy(budget=1, cooldown=5.0), 10.0)
    assert shorter == PairDecision(False, "cooldown", 21.0, 0)
    record, longer = step_pair(record, _policy(budget=1, cooldown=300.0), 20.0)
    assert longer == PairDecision(False, "cooldown", 11.0, 0)
    assert step_pair(record, _policy(budget=1, cooldown=300.0), 31.0)[1].reason == "ok"


def test_issue10_disabled_policy_leaves_the_record_alone() -> None:
    record, _ = _run(_policy(budget=1), [0.0, 1.0])
    assert record is not None
    before = PairRecord(list(record.times), record.cooldown_until, record.window, record.idle_at)
    kept, decision = step_pair(record, BotLoopPolicy(enabled=False), 2.0)
    assert decision == PairDecision(True, "disabled", 0.0, 0)
    assert kept == before
    assert step_pair(None, BotLoopPolicy(enabled=False), 2.0) == (None, decision)


@pytest.mark.parametrize("budget", [64, 65, 1000])
def test_issue10_large_budgets_keep_their_events_in_a_deque(budget: int) -> None:
    record, decisions = _run(_policy(budget=budget, window=5.0), [i * 0.01 for i in range(300)])
    # 300 events in 3 s, all inside one 5 s window: the budget, then the cooldown.
    assert sum(d.allowed for d in decisions) == min(budget, 300)
    assert record is not None
    assert isinstance(record.times, deque) == (budget > 64)
    assert len(record.times) == min(budget, 300)


def test_issue10_pair_view_shows_counts_and_cooldown_left() -> None:
    record, _ = _run(_policy(budget=2, window=10.0, cooldown=30.0), [0.0, 1.0, 2.0])
    assert record is not None
    assert pair_view(record, 5.0) == (2, 27.0)
    assert pair_view(record, 11.0) == (0, 21.0)  # the events left, the cooldown runs on
    assert pair_view(record, 32.0) is None  # over: idle
    live, _ = _run(_policy(budget=5, window=10.0), [0.0, 4.0])
    assert live is not None
    assert pair_view(live, 9.0) == (2, 0.0)
    assert pair_view(live, 10.0) == (1, 0.0)
    assert pair_view(live, 14.0) is None


def test_issue10_bot_turns_step() -> None:
    count = 0
    for is_bot, expected in [(True, 1), (True, 2), (False, 0), (True, 1)]:
        count = step_bot_turns(count, is_bot=is_bot)
        assert count == expected


# --- properties ---------------------------------------------------------------------------

policies = st.builds(
    BotLoopPolicy,
    enabled=st.sampled_from([True, True, True, True, False]),
    # 65 takes the deque path for event times, the others the list path.
    max_events_per_window=st.sampled_from([1, 2, 3, 5, 65]),
    window_seconds=st.sampled_from([0.5, 1.0, 7.5, 30.0]),
    cooldown_seconds=st.sampled_from([0.0, 0.5, 3.0, 50.0]),
)
gaps = st.sampled_from([0.0, 0.01, 0.1]) | st.floats(min_value=0, max_value=0.5)


@settings(max_examples=300, deadline=None)
@given(policies.filter(lambda p: p.enabled), st.lists(gaps | st.floats(0, 10), max_size=200))
def test_issue10_ping_pong_never_admits_more_than_the_budget_in_any_window(
    policy: BotLoopPolicy, steps: list[float]
) -> None:
    record = None
    admitted: list[tuple[int, float]] = []  # (cooldowns opened before it, time)
    now = 0.0
    epoch = 0
    for dt in steps:
        now += dt
        before = None if record is None else (list(record.times), record.cooldown_until)
        record, decision = step_pair(record, policy, now)
        assert record is not None
        if decision.allowed:
            admitted.append((epoch, now))
            assert record.times[-1] == now
            continue
        # A refused event is never recorded: the record only lost what left the window.
        assert before is not None
        window = policy.window_seconds
        assert list(record.times) == [t for t in before[0] if t + window > now]
        assert decision.count == len(record.times)
        if decision.reason == "budget_exceeded":
            epoch += 1
            assert decision.retry_after == policy.cooldown_seconds
        else:
            assert decision.reason == "cooldown"
            assert record.cooldown_until == before[1]  # not extended
    # Within one fresh window's events, any window [s, s + window) holds at most the budget.
    for epoch_of, start in admitted:
        end = start + policy.window_seconds
        assert (
            sum(start <= t < end for e, t in admitted if e == epoch_of)
            <= policy.max_events_per_window
        )


Key = tuple[str | None, str, str]


class _Reference:
    """DESIGN §1 with per-event policies, as plainly as possible: lists, no table."""

    def __init__(self) -> None:
        # key -> (times, cooldown_until, the window of the last event)
        self.pairs: dict[Key, tuple[list[float], float | None, float]] = {}

    def decide(self, key: Key, policy: BotLoopPolicy, now: float) -> PairDecision:
        if not policy.enabled:
            return PairDecision(True, "disabled", 0.0, 0)
        window = policy.window_seconds
        times, until, last_window = self.pairs.get(key, ([], None, window))
        # Idle once its cooldown is over, or its last event left the window it was counted in.
        last_end = times[-1] + last_window if times else -math.inf
        if now >= (until if until is not None else last_end):
            times, until = [], None
        times = [t for t in times if t + window > now]
        if until is not None:
            decision = PairDecision(False, "cooldown", until - now, len(times))
        elif len(times) < policy.max_events_per_window:
            times.append(now)
            decision = PairDecision(True, "ok", 0.0, len(times))
        else:
            until = now + policy.cooldown_seconds
            decision = PairDecision(False, "budget_exceeded", policy.cooldown_seconds, len(times))
        self.pairs[key] = (times, until, window)
        return decision

    def reset(self, scope: str | None, bot: str | None) -> None:
        for key in list(self.pairs):
            if (scope is None or key[0] == scope) and (bot is None or bot in key[1:]):
                del self.pairs[key]

    def snapshot(self, now: float) -> set[PairSnapshot]:
        live = set()
        for key, (times, until, window) in self.pairs.items():
            if until is not None and now >= until:
                continue
            count = sum(t + window > now for t in times)
            if until is None and count == 0:
                continue
            left = 0.0 if until is None else until - now
            live.add(PairSnapshot(key[0], key[1], key[2], count, left))
        return live


event_steps = st.lists(
    st.tuples(
        gaps | st.floats(min_value=0, max_value=20),
        st.sampled_from([("a", "b"), ("b", "a"), ("a", "c"), ("c", "a")]),
        st.sampled_from([None, None, "room"]),
        st.integers(min_value=0, max_value=3),  # which policy (they change now and then)
        st.integers(min_value=0, max_value=24),  # below 3: a reset instead of an event
    ),
    min_size=20,
    max_size=80,
)


def test_issue10_step_guard_and_reference_agree_under_policy_changes() -> None:
    seen = {"examples": 0, "budget_exceeded": 0, "cooldown": 0, "changed": 0}

    @settings(max_examples=200, deadline=None)
    @given(st.lists(policies, min_size=4, max_size=4), event_steps)
    def prop(
        choices: list[BotLoopPolicy],
        steps: list[tuple[float, tuple[str, str], str | None, int, int]],
    ) -> None:
        guard = BotLoopGuard(choices[0])
        reference = _Reference()
        records: dict[Key, PairRecord] = {}
        last: dict[Key, BotLoopPolicy] = {}
        now = 0.0
        for dt, (a, b), scope, which, roll in steps:
            if roll < 3:
                reset_scope, reset_bot = ((scope, None), (None, b), (scope, b))[roll]
                guard.reset(scope=reset_scope, bot_id=reset_bot)
                reference.reset(reset_scope, reset_bot)
                for key in list(records):
                    if (reset_scope is None or key[0] == reset_scope) and (
                        reset_bot is None or reset_bot in key[1:]
                    ):
                        del records[key]
                continue
            now += dt
            policy = choices[which]
            key = (scope, *pair_key(a, b))
            expected = reference.decide(key, policy, now)
            record, stepped = step_pair(records.get(key), policy, now)
            if record is not None:
                records[key] = record
            got = guard.decide(self_bot_id=a, sender_bot_id=b, now=now, scope=scope, policy=policy)
            assert stepped == expected
            assert got == expected
            seen[got.reason] = seen.get(got.reason, 0) + 1
            seen["changed"] += key in last and last[key] != policy and policy.enabled
            last[key] = policy
        assert set(guard.snapshot(now=now)) == reference.snapshot(now)
        views = {key: pair_view(record, now) for key, record in records.items()}
        assert {key: view for key, view in views.items() if view is not None} == {
            (s.scope, s.bot_a, s.bot_b): (s.count, s.cooldown_remaining)
            for s in reference.snapshot(now)
        }
        seen["examples"] += 1

    prop()
    # Not vacuous: refusals of both kinds and policy changes on live pairs happen all along.
    for what in ("budget_exceeded", "cooldown", "changed"):
        assert seen[what] >= seen["examples"] // 4, (what, seen)
