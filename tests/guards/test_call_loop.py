"""Tests for guards.call_loop.guard and .policy: circuits, uniqueness rules (issue 6)."""

from __future__ import annotations

import random
import threading
from collections.abc import Mapping, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from guards.call_loop import (
    CallDecision,
    CallLoopGuard,
    CallLoopPolicy,
    Circuit,
    LoggedCall,
    PausedCircuit,
    UniquenessRule,
    circuit_key,
    fingerprint_call,
    is_provider_failure,
    preview_rule,
)
from guards.call_loop import guard as guarding
from tests.fakes.inmemory import FakeClock

MODEL = "gpt-4o-mini"


def fp(*texts: str, model: str = MODEL) -> str:
    return fingerprint_call(model, [{"role": "user", "content": text} for text in texts])


# ---------------------------------------------------------------------------------------
# Circuits
# ---------------------------------------------------------------------------------------


A = fp("Check order 12345 at 10:00")
B = fp("Check order 12345, what is its status?")
SESSION = circuit_key("billing-bot", "run-1")


def send(guard: CallLoopGuard, fingerprint: str, at: float, circuit: str = SESSION) -> CallDecision:
    return guard.check(circuit=circuit, fingerprint=fingerprint, now=at)


def test_circuit_key_holds_agent_session_and_step() -> None:
    assert circuit_key("billing-bot", None) == "billing-bot"
    assert circuit_key("billing-bot", "") == "billing-bot"
    assert circuit_key("billing-bot", "run-1") == "billing-bot/session=run-1"
    assert circuit_key("billing-bot", "run-1", "page-3") == "billing-bot/session=run-1/step=page-3"
    # Separators inside values are escaped, so different triples never share a key.
    assert circuit_key("a/session=b", None) != circuit_key("a", "b")
    assert str(Circuit("bot", "s", "p")) == circuit_key("bot", "s", "p")
    with pytest.raises(ValueError, match="root"):
        Circuit("")


def test_issue6_sixth_identical_call_is_refused_and_pauses_the_circuit() -> None:
    guard = CallLoopGuard()
    decisions = [send(guard, A, 10.0 + i) for i in range(5)]
    assert all(d.allowed for d in decisions)
    assert [d.count for d in decisions] == [1, 2, 3, 4, 5]

    sixth = send(guard, A, 15.0)
    assert not sixth.allowed
    assert sixth.code == "loop_detected"
    assert sixth.retry_after == 300.0
    assert sixth.count == 6
    assert "billing-bot" in sixth.message
    assert "300 seconds" in sixth.message

    different = send(guard, B, 75.0)
    assert different.code == "loop_paused"
    assert different.retry_after == pytest.approx(240.0)
    assert not different.allowed

    other_session = send(guard, A, 75.0, circuit_key("billing-bot", "run-2"))
    other_key = send(guard, A, 75.0, circuit_key("support-bot", "run-1"))
    assert other_session.allowed
    assert other_key.allowed


def test_issue6_a_call_60_001_s_after_the_first_of_five_is_allowed() -> None:
    guard = CallLoopGuard()
    for i in range(5):
        assert send(guard, A, 100.0 + i * 10).allowed
    assert send(guard, A, 160.001).allowed
    assert send(guard, A, 160.002).code == "loop_detected"


def test_window_is_half_open() -> None:
    guard = CallLoopGuard(CallLoopPolicy(max_repeats=1, window_seconds=10.0))
    assert send(guard, A, 0.0).allowed
    assert send(guard, A, 10.0).allowed  # the first event counts in [0, 10)
    assert send(guard, A, 19.999).code == "loop_detected"


def test_issue6_occurrences_count_not_runs() -> None:
    guard = CallLoopGuard()
    sequence = [A, A, B, A, A, A]
    assert all(send(guard, f, 10.0 + i).allowed for i, f in enumerate(sequence))
    sixth_a = send(guard, A, 20.0)
    assert sixth_a.code == "loop_detected"


@pytest.mark.parametrize(
    ("status", "error"),
    [(429, None), (500, None), (502, None), (503, None), (529, None), (408, None)]
    + [(None, "timeout"), (None, "connection dropped")],
)
def test_issue6_provider_failures_are_not_counted(status: int | None, error: str | None) -> None:
    guard = CallLoopGuard()
    for i in range(20):
        decision = send(guard, A, 10.0 + i)
        assert decision.allowed
        assert guard.record_outcome(decision, status=status, error=error)
    assert is_provider_failure(status, error)


@pytest.mark.parametrize("status", [200, 400, 401, 404, 422])
def test_issue6_successes_and_other_4xx_are_counted(status: int) -> None:
    guard = CallLoopGuard()
    for i in range(5):
        decision = send(guard, A, 10.0 + i)
        assert decision.allowed
        assert not guard.record_outcome(decision, status=status)
    assert send(guard, A, 15.0).code == "loop_detected"


def test_concurrent_repeats_are_caught_before_their_outcome() -> None:
    guard = CallLoopGuard()
    pending = [send(guard, A, 10.0) for _ in range(5)]
    assert all(d.allowed for d in pending)
    assert send(guard, A, 10.0).code == "loop_detected"


def test_an_outcome_without_status_or_error_stays_counted() -> None:
    guard = CallLoopGuard()
    assert not is_provider_failure(None, None)
    assert not guard.record_outcome(send(guard, A, 0.0))


def test_refusals_cannot_be_uncounted() -> None:
    guard = CallLoopGuard(CallLoopPolicy(max_repeats=1))
    send(guard, A, 0.0)
    refused = send(guard, A, 1.0)
    assert not guard.record_outcome(refused, status=503)


def test_issue6_the_pause_ends_after_pause_seconds() -> None:
    guard = CallLoopGuard()
    for i in range(5):
        send(guard, A, 10.0 + i)
    assert send(guard, A, 15.0).code == "loop_detected"
    assert send(guard, A, 314.999).code == "loop_paused"
    after = send(guard, A, 315.0)
    assert after.allowed
    assert after.count == 1


def test_a_pause_shorter_than_the_window_keeps_the_counts() -> None:
    guard = CallLoopGuard(CallLoopPolicy(max_repeats=2, window_seconds=60.0, pause_seconds=5.0))
    send(guard, A, 0.0)
    send(guard, A, 1.0)
    assert send(guard, A, 2.0).code == "loop_detected"
    assert send(guard, B, 7.0).allowed
    assert send(guard, A, 7.0).code == "loop_detected"
    assert send(guard, A, 61.0).allowed


def test_issue6_reopen_lifts_the_pause_and_forgets_the_counts() -> None:
    guard = CallLoopGuard()
    for i in range(6):
        send(guard, A, 10.0 + i)
    assert guard.paused(now=20.0) == [PausedCircuit(SESSION, 295.0, "loop_detected", 1)]
    assert send(guard, B, 20.0).code == "loop_paused"
    assert guard.paused(now=20.0)[0].count == 2

    assert guard.reopen(SESSION, now=30.0)
    assert guard.paused(now=30.0) == []
    reopened = send(guard, A, 31.0)
    assert reopened.allowed
    assert reopened.count == 1
    assert not guard.reopen(SESSION, now=32.0)


def test_issue6_the_same_step_is_the_same_call() -> None:
    guard = CallLoopGuard()
    circuit = circuit_key("billing-bot", "run-1", "page-3")
    fields = {"session": "run-1", "step": "page-3", "model": MODEL}
    for attempt in range(5):
        fingerprint = fp(f"Extract the totals, attempt {attempt}")
        assert guard.check(circuit=circuit, fingerprint=fingerprint, fields=fields, now=1.0).allowed
    sixth = guard.check(circuit=circuit, fingerprint=fp("attempt 9"), fields=fields, now=2.0)
    assert sixth.code == "loop_detected"

    no_step = CallLoopGuard()
    for attempt in range(10):
        fingerprint = fp(f"Extract the totals, attempt {attempt}")
        assert no_step.check(circuit=SESSION, fingerprint=fingerprint, now=1.0).allowed


def test_idle_circuits_are_forgotten_and_the_table_is_capped() -> None:
    guard = CallLoopGuard(max_circuits=1000)
    for i in range(1000):
        send(guard, A, 0.0, circuit=f"bot/session={i}")
    assert len(guard) == 1000
    send(guard, A, 1.0, circuit="bot/session=new")
    assert len(guard) == 1000
    for i in range(300):
        send(guard, B, 100.0 + i * 0.001, circuit="bot/session=live")
    assert len(guard) == 1


def test_the_cap_forgets_the_least_recently_used_call_window() -> None:
    guard = CallLoopGuard(CallLoopPolicy(max_repeats=3), max_circuits=3)
    for circuit in ("c1", "c2", "c3", "c1"):
        send(guard, A, 1.0, circuit=circuit)
    send(guard, A, 2.0, circuit="c4")  # the table is full: c2 goes, not c1 or c3

    assert send(guard, A, 3.0, circuit="c1").count == 3
    assert send(guard, A, 3.0, circuit="c2").count == 1
    assert len(guard) == 3


def test_a_shrunken_table_is_replaced_a_few_entries_per_call() -> None:
    # 4,000 windows go idle, 300 stay live: once the idle ones are swept, the table (down
    # to a quarter of its peak) is replaced while calls go on. No call moves more than a
    # few entries (copying 25,000 at once stalled one call for ~20 ms), no count is lost
    # and the least recently used order survives.
    guard = CallLoopGuard(CallLoopPolicy(max_repeats=1_000_000, window_seconds=60.0))
    for i in range(4_000):
        send(guard, A, 0.0, circuit=f"idle/session={i}")
    live = [f"live/session={i}" for i in range(300)]
    counts = dict.fromkeys(live, 0)
    for circuit in live:
        counts[circuit] = send(guard, A, 30.0, circuit=circuit).count
    recency = list(live)  # least recently used first
    windows = guard._calls
    rng = random.Random(3)
    replaced = False
    at = 60.0
    for _ in range(3_000):
        at += 0.001
        circuit = rng.choice(live)
        before = len(windows.recent)
        decision = send(guard, A, at, circuit=circuit)
        counts[circuit] += 1
        recency.remove(circuit)
        recency.append(circuit)
        assert decision.count == counts[circuit]
        if windows.draining is not None:
            replaced = True
            assert len(windows.recent) <= before + guarding.MOVES_PER_CALL + 1
    assert replaced
    assert windows.draining is None
    assert len(guard) == len(live)
    assert [key[0] for key in windows.recent] == recency


def test_a_pause_after_a_reopen_ends_on_time() -> None:
    guard = CallLoopGuard(CallLoopPolicy(max_repeats=1, window_seconds=60.0, pause_seconds=5.0))
    send(guard, A, 0.0)
    assert send(guard, A, 1.0).code == "loop_detected"
    assert guard.reopen(SESSION, now=2.0)
    send(guard, A, 3.0)
    assert send(guard, A, 4.0).code == "loop_detected"  # paused until 9
    assert send(guard, B, 8.999).code == "loop_paused"
    assert send(guard, B, 9.0).allowed


def test_guard_uses_its_clock() -> None:
    clock = FakeClock()
    guard = CallLoopGuard(CallLoopPolicy(max_repeats=1, pause_seconds=30.0), clock=clock)
    assert guard.check(circuit=SESSION, fingerprint=A).allowed
    assert guard.check(circuit=SESSION, fingerprint=A).code == "loop_detected"
    clock.now += 29.0
    assert guard.check(circuit=SESSION, fingerprint=B).retry_after == pytest.approx(1.0)
    clock.now += 1.0
    assert guard.check(circuit=SESSION, fingerprint=B).allowed


def test_threads_never_admit_more_than_the_limit() -> None:
    guard = CallLoopGuard()
    allowed: list[bool] = []
    lock = threading.Lock()

    def worker() -> None:
        for _ in range(50):
            decision = send(guard, A, 5.0)
            with lock:
                allowed.append(decision.allowed)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert allowed.count(True) == 5


def test_identical_calls_never_exceed_max_repeats_in_any_window() -> None:
    seen = {"examples": 0, "loop_detected": 0, "loop_paused": 0}
    # Bursts (short gaps) trip the guard; long gaps let windows and pauses end.
    gaps = st.floats(min_value=0.0, max_value=1.0) | st.floats(min_value=0.0, max_value=30.0)

    @settings(max_examples=200, deadline=None)
    @given(
        st.lists(gaps, min_size=5, max_size=60),
        st.integers(min_value=1, max_value=6),
        st.floats(min_value=0.5, max_value=50.0),
        st.floats(min_value=0.0, max_value=40.0),
    )
    def prop(gaps: list[float], max_repeats: int, window: float, pause: float) -> None:
        guard = CallLoopGuard(CallLoopPolicy(max_repeats, window, pause))
        now, admitted, paused_until = 0.0, [], -1.0
        for gap in gaps:
            now += gap
            decision = send(guard, A, now)
            if decision.allowed:
                assert now >= paused_until  # nothing passes a running pause
                admitted.append(now)
            elif decision.code == "loop_detected":
                assert now >= paused_until
                paused_until = now + pause
            else:
                assert decision.code == "loop_paused"
                assert now < paused_until
                assert decision.retry_after == pytest.approx(paused_until - now)
            seen[decision.code] = seen.get(decision.code, 0) + 1
        for start in admitted:
            assert sum(start <= t < start + window for t in admitted) <= max_repeats
        seen["examples"] += 1

    prop()
    # Not vacuous: the guard trips and pauses in a good share of the examples.
    assert seen["loop_detected"] >= seen["examples"] // 4, seen
    assert seen["loop_paused"] >= seen["examples"] // 4, seen


def test_policy_from_dict() -> None:
    assert CallLoopPolicy.from_dict(None) == CallLoopPolicy()
    assert CallLoopPolicy.from_dict({}) == CallLoopPolicy(5, 60.0, 300.0)
    policy = CallLoopPolicy.from_dict(
        {"max_repeats": "3", "window_seconds": "2m", "pause_seconds": 10, "extra": 1}
    )
    assert policy == CallLoopPolicy(3, 120.0, 10.0)


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"max_repeats": 0}, "max_repeats"),
        ({"max_repeats": 2.5}, "max_repeats"),
        ({"max_repeats": True}, "max_repeats"),
        ({"window_seconds": 0}, "window_seconds"),
        ({"window_seconds": "soon"}, "window_seconds"),
        ({"pause_seconds": -1}, "pause_seconds"),
        ({"pause_seconds": float("nan")}, "pause_seconds"),
    ],
)
def test_policy_errors_name_the_field(data: Mapping[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        CallLoopPolicy.from_dict(data)


# ---------------------------------------------------------------------------------------
# Uniqueness rules
# ---------------------------------------------------------------------------------------


def rule(**overrides: object) -> UniquenessRule:
    data: dict[str, object] = {
        "name": "once-per-step",
        "fields": ["session", "step"],
        "max_calls": 1,
        "window_seconds": "24h",
    }
    data.update(overrides)
    return UniquenessRule.from_dict(data)


def test_rule_from_dict() -> None:
    parsed = rule(filters={"feature": "inv*"}, action="pause")
    assert parsed.fields == ("session", "step")
    assert parsed.window_seconds == 86_400.0
    assert dict(parsed.filters) == {"feature": "inv*"}
    assert parsed.action == "pause"
    assert rule(window_seconds=1).window_seconds == 1.0
    assert rule(fields="customer").fields == ("customer",)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"fields": ["session", "tenant"]}, "fields"),
        ({"fields": []}, "fields"),
        ({"fields": ["step", "step"]}, "fields"),
        ({"max_calls": 0}, "max_calls"),
        ({"max_calls": "many"}, "max_calls"),
        ({"window_seconds": 0.5}, "window_seconds"),
        ({"window_seconds": 86_401}, "window_seconds"),
        ({"window_seconds": "25h"}, "window_seconds"),
        ({"window_seconds": "a while"}, "window_seconds"),
        ({"filters": {"tenant": "x"}}, "filters"),
        ({"filters": {"feature": ""}}, "filters"),
        ({"filters": ["feature"]}, "filters"),
        ({"action": "block"}, "action"),
        ({"name": ""}, "name"),
        ({"name": None}, "name"),
        ({"max_call": 3}, "max_call"),
    ],
)
def test_rule_errors_name_the_field(overrides: Mapping[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        rule(**overrides)


def test_rule_names_are_unique_in_a_guard() -> None:
    with pytest.raises(ValueError, match="rules"):
        CallLoopGuard(rules=[rule(), rule(max_calls=2)])


def ask(
    guard: CallLoopGuard, at: float, prompt: str = "Process page", **fields: str
) -> CallDecision:
    circuit = circuit_key("billing-bot", fields.get("session"))
    return guard.check(circuit=circuit, fingerprint=fp(prompt), fields=fields, now=at)


def test_issue6_reject_rule_refuses_with_duplicate_call() -> None:
    guard = CallLoopGuard(rules=[rule(window_seconds=60)])
    assert ask(guard, 0.0, "Process page 3", session="s1", step="page-3").allowed
    again = ask(guard, 10.0, "Please process page 3 now", session="s1", step="page-3")
    assert again.code == "duplicate_call"
    assert again.rule == "once-per-step"
    assert again.retry_after == pytest.approx(50.0)
    assert ask(guard, 10.0, session="s1", step="page-4").allowed
    assert ask(guard, 10.0, session="s2", step="page-3").allowed
    # Without a step the rule does not apply; and the window slides.
    assert ask(guard, 11.0, session="s1").allowed
    assert ask(guard, 11.0, session="s1").allowed
    assert ask(guard, 60.0, session="s1", step="page-3").allowed


@pytest.mark.parametrize("limit", [64, 65, 300])
def test_large_limits_slide_like_small_ones(limit: int) -> None:
    # Above 64 the event times of a key are a deque instead of a list.
    window = float(limit)
    guard = CallLoopGuard(
        CallLoopPolicy(max_repeats=limit, window_seconds=window),
        rules=[rule(fields=["session"], max_calls=limit, window_seconds=window)],
    )
    for t in range(limit):
        assert ask(guard, float(t), session="s1").allowed
    refused = ask(guard, limit - 0.5, session="s1")
    assert (refused.code, refused.retry_after) == ("loop_detected", 300.0)
    other = CallLoopGuard(rules=[rule(fields=["session"], max_calls=limit, window_seconds=window)])
    for t in range(limit):
        assert ask(other, float(t), f"call {t}", session="s1").allowed
    duplicate = ask(other, limit - 0.5, "another call", session="s1")
    assert (duplicate.code, duplicate.retry_after) == ("duplicate_call", 0.5)
    # One call a second never exceeds `limit` per `limit` seconds: the oldest leaves.
    for t in range(limit, 3 * limit):
        assert ask(other, float(t), f"call {t}", session="s1").allowed


def test_issue6_trailing_star_filters_match_prefixes() -> None:
    guard = CallLoopGuard(rules=[rule(fields=["session", "feature"], filters={"feature": "inv*"})])
    assert ask(guard, 0.0, session="s1", feature="invoices").allowed
    assert ask(guard, 1.0, session="s1", feature="invoices").code == "duplicate_call"
    assert ask(guard, 1.0, session="s1", feature="billing").allowed
    assert ask(guard, 2.0, session="s1", feature="billing").allowed

    exact = CallLoopGuard(rules=[rule(fields=["session"], filters={"feature": "inv"})])
    assert ask(exact, 0.0, session="s1", feature="invoices").allowed
    assert ask(exact, 1.0, session="s1", feature="invoices").allowed
    assert ask(exact, 2.0, session="s1", feature="inv").allowed
    assert ask(exact, 3.0, session="s1", feature="inv").code == "duplicate_call"
    assert ask(exact, 4.0, session="s1").allowed  # no feature: the filter does not match


def test_issue6_pause_rule_pauses_the_group_even_with_a_different_prompt() -> None:
    same_prompt = rule(
        name="same-prompt-per-customer",
        fields=["customer", "prompt"],
        max_calls=3,
        window_seconds="10m",
        action="pause",
    )
    guard = CallLoopGuard(CallLoopPolicy(pause_seconds=300.0), rules=[same_prompt])
    for i in range(3):
        assert ask(guard, float(i), "Where is my refund?", session=f"s{i}", customer="c1").allowed
    tripped = ask(guard, 3.0, "Where is my refund?", session="s9", customer="c1")
    assert tripped.code == "duplicate_call"
    assert tripped.retry_after == 300.0
    later = ask(guard, 4.0, "Cancel my order", session="s10", customer="c1")
    assert later.code == "loop_paused"
    assert later.rule == "same-prompt-per-customer"
    assert ask(guard, 4.0, "Where is my refund?", customer="c2").allowed

    group = "rule=same-prompt-per-customer/customer=c1"
    assert [p.circuit for p in guard.paused(now=5.0)] == [group]
    assert guard.paused(now=5.0)[0].reason == "rule:same-prompt-per-customer"
    assert guard.reopen(group, now=6.0)
    assert ask(guard, 7.0, "Where is my refund?", customer="c1").allowed


def test_the_prompt_field_falls_back_to_the_fingerprint() -> None:
    guard = CallLoopGuard(rules=[rule(fields=["customer", "prompt"], max_calls=1)])
    assert ask(guard, 0.0, "Check order 12345 at 10:00", customer="c1").allowed
    assert ask(guard, 1.0, "Check order 67890 at 10:05", customer="c1").code == "duplicate_call"
    assert ask(guard, 1.0, "Extract page 2", customer="c1").allowed
    hashed = {"customer": "c1", "prompt": "sha:abc"}
    assert guard.check(circuit="x", fingerprint=A, fields=hashed, now=2.0).allowed
    assert guard.check(circuit="y", fingerprint=B, fields=hashed, now=3.0).code == "duplicate_call"


def test_rule_counts_are_released_on_provider_failure() -> None:
    guard = CallLoopGuard(rules=[rule()])
    first = ask(guard, 0.0, session="s1", step="p1")
    assert guard.record_outcome(first, status=503)
    assert ask(guard, 1.0, session="s1", step="p1").allowed


def test_issue6_preview_counts_the_calls_a_rule_would_have_stopped() -> None:
    calls = [
        LoggedCall(at=float(t), fingerprint=A, fields={"session": s, "step": p})
        for t, s, p in [(0, "s1", "p1"), (5, "s1", "p1"), (9, "s1", "p2"), (70, "s1", "p1")]
        + [(8, "s2", "p1"), (71, "s1", "p1"), (3, "s1", "p1")]
    ]
    assert preview_rule(rule(window_seconds=60), calls) == 3  # t=3, 5 and 71
    assert preview_rule(rule(window_seconds="24h"), calls) == 4
    assert preview_rule(rule(window_seconds=60, filters={"step": "p2"}), calls) == 0

    pausing = rule(fields=["session"], max_calls=2, window_seconds=60, action="pause")
    assert preview_rule(pausing, calls, pause_seconds=30.0) == 2  # t=5 trips, t=9 paused
    assert preview_rule(pausing, calls, pause_seconds=120.0) == 4


def test_preview_rule_is_pure() -> None:
    calls: Sequence[LoggedCall] = [LoggedCall(at=0.0, fingerprint=A, fields={"session": "s"})] * 3
    once = rule(fields=["session"])
    assert preview_rule(once, calls) == preview_rule(once, calls) == 2
