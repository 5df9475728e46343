"""The room budget as one pure step (issue 20): `step_room`, `room_view` and `RoomBudgets`."""

from __future__ import annotations

import bisect
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from guards.bot_loop import BotLoopPolicy
from guards.room_budget import (
    RoomBudgets,
    RoomDecision,
    RoomRecord,
    room_budget_on,
    room_view,
    step_room,
)


def _policy(budget: int = 3, window: float = 10.0, cooldown: float = 30.0) -> BotLoopPolicy:
    return BotLoopPolicy(
        cooldown_seconds=cooldown, room_max_events_per_window=budget, room_window_seconds=window
    )


def _ring(
    policy: BotLoopPolicy, bots: list[str], times: list[float]
) -> tuple[RoomRecord | None, list[RoomDecision]]:
    """One message per time, the bots taking turns; the record after them and the decisions."""
    record = None
    decisions = []
    for n, now in enumerate(times):
        record, decision = step_room(record, policy, now, bot=bots[n % len(bots)], key=f"m{n}")
        decisions.append(decision)
    return record, decisions


def test_issue20_the_defaults_are_20_bot_messages_per_90_s() -> None:
    policy = BotLoopPolicy()
    assert (policy.room_max_events_per_window, policy.room_window_seconds) == (20, 90.0)
    assert room_budget_on(policy)
    assert not room_budget_on(BotLoopPolicy(room_max_events_per_window=0))
    assert not room_budget_on(BotLoopPolicy(enabled=False))


def test_issue20_a_ring_at_3_s_is_cut_at_its_21st_message_naming_every_bot() -> None:
    record, decisions = _ring(BotLoopPolicy(), ["A", "B", "C"], [3.0 * n for n in range(22)])
    assert [d.allowed for d in decisions] == [True] * 20 + [False, False]
    over, during = decisions[20:]
    assert over == RoomDecision(False, "room_budget_exceeded", 90.0, 20, ("A", "B", "C"))
    assert over.until == 60.0 + 90.0
    assert during == RoomDecision(False, "room_cooldown", 87.0, 20, ("A", "B", "C"))
    assert record is not None
    assert room_view(record, 63.0) == (20, 87.0)


def test_issue20_a_message_seen_by_several_receivers_counts_once() -> None:
    policy = _policy(budget=2)
    record, first = step_room(None, policy, 0.0, bot="A", key="m1")
    record, again = step_room(record, policy, 0.5, bot="A", key="m1")
    assert (first, again) == (RoomDecision(True, "ok", 0.0, 1), RoomDecision(True, "ok", 0.0, 1))
    record, second = step_room(record, policy, 1.0, bot="B", key="m2")
    record, over = step_room(record, policy, 2.0, bot="C", key="m3")
    # The message that opened the cooldown was not recorded: its second receiver is
    # refused as the cooldown (one cooldown, one notice).
    record, over_again = step_room(record, policy, 2.0, bot="C", key="m3")
    assert (second.count, over.reason, over_again.reason) == (
        2,
        "room_budget_exceeded",
        "room_cooldown",
    )
    assert over.until == over_again.until == 32.0
    # A message without a key counts at every call.
    record, no_key = step_room(None, policy, 0.0, bot="A", key="")
    record, no_key_again = step_room(record, policy, 0.0, bot="A", key="")
    assert (no_key.count, no_key_again.count) == (1, 2)


def test_issue20_the_cooldown_ends_in_a_fresh_window_and_events_leave_the_window() -> None:
    # A cooldown shorter than the window lasts the window: no window holds two budgets.
    policy = _policy(budget=2, window=10.0, cooldown=5.0)
    record, decisions = _ring(policy, ["A", "B"], [0.0, 1.0, 2.0])
    assert (decisions[-1].reason, decisions[-1].retry_after) == ("room_budget_exceeded", 10.0)
    record, before_end = step_room(record, policy, 11.5, bot="A", key="x")
    assert before_end.reason == "room_cooldown"
    record, at_end = step_room(record, policy, 12.0, bot="A", key="x")
    assert at_end == RoomDecision(True, "ok", 0.0, 1)
    record, decisions = _ring(policy, ["A"], [0.0, 5.0])
    record, later = step_room(record, policy, 10.0, bot="A", key="late")
    assert later == RoomDecision(True, "ok", 0.0, 2)  # the event at 0 s left at exactly 10 s


def test_issue20_a_policy_change_keeps_the_events_and_the_cooldown_end() -> None:
    record, decisions = _ring(_policy(budget=10), ["A", "B", "C"], [0.0, 1.0, 2.0, 3.0])
    record, over = step_room(record, _policy(budget=4, cooldown=20.0), 4.0, bot="A", key="n")
    assert (over.reason, over.count, over.until) == ("room_budget_exceeded", 4, 24.0)
    record, during = step_room(record, _policy(budget=50, cooldown=1.0), 5.0, bot="B", key="o")
    assert (during.reason, during.retry_after) == ("room_cooldown", 19.0)


def test_issue20_a_disabled_room_budget_keeps_no_record() -> None:
    assert step_room(None, _policy(budget=0), 0.0, bot="A", key="m") == (
        None,
        RoomDecision(True, "disabled", 0.0, 0),
    )


def test_issue20_room_budgets_in_memory_forget_idle_rooms_and_reset() -> None:
    rooms = RoomBudgets(clock=lambda: 0.0)
    policy = _policy(budget=1, window=10.0, cooldown=5.0)
    assert rooms.decide("r1", policy, bot="A", key="1", now=0.0).allowed
    assert rooms.decide("r1", policy, bot="B", key="2", now=1.0).reason == "room_budget_exceeded"
    assert rooms.view("r1", now=2.0) == (1, 9.0)
    for n in range(100):  # every other room idle by the time the next one comes
        rooms.decide(f"other{n}", policy, bot="A", key="1", now=100.0 + 20 * n)
    assert len(rooms) <= 3
    assert rooms.reset("other99") == 1
    held = len(rooms)
    assert rooms.reset() == held
    assert len(rooms) == 0
    with pytest.raises(ValueError, match="now must be a finite number"):
        rooms.decide("r1", policy, bot="A", now=math.inf)


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [
        ("room_max_events_per_window", -1, ValueError),
        ("room_max_events_per_window", 2.5, TypeError),
        ("room_max_events_per_window", True, TypeError),
        ("room_window_seconds", 0.0, ValueError),
        ("room_window_seconds", math.inf, ValueError),
        ("room_window_seconds", math.nan, ValueError),
    ],
)
def test_issue20_the_policy_refuses_impossible_room_budgets_naming_the_field(
    field: str, value: object, error: type[Exception]
) -> None:
    with pytest.raises(error, match=field):
        BotLoopPolicy(**{field: value})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("value", "match"),
    [("1e400", "finite"), ("2.5", "whole"), ("nan", "finite"), ("9" * 5000, "finite")],
)
def test_issue20_from_dict_reads_the_room_fields_and_refuses_bad_ones(
    value: str, match: str
) -> None:
    policy = BotLoopPolicy.from_dict({"room_max_events_per_window": "0", "room_window_seconds": 5})
    assert (policy.room_max_events_per_window, policy.room_window_seconds) == (0, 5.0)
    with pytest.raises(ValueError, match=match):
        BotLoopPolicy.from_dict({"room_max_events_per_window": value, "room_window_seconds": value})


@settings(max_examples=200, deadline=None)
@given(
    bots=st.integers(2, 6),
    budget=st.integers(1, 25),
    window=st.sampled_from((10.0, 60.0, 90.0)),
    cooldown=st.sampled_from((0.0, 5.0, 60.0)),
    gaps=st.lists(st.sampled_from((0.0, 0.1, 0.5, 1.0, 3.0, 7.0, 30.0)), max_size=200),
    receivers=st.integers(1, 3),
)
def test_issue20_a_ring_of_n_bots_never_gets_more_than_the_budget_in_any_window(
    *,
    bots: int,
    budget: int,
    window: float,
    cooldown: float,
    gaps: list[float],
    receivers: int,
) -> None:
    policy = _policy(budget=budget, window=window, cooldown=cooldown)
    record = None
    now = 0.0
    admitted: list[float] = []
    for n, gap in enumerate(gaps):
        now += gap
        allowed = []
        for _ in range(receivers):  # each hosted receiver of the message asks
            record, decision = step_room(record, policy, now, bot=f"bot{n % bots}", key=f"m{n}")
            allowed.append(decision.allowed)
        # An admitted message is admitted for every receiver (with a cooldown of 0, one
        # refused by the first may be admitted by the next: the cooldown is already over).
        assert all(allowed) or not allowed[0]
        if any(allowed):
            admitted.append(now)
    for start in admitted:
        inside = bisect.bisect_left(admitted, start + window) - bisect.bisect_left(admitted, start)
        assert inside <= budget
