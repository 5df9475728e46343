"""Tests for guards.call_loop.step: the call-loop decision as one pure step (issue 10)."""

from __future__ import annotations

import pytest

from guards.call_loop import (
    NEVER,
    CallLoopGuard,
    CallLoopPolicy,
    CallRecord,
    CountedCalls,
    Hold,
    UniquenessRule,
    call_event,
    circuit_key,
    fingerprint_call,
    step_call,
    step_reopen,
    uncount,
)

A = fingerprint_call("gpt-4o-mini", [{"role": "user", "content": "Check order 12345"}])
SESSION = circuit_key("billing-bot", "run-1")
POLICY = CallLoopPolicy(max_repeats=2, window_seconds=10.0, pause_seconds=30.0)


def empty() -> CallRecord:
    return CallRecord(None, None, [], [])


def test_issue10_the_step_counts_refuses_and_pauses_on_an_explicit_record() -> None:
    event = call_event(SESSION, A, {}, ())
    record = empty()
    record, first = step_call(record, event, POLICY, 0.0)
    assert (first.code, first.count) == ("ok", 1)
    assert record.calls == CountedCalls([0.0], 10.0)
    record, second = step_call(record, event, POLICY, 1.0)
    assert (second.count, record.calls) == (2, CountedCalls([0.0, 1.0], 11.0))
    before = record.calls
    record, third = step_call(record, event, POLICY, 2.0)
    assert (third.code, third.count, third.paused_group) == ("loop_detected", 3, SESSION)
    assert record.hold == Hold(32.0, NEVER, 32.0, "loop_detected", None, 1)
    assert record.calls is before  # refused: not counted
    held = record.hold
    record, paused = step_call(record, event, POLICY, 3.0)
    assert (paused.code, paused.count, paused.retry_after) == ("loop_paused", 2, 29.0)
    assert record.hold is not held  # a changed hold is a new object: a backend can tell


def test_issue10_an_idle_record_counts_as_none_whatever_the_window_now() -> None:
    # The last call left its 10 s window at 12: forgetting the record changes nothing.
    idle = CallRecord(None, CountedCalls([0.0, 1.0, 2.0], 12.0), [], [])
    wide = CallLoopPolicy(max_repeats=2, window_seconds=60.0)
    record, decision = step_call(idle, call_event(SESSION, A, {}, ()), wide, 12.0)
    assert (decision.code, decision.count) == ("ok", 1)
    assert record.calls == CountedCalls([12.0], 72.0)


def test_issue10_an_expired_hold_counts_as_none() -> None:
    expired = CallRecord(Hold(5.0, NEVER, 5.0, "loop_detected", None, 3), None, [], [])
    record, decision = step_call(expired, call_event(SESSION, A, {}, ()), POLICY, 5.0)
    assert decision.allowed
    assert record.hold is None


def test_issue10_a_pause_rule_names_the_group_it_paused() -> None:
    per_customer = UniquenessRule("per-customer", ("customer", "prompt"), 1, 60.0, action="pause")
    event = call_event(SESSION, A, {"customer": "c1"}, (per_customer,))
    record = CallRecord(None, None, [None], [None])
    record, first = step_call(record, event, POLICY, 0.0)
    assert first.allowed
    assert first.receipt is not None
    assert first.receipt.rule_keys == (("per-customer", ("c1", A)),)
    record, tripped = step_call(record, event, POLICY, 1.0)
    assert (tripped.code, tripped.paused_group) == (
        "duplicate_call",
        "rule=per-customer/customer=c1",
    )
    assert record.group_holds[0] == Hold(31.0, NEVER, 31.0, "rule:per-customer", "per-customer", 1)


def test_issue10_reopen_and_uncount_are_steps_too() -> None:
    hold, lifted = step_reopen(Hold(30.0, NEVER, 30.0, "loop_detected", None, 2), 5.0, 10.0)
    assert lifted
    assert hold == Hold(5.0, 5.0, 15.0, "loop_detected", None, 0)
    assert step_reopen(None, 5.0, 10.0) == (Hold(5.0, 5.0, 15.0, "reopened", None, 0), False)

    calls = CountedCalls([1.0, 2.0, 3.0], 13.0)
    assert uncount(calls, 2.0)
    assert not uncount(calls, 2.0)
    assert calls.times == [1.0, 3.0]
    assert not uncount(None, 1.0)


@pytest.mark.parametrize("window", [5.0, 60.0])
def test_issue10_the_guard_decides_under_the_policy_each_call_carries(window: float) -> None:
    guard = CallLoopGuard()
    for at in (0.0, 1.0, 2.0):
        assert guard.check(circuit=SESSION, fingerprint=A, now=at).allowed
    three = CallLoopPolicy(max_repeats=3, window_seconds=window)
    decision = guard.check(circuit=SESSION, fingerprint=A, now=4.0, policy=three)
    assert decision.code == "loop_detected"  # 0 + 5 > 4: all three still count
    assert decision.paused_group == SESSION
