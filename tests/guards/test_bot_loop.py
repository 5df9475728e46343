"""BotLoopGuard and BotLoopPolicy: the pair budget, cooldown, memory bound and config parsing."""

from __future__ import annotations

import dataclasses
import gc
import math
import random
import sys
import threading
import tracemalloc
from types import FrameType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from guards.bot_loop import BotLoopGuard, BotLoopPolicy, PairDecision, PairSnapshot, pair_key

WINDOW = 60.0
COOLDOWN = 60.0


def _guard(budget: int = 3, window: float = WINDOW, cooldown: float = COOLDOWN) -> BotLoopGuard:
    policy = BotLoopPolicy(
        max_events_per_window=budget, window_seconds=window, cooldown_seconds=cooldown
    )
    return BotLoopGuard(policy)


def _decide(guard: BotLoopGuard, now: float, a: str = "a", b: str = "b") -> PairDecision:
    return guard.decide(self_bot_id=a, sender_bot_id=b, now=now)


# --- BotLoopPolicy -------------------------------------------------------------------


def test_policy_defaults() -> None:
    assert BotLoopPolicy() == BotLoopPolicy(
        enabled=True, max_events_per_window=20, window_seconds=60.0, cooldown_seconds=60.0
    )


@pytest.mark.parametrize("data", [None, {}])
def test_from_dict_empty_gives_defaults(data: dict[str, object] | None) -> None:
    assert BotLoopPolicy.from_dict(data) == BotLoopPolicy()


def test_from_dict_reads_fields_and_ignores_unknown_keys() -> None:
    policy = BotLoopPolicy.from_dict(
        {
            "enabled": True,
            "max_events_per_window": 6,
            "window_seconds": 30,
            "cooldown_seconds": 120.5,
            "max_consecutive_bot_turns": 30,
            "announce_cooldown": False,
        }
    )
    assert policy == BotLoopPolicy(True, 6, 30.0, 120.5)


def test_from_dict_none_value_means_default() -> None:
    assert BotLoopPolicy.from_dict({"window_seconds": None}) == BotLoopPolicy()


@pytest.mark.parametrize("budget", [0, -5, "0", 0.5, "-2.5", 0.999])
def test_budget_below_one_is_clamped(budget: object) -> None:
    assert BotLoopPolicy.from_dict({"max_events_per_window": budget}).max_events_per_window == 1
    assert BotLoopPolicy(max_events_per_window=0).max_events_per_window == 1


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("false", False),
        ("FALSE", False),
        ("0", False),
        ("no", False),
        ("No", False),
        ("off", False),
        (" Off ", False),
        (False, False),
        (0, False),
        ("true", True),
        ("True", True),
        ("1", True),
        ("yes", True),
        ("on", True),
        (True, True),
        (1, True),
    ],
)
def test_enabled_accepts_words(value: object, expected: bool) -> None:
    assert BotLoopPolicy.from_dict({"enabled": value}).enabled is expected


@pytest.mark.parametrize("value", ["maybe", "", 2, 1.5, [True]])
def test_enabled_rejects_other_values(value: object) -> None:
    with pytest.raises(ValueError, match="enabled"):
        BotLoopPolicy.from_dict({"enabled": value})


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("window_seconds", 0),
        ("window_seconds", -1),
        ("window_seconds", "0"),
        ("window_seconds", float("inf")),
        ("window_seconds", float("nan")),
        ("window_seconds", "abc"),
        ("window_seconds", True),
        ("window_seconds", [60]),
        ("cooldown_seconds", -0.5),
        ("cooldown_seconds", "-1"),
        ("cooldown_seconds", "soon"),
        ("cooldown_seconds", False),
        ("cooldown_seconds", float("inf")),
        ("max_events_per_window", "twenty"),
        ("max_events_per_window", True),
        ("max_events_per_window", 2.5),
        ("max_events_per_window", {"n": 1}),
        ("max_events_per_window", 10**400),
        ("window_seconds", 10**400),
        ("cooldown_seconds", "9" * 400),
    ],
)
def test_from_dict_rejects_bad_numbers_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        BotLoopPolicy.from_dict({field: value})


def test_error_message_says_how_to_fix() -> None:
    with pytest.raises(ValueError, match=r"window_seconds must be .* above 0 \(e\.g\. 60\)"):
        BotLoopPolicy.from_dict({"window_seconds": 0})


def test_from_dict_accepts_numeric_strings() -> None:
    policy = BotLoopPolicy.from_dict(
        {"max_events_per_window": " 7 ", "window_seconds": "1.5", "cooldown_seconds": "0"}
    )
    assert policy == BotLoopPolicy(True, 7, 1.5, 0.0)


def test_whole_float_budget_is_accepted() -> None:
    assert BotLoopPolicy.from_dict({"max_events_per_window": 6.0}).max_events_per_window == 6


def test_direct_construction_validates_durations() -> None:
    with pytest.raises(ValueError, match="window_seconds"):
        BotLoopPolicy(window_seconds=0)
    with pytest.raises(ValueError, match="cooldown_seconds"):
        BotLoopPolicy(cooldown_seconds=-1)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("enabled", "false"),
        ("enabled", 0),
        ("max_events_per_window", 2.5),
        ("max_events_per_window", True),
        ("max_events_per_window", "20"),
    ],
)
def test_issue2_direct_construction_refuses_wrong_types(field: str, value: object) -> None:
    # A string "false" would be truthy and a budget of 2.5 would act as 3: both refused.
    with pytest.raises(TypeError, match=field):
        BotLoopPolicy(**{field: value})  # type: ignore[arg-type]


@pytest.mark.parametrize(("field", "value"), [("window_seconds", "60"), ("cooldown_seconds", None)])
def test_issue2_direct_construction_refuses_non_number_durations(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        BotLoopPolicy(**{field: value})  # type: ignore[arg-type]


policies = st.builds(
    BotLoopPolicy,
    enabled=st.booleans(),
    max_events_per_window=st.integers(min_value=1, max_value=10_000),
    window_seconds=st.floats(min_value=1e-3, max_value=1e6),
    cooldown_seconds=st.floats(min_value=0, max_value=1e6),
)


@given(policies)
def test_from_dict_round_trips(policy: BotLoopPolicy) -> None:
    as_dict = dataclasses.asdict(policy)
    assert BotLoopPolicy.from_dict(as_dict) == policy
    assert BotLoopPolicy.from_dict({k: str(v) for k, v in as_dict.items()}) == policy


# --- the pair budget --------------------------------------------------------------------


def test_pair_key_is_sorted() -> None:
    assert pair_key("b", "a") == pair_key("a", "b") == ("a", "b")


def test_budget_then_refusal_opens_cooldown() -> None:
    guard = _guard(budget=3)
    assert [_decide(guard, t) for t in (0.0, 1.0, 2.0)] == [
        PairDecision(True, "ok", 0.0, 1),
        PairDecision(True, "ok", 0.0, 2),
        PairDecision(True, "ok", 0.0, 3),
    ]
    assert _decide(guard, 3.0) == PairDecision(False, "budget_exceeded", COOLDOWN, 3)
    assert _decide(guard, 10.0) == PairDecision(False, "cooldown", COOLDOWN - 7.0, 3)


def test_observe_matches_decide() -> None:
    guard = _guard(budget=2)
    assert guard.observe(self_bot_id="a", sender_bot_id="b", now=0.0)
    assert guard.observe(self_bot_id="a", sender_bot_id="b", now=1.0)
    assert not guard.observe(self_bot_id="a", sender_bot_id="b", now=2.0)
    assert not guard.observe(self_bot_id="a", sender_bot_id="b", now=3.0)


def test_cooldown_is_not_extended_and_ends_on_time() -> None:
    guard = _guard(budget=1, cooldown=10.0)
    assert _decide(guard, 0.0).allowed
    assert _decide(guard, 5.0).reason == "budget_exceeded"
    for t in (6.0, 9.0, 14.999):
        assert _decide(guard, t).reason == "cooldown"
    assert _decide(guard, 15.0) == PairDecision(True, "ok", 0.0, 1)


def test_fresh_window_after_cooldown() -> None:
    guard = _guard(budget=2, window=100.0, cooldown=10.0)
    _decide(guard, 0.0)
    _decide(guard, 1.0)
    assert _decide(guard, 2.0).reason == "budget_exceeded"
    # The two events at 0 and 1 are still inside their window but no longer count.
    assert _decide(guard, 12.0) == PairDecision(True, "ok", 0.0, 1)
    assert _decide(guard, 13.0) == PairDecision(True, "ok", 0.0, 2)
    assert _decide(guard, 14.0).reason == "budget_exceeded"


def test_event_counts_in_half_open_window() -> None:
    guard = _guard(budget=1, window=10.0)
    assert _decide(guard, 0.0).allowed
    assert _decide(guard, 9.999).reason == "budget_exceeded"
    other = _guard(budget=1, window=10.0)
    assert _decide(other, 0.0).allowed
    assert _decide(other, 10.0) == PairDecision(True, "ok", 0.0, 1)


def test_zero_cooldown_refuses_only_the_exceeding_event() -> None:
    guard = _guard(budget=1, cooldown=0.0)
    assert _decide(guard, 0.0).allowed
    assert _decide(guard, 1.0) == PairDecision(False, "budget_exceeded", 0.0, 1)
    assert _decide(guard, 1.0) == PairDecision(True, "ok", 0.0, 1)


@pytest.mark.parametrize("budget", [64, 65, 500])
def test_large_budgets_slide_like_small_ones(budget: int) -> None:
    window = float(budget)
    guard = _guard(budget=budget, window=window)
    assert all(_decide(guard, float(t)).allowed for t in range(budget))
    assert _decide(guard, budget - 0.5).reason == "budget_exceeded"
    # One event a second with a window of `budget` seconds never exceeds the budget.
    other = _guard(budget=budget, window=window)
    for t in range(3 * budget):
        assert _decide(other, float(t)) == PairDecision(True, "ok", 0.0, min(t + 1, budget))


def test_direction_does_not_matter() -> None:
    guard = _guard(budget=2)
    assert _decide(guard, 0.0, "a", "b").allowed
    assert _decide(guard, 1.0, "b", "a").allowed
    assert _decide(guard, 2.0, "a", "b").reason == "budget_exceeded"
    assert _decide(guard, 3.0, "b", "a").reason == "cooldown"


def test_pairs_and_scopes_are_independent() -> None:
    guard = _guard(budget=1)
    assert guard.observe(self_bot_id="a", sender_bot_id="b", now=0.0, scope="room1")
    assert not guard.observe(self_bot_id="a", sender_bot_id="b", now=1.0, scope="room1")
    assert guard.observe(self_bot_id="a", sender_bot_id="b", now=1.0, scope="room2")
    assert guard.observe(self_bot_id="a", sender_bot_id="b", now=1.0)
    assert guard.observe(self_bot_id="a", sender_bot_id="c", now=1.0, scope="room1")
    assert len(guard) == 4


def test_disabled_guard_admits_everything_and_holds_nothing() -> None:
    guard = BotLoopGuard(BotLoopPolicy(enabled=False, max_events_per_window=1))
    assert not guard.enabled
    for t in range(10):
        assert guard.observe(self_bot_id="a", sender_bot_id="b", now=float(t))
    assert _decide(guard, 11.0) == PairDecision(True, "disabled", 0.0, 0)
    assert len(guard) == 0


def test_default_policy_and_properties() -> None:
    guard = BotLoopGuard()
    assert guard.enabled
    assert guard.policy == BotLoopPolicy()
    assert all(guard.observe(self_bot_id="a", sender_bot_id="b", now=0.0) for _ in range(20))
    assert not guard.observe(self_bot_id="a", sender_bot_id="b", now=0.0)


def test_injected_clock_is_used_when_now_is_omitted() -> None:
    now = [0.0]
    guard = BotLoopGuard(BotLoopPolicy(max_events_per_window=1), clock=lambda: now[0])
    assert guard.observe(self_bot_id="a", sender_bot_id="b")
    now[0] = 30.0
    assert guard.decide(self_bot_id="a", sender_bot_id="b").reason == "budget_exceeded"
    now[0] = 89.0
    assert guard.decide(self_bot_id="a", sender_bot_id="b").retry_after == pytest.approx(1.0)
    assert guard.snapshot()[0].cooldown_remaining == pytest.approx(1.0)
    now[0] = 90.0
    assert guard.observe(self_bot_id="a", sender_bot_id="b")


def test_max_pairs_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_pairs"):
        BotLoopGuard(max_pairs=0)


# --- reset and snapshot -------------------------------------------------------------------


def _filled_guard() -> BotLoopGuard:
    guard = _guard(budget=5)
    for scope in ("r1", "r2"):
        for a, b in (("x", "y"), ("x", "z"), ("y", "z")):
            guard.observe(self_bot_id=a, sender_bot_id=b, now=0.0, scope=scope)
    return guard


def _pairs(guard: BotLoopGuard) -> set[tuple[str | None, str, str]]:
    return {(s.scope, s.bot_a, s.bot_b) for s in guard.snapshot(now=1.0)}


def test_reset_all() -> None:
    guard = _filled_guard()
    guard.reset()
    assert len(guard) == 0
    assert guard.snapshot(now=1.0) == []


def test_reset_scope() -> None:
    guard = _filled_guard()
    guard.reset(scope="r1")
    assert _pairs(guard) == {("r2", "x", "y"), ("r2", "x", "z"), ("r2", "y", "z")}


def test_reset_bot() -> None:
    guard = _filled_guard()
    guard.reset(bot_id="x")
    assert _pairs(guard) == {("r1", "y", "z"), ("r2", "y", "z")}


def test_reset_bot_in_scope() -> None:
    guard = _filled_guard()
    guard.reset(scope="r2", bot_id="z")
    assert len(guard) == 4
    assert _pairs(guard) == {("r1", "x", "y"), ("r1", "x", "z"), ("r1", "y", "z"), ("r2", "x", "y")}


def test_reset_lets_a_cooling_pair_talk_again() -> None:
    guard = _guard(budget=1)
    _decide(guard, 0.0)
    assert not _decide(guard, 1.0).allowed
    guard.reset(bot_id="b")
    assert _decide(guard, 2.0).allowed


def test_snapshot_lists_live_pairs_with_counts_and_cooldown() -> None:
    guard = _guard(budget=2, window=10.0, cooldown=30.0)
    for t in (0.0, 1.0, 2.0):
        guard.observe(self_bot_id="b", sender_bot_id="a", now=t, scope="room")
    guard.observe(self_bot_id="c", sender_bot_id="d", now=5.0, scope="other")
    assert guard.snapshot(now=6.0) == [
        PairSnapshot("room", "a", "b", 2, 26.0),
        PairSnapshot("other", "c", "d", 1, 0.0),
    ]
    assert guard.snapshot("other", now=6.0) == [PairSnapshot("other", "c", "d", 1, 0.0)]
    # At 16 the events have left the window and the other pair is idle; the cooldown runs on.
    assert guard.snapshot(now=16.0) == [PairSnapshot("room", "a", "b", 0, 16.0)]
    assert guard.snapshot(now=32.0) == []


# --- memory -----------------------------------------------------------------------------


def test_idle_pairs_are_forgotten_as_traffic_goes_on() -> None:
    guard = _guard(budget=10_000, window=10.0, cooldown=5.0)
    for i in range(1000):
        guard.observe(self_bot_id=f"a{i}", sender_bot_id="b", now=i / 1000)
    assert len(guard) == 1000
    # Still inside their window at 10.5 (the last one is live until 10.999): kept.
    guard.observe(self_bot_id="live", sender_bot_id="b", now=10.5)
    assert len(guard) > 400
    # Once every one is idle, each call frees two: 500 calls free the 1000.
    for n in range(500):
        guard.observe(self_bot_id="live", sender_bot_id="b", now=11.0 + n / 1000)
    assert len(guard) == 1


def test_pair_in_long_cooldown_is_kept() -> None:
    guard = _guard(budget=1, window=1.0, cooldown=100.0)
    _decide(guard, 0.0)
    _decide(guard, 0.5)
    for t in range(1, 90):
        guard.observe(self_bot_id="x", sender_bot_id="y", now=float(t))
    assert _decide(guard, 90.0).reason == "cooldown"


def test_max_pairs_caps_the_table_and_keeps_recent_pairs() -> None:
    guard = BotLoopGuard(BotLoopPolicy(max_events_per_window=1), max_pairs=100)
    for i in range(1000):
        guard.observe(self_bot_id="hot", sender_bot_id="peer", now=float(i))
        guard.observe(self_bot_id=f"n{i}", sender_bot_id="peer", now=float(i))
        assert len(guard) <= 100
    # The hot pair, touched on every step, survived the flood with its cooldown intact.
    assert _decide(guard, 1000.0, "hot", "peer").reason == "cooldown"


def _held(guard: BotLoopGuard) -> list[str]:
    """The bots paired with "peer", least recently used first."""
    return [snap.bot_a for snap in guard.snapshot(now=0.0)]


def test_issue2_max_pairs_displaces_the_least_recently_used_pair() -> None:
    guard = BotLoopGuard(max_pairs=3)
    for bot in ("a", "b", "c", "a"):
        guard.observe(self_bot_id=bot, sender_bot_id="peer", now=0.0)
    assert _held(guard) == ["b", "c", "a"]
    guard.observe(self_bot_id="d", sender_bot_id="peer", now=0.0)
    assert _held(guard) == ["c", "a", "d"]  # b, the least recently used, went
    guard.observe(self_bot_id="c", sender_bot_id="peer", now=0.0)
    guard.observe(self_bot_id="e", sender_bot_id="peer", now=0.0)
    assert _held(guard) == ["d", "c", "e"]  # then a, not the newest pair


def test_issue2_a_refused_event_keeps_its_pair_in_use() -> None:
    guard = BotLoopGuard(BotLoopPolicy(max_events_per_window=1), max_pairs=2)
    _decide(guard, 0.0, "loop", "peer")
    assert _decide(guard, 1.0, "loop", "peer").reason == "budget_exceeded"
    _decide(guard, 2.0, "x", "peer")
    assert _decide(guard, 3.0, "loop", "peer").reason == "cooldown"
    _decide(guard, 4.0, "y", "peer")  # displaces x, not the pair still trying
    assert _decide(guard, 5.0, "loop", "peer").reason == "cooldown"


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 4), st.lists(st.sampled_from("abcdef"), max_size=40))
def test_issue2_max_pairs_keeps_exactly_the_most_recently_used_pairs(
    cap: int, bots: list[str]
) -> None:
    guard = BotLoopGuard(max_pairs=cap)
    recent: list[str] = []
    for bot in bots:
        guard.observe(self_bot_id=bot, sender_bot_id="peer", now=0.0)
        recent = [*(b for b in recent if b != bot), bot][-cap:]
        assert _held(guard) == recent


def test_issue2_lru_order_holds_while_a_shrunk_table_is_replaced() -> None:
    guard = BotLoopGuard(BotLoopPolicy(window_seconds=10.0))
    for i in range(1_500):
        guard.observe(self_bot_id=f"idle{i}", sender_bot_id="peer", now=0.0)
    recency: list[str] = []  # the live bots, least recently used first

    def touch(bot: str, at: float) -> None:
        guard.observe(self_bot_id=bot, sender_bot_id="peer", now=at)
        recency[:] = [*(b for b in recency if b != bot), bot]

    for j in range(100):
        touch(f"live{j}", 5.0)
    rng = random.Random(2)
    replaced = False
    # The idle pairs expire at 10 and are freed; the table, down to a quarter of its
    # peak, is replaced while the live pairs keep being used and new ones come.
    for n in range(1_000):
        at = 10.0 + n * 1e-3
        touch(f"live{rng.randrange(130 + n // 10)}", at)
        replaced = replaced or guard._pairs.draining is not None
        assert [snap.bot_a for snap in guard.snapshot(now=at)] == recency
        assert len(guard) >= len(recency)
        if guard._pairs.draining is not None:
            # Idle pairs are dropped, not moved over to the new table.
            assert len(guard._pairs.recent) <= len(recency)
    assert replaced
    assert guard._pairs.draining is None
    assert len(guard) == len(recency)


def test_memory_is_given_back_after_many_idle_pairs() -> None:
    # The cap is far above the pair count: it is the sweep that must give memory back.
    guard = BotLoopGuard(BotLoopPolicy(), max_pairs=1_000_000)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for i in range(50_000):
            guard.observe(self_bot_id=f"bot{i}", sender_bot_id="peer", now=i * 1e-4)
        grown = tracemalloc.get_traced_memory()[0] - base
        # Two freed per call: 25,000 calls free them all (the table is rebuilt on the way).
        t = 200.0
        for _ in range(25_001):
            guard.observe(self_bot_id="live", sender_bot_id="peer", now=t)
            t += 1.0
        left = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert len(guard) == 1
    assert grown > 10_000_000
    # The pairs and the table's own arrays (several MB at its peak) are given back.
    assert left < 500_000


# --- properties ---------------------------------------------------------------------------


Key = tuple[str | None, str, str]


class _ReferenceGuard:
    """The rules of DESIGN.md written as plainly as possible, one pair at a time."""

    def __init__(self, policy: BotLoopPolicy) -> None:
        self.policy = policy
        self.times: dict[Key, list[float]] = {}
        self.cooldown_until: dict[Key, float] = {}

    def decide(self, key: Key, now: float) -> PairDecision:
        window = self.policy.window_seconds
        until = self.cooldown_until.get(key)
        if until is not None:
            if now < until:
                live = sum(t + window > now for t in self.times[key])
                return PairDecision(False, "cooldown", until - now, live)
            del self.cooldown_until[key]
            self.times[key] = []
        kept = [t for t in self.times.get(key, []) if t + window > now]
        self.times[key] = kept
        if len(kept) < self.policy.max_events_per_window:
            kept.append(now)
            return PairDecision(True, "ok", 0.0, len(kept))
        self.cooldown_until[key] = now + self.policy.cooldown_seconds
        return PairDecision(False, "budget_exceeded", self.policy.cooldown_seconds, len(kept))

    def reset(self, scope: str | None, bot: str | None) -> None:
        for key in list(self.times):
            if (scope is None or key[0] == scope) and (bot is None or bot in key[1:]):
                del self.times[key]
                self.cooldown_until.pop(key, None)

    def snapshot(self, now: float) -> set[PairSnapshot]:
        window = self.policy.window_seconds
        live = set()
        for key, times in self.times.items():
            until = self.cooldown_until.get(key)
            if until is not None and now >= until:
                continue  # a finished cooldown: a fresh (empty) window
            count = sum(t + window > now for t in times)
            if until is None and count == 0:
                continue
            left = 0.0 if until is None else until - now
            live.add(PairSnapshot(key[0], key[1], key[2], count, left))
        return live


# Mostly bursts on a few pairs (to fill windows and open cooldowns), some long gaps (to
# let windows and cooldowns end), and now and then a reset (the last item below 3).
gaps = st.sampled_from([0.0, 0.01, 0.1]) | st.floats(min_value=0, max_value=0.5)
model_steps = st.lists(
    st.tuples(
        gaps | st.floats(min_value=0, max_value=20),
        st.sampled_from([("a", "b"), ("b", "a"), ("a", "c"), ("c", "a")]),
        st.sampled_from([None, None, "room"]),
        st.integers(min_value=0, max_value=24),
    ),
    min_size=20,
    max_size=80,
)
small_policies = st.builds(
    BotLoopPolicy,
    # 65 takes the deque path for event times, the others the list path.
    max_events_per_window=st.sampled_from([1, 2, 3, 5, 65]),
    window_seconds=st.sampled_from([0.5, 1.0, 7.5, 30.0]),
    cooldown_seconds=st.sampled_from([0.0, 0.5, 3.0, 50.0]),
)


def test_guard_matches_the_reference_model() -> None:
    seen = {"examples": 0, "budget_exceeded": 0, "cooldown": 0, "reset": 0}

    @settings(max_examples=200, deadline=None)
    @given(small_policies, model_steps)
    def prop(
        policy: BotLoopPolicy, steps: list[tuple[float, tuple[str, str], str | None, int]]
    ) -> None:
        guard = BotLoopGuard(policy)
        reference = _ReferenceGuard(policy)
        now = 0.0
        for dt, (a, b), scope, roll in steps:
            if roll < 3:
                # reset(scope) (all of them when scope is None), reset(bot_id), or both.
                reset_scope, reset_bot = ((scope, None), (None, b), (scope, b))[roll]
                guard.reset(scope=reset_scope, bot_id=reset_bot)
                reference.reset(reset_scope, reset_bot)
                seen["reset"] += 1
                continue
            now += dt
            expected = reference.decide((scope, *pair_key(a, b)), now)
            got = guard.decide(self_bot_id=a, sender_bot_id=b, now=now, scope=scope)
            assert got == expected
            seen[got.reason] = seen.get(got.reason, 0) + 1
        assert set(guard.snapshot(now=now)) == reference.snapshot(now)
        assert len(guard) <= len(reference.times)
        seen["examples"] += 1

    prop()
    # Not vacuous: refusals of both kinds and resets happen all along.
    for what in ("budget_exceeded", "cooldown", "reset"):
        assert seen[what] >= seen["examples"] // 8, (what, seen)


def test_budget_holds_in_every_window_and_nothing_passes_a_cooldown() -> None:
    seen = {"examples": 0, "cooldowns": 0, "refused_in_cooldown": 0}

    # Bursts (short gaps) fill windows and open cooldowns; long gaps let them end.
    gaps = st.floats(min_value=0, max_value=0.5) | st.floats(min_value=0, max_value=10)

    @settings(max_examples=300, deadline=None)
    @given(small_policies, st.lists(st.tuples(gaps, st.booleans()), min_size=10, max_size=300))
    def prop(policy: BotLoopPolicy, steps: list[tuple[float, bool]]) -> None:
        guard = BotLoopGuard(policy)
        admitted: list[tuple[int, float]] = []  # (cooldowns before it, time)
        cooldown_ends: list[float] = []
        cooldown_until = -1.0
        now = 0.0
        for dt, forward in steps:
            now += dt
            a, b = ("x", "y") if forward else ("y", "x")
            decision = guard.decide(self_bot_id=a, sender_bot_id=b, now=now)
            if decision.allowed:
                assert now >= cooldown_until  # nothing is admitted during a cooldown
                admitted.append((len(cooldown_ends), now))
            elif decision.reason == "budget_exceeded":
                assert now >= cooldown_until
                assert decision.retry_after == policy.cooldown_seconds
                cooldown_until = now + policy.cooldown_seconds
                cooldown_ends.append(cooldown_until)
            else:
                assert decision.reason == "cooldown"
                assert now < cooldown_until
                assert decision.retry_after == cooldown_until - now
                seen["refused_in_cooldown"] += 1
        # Any window [s, s + window) with no cooldown end in it holds at most the budget
        # (the windows that start at an admitted event are the fullest ones); so does any
        # window counted within one fresh window's events (between two cooldowns).
        for epoch, start in admitted:
            end = start + policy.window_seconds
            same_epoch = sum(start <= t < end for e, t in admitted if e == epoch)
            assert same_epoch <= policy.max_events_per_window
            if not any(start <= until < end for until in cooldown_ends):
                assert sum(start <= t < end for _, t in admitted) <= policy.max_events_per_window
        seen["examples"] += 1
        seen["cooldowns"] += bool(cooldown_ends)

    prop()
    # Not vacuous: a good share of the examples open a cooldown and refuse events in one.
    assert seen["cooldowns"] >= seen["examples"] // 4
    assert seen["refused_in_cooldown"] >= seen["examples"] // 4


@settings(max_examples=100, deadline=None)
@given(small_policies, st.lists(st.tuples(st.floats(0, 5), st.booleans()), max_size=100))
def test_both_directions_share_one_budget(
    policy: BotLoopPolicy, steps: list[tuple[float, bool]]
) -> None:
    mixed, one_way = BotLoopGuard(policy), BotLoopGuard(policy)
    now = 0.0
    for dt, forward in steps:
        now += dt
        a, b = ("x", "y") if forward else ("y", "x")
        assert mixed.decide(self_bot_id=a, sender_bot_id=b, now=now) == one_way.decide(
            self_bot_id="x", sender_bot_id="y", now=now
        )


@settings(max_examples=100, deadline=None)
@given(
    small_policies,
    st.lists(st.tuples(st.floats(0, 5), st.integers(1, 3)), min_size=1, max_size=300),
    st.integers(1, 3),
)
def test_table_shrinks_back_to_the_live_pairs(
    policy: BotLoopPolicy, idle: list[tuple[float, int]], live: int
) -> None:
    guard = BotLoopGuard(policy)
    # Each pair gets one to three events at once: with a small budget, some cool down.
    for n, (at, events) in enumerate(sorted(idle)):
        for _ in range(events):
            guard.observe(self_bot_id=f"idle{n}", sender_bot_id="x", now=at)
    # Every idle pair is idle by `quiet`; then about one call per two idle pairs.
    quiet = 5.0 + policy.window_seconds + policy.cooldown_seconds
    for step in range(len(idle) // 2 + 2):
        for bot in range(live):
            guard.observe(self_bot_id=f"live{bot}", sender_bot_id="x", now=quiet + step * 1e-3)
    assert len(guard) == live
    assert len(guard.snapshot(now=quiet)) == live


def test_many_threads_on_one_pair_admit_exactly_the_budget() -> None:
    guard = BotLoopGuard(BotLoopPolicy(max_events_per_window=500), clock=lambda: 0.0)
    admitted: list[int] = []
    start = threading.Barrier(8)

    def worker() -> None:
        start.wait()
        ok = 0
        for i in range(1000):
            a, b = ("a", "b") if i % 2 else ("b", "a")
            ok += guard.observe(self_bot_id=a, sender_bot_id=b)
        admitted.append(ok)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(admitted) == 500
    assert guard.decide(self_bot_id="a", sender_bot_id="b").reason == "cooldown"


# --- issue 10: one guard for every policy, and pairs that come and go -------------------------


def test_issue10_policy_change_keeps_the_pair_in_one_guard() -> None:
    guard = BotLoopGuard()
    ten = BotLoopPolicy(max_events_per_window=10, cooldown_seconds=20.0)
    six = BotLoopPolicy(max_events_per_window=6, cooldown_seconds=20.0)
    for t in range(5):
        assert guard.decide(self_bot_id="a", sender_bot_id="b", now=float(t), policy=ten).allowed
    got = [
        guard.decide(self_bot_id="b", sender_bot_id="a", now=t, scope=None, policy=six)
        for t in (5.0, 6.0, 7.0)
    ]
    assert got == [
        PairDecision(True, "ok", 0.0, 6),
        PairDecision(False, "budget_exceeded", 20.0, 6),
        PairDecision(False, "cooldown", 19.0, 6),
    ]
    # One pair, listed once, whatever policies it has seen.
    assert guard.snapshot(now=7.0) == [PairSnapshot(None, "a", "b", 6, 19.0)]
    assert len(guard) == 1


def test_issue10_observe_takes_the_policy_per_call_too() -> None:
    guard = BotLoopGuard(BotLoopPolicy(max_events_per_window=1))
    loose = BotLoopPolicy(max_events_per_window=3)
    assert all(
        guard.observe(self_bot_id="a", sender_bot_id="b", now=float(t), policy=loose)
        for t in range(3)
    )
    assert not guard.observe(self_bot_id="a", sender_bot_id="b", now=3.0, policy=loose)
    off = BotLoopPolicy(enabled=False)
    assert guard.observe(self_bot_id="a", sender_bot_id="b", now=4.0, policy=off)
    assert guard.decide(self_bot_id="a", sender_bot_id="b", now=4.0, policy=off).reason == (
        "disabled"
    )
    # The guard's own policy still applies to calls that bring none: the cooldown runs.
    assert _decide(guard, 5.0).reason == "cooldown"


def test_issue10_a_disabled_guard_enforces_a_policy_given_per_call() -> None:
    guard = BotLoopGuard(BotLoopPolicy(enabled=False))
    strict = BotLoopPolicy(max_events_per_window=1)
    assert guard.decide(self_bot_id="a", sender_bot_id="b", now=0.0, policy=strict).allowed
    assert not guard.decide(self_bot_id="a", sender_bot_id="b", now=1.0, policy=strict).allowed
    assert not guard.enabled


def test_issue10_churning_pairs_are_forgotten_and_decided_afresh() -> None:
    # Each of 500 pairs speaks every 120 s: idle (60 s window) and forgotten in between.
    guard = BotLoopGuard(BotLoopPolicy(max_events_per_window=1))
    pairs, period = 500, 120.0
    for i in range(pairs * 6):
        decision = _decide(guard, i * period / pairs, f"bot{i % pairs}", "peer")
        assert decision == PairDecision(True, "ok", 0.0, 1)
        # Only the pairs that spoke within the last window (60 s: half of them) are held.
        assert len(guard) <= pairs // 2 + 2


def test_issue10_a_new_pair_reuses_the_record_just_freed() -> None:
    guard = BotLoopGuard(BotLoopPolicy(window_seconds=10.0))
    _decide(guard, 0.0, "old", "peer")
    (freed,) = [record for _, record in guard._pairs.items()]
    _decide(guard, 20.0, "new", "peer")
    ((key, record),) = list(guard._pairs.items())
    assert key == (None, "new", "peer")
    assert record is freed
    assert list(record.times) == [20.0]


def test_issue10_time_going_back_never_hands_a_live_record_to_another_pair() -> None:
    guard = BotLoopGuard(BotLoopPolicy(max_events_per_window=1, window_seconds=10.0))
    _decide(guard, 0.0, "x", "peer")
    _decide(guard, 20.0, "y", "peer")  # x is freed here
    # An earlier injected time: y's events would count at 15, but z is a new pair.
    assert _decide(guard, 15.0, "z", "peer") == PairDecision(True, "ok", 0.0, 1)
    assert _decide(guard, 15.5, "y", "peer").reason == "budget_exceeded"


# --- issue 10: observe's common cases done inline, and the clock readings it accepts ---------


def _python_calls(guard: BotLoopGuard, bot: str, now: float) -> list[str]:
    """The Python functions one `observe` runs (C calls such as dict methods not counted)."""
    calls: list[str] = []

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event == "call":
            calls.append(frame.f_code.co_name)

    # No collection inside: another test's `gc.callbacks` would show among the calls.
    collecting = gc.isenabled()
    gc.disable()
    sys.setprofile(profile)
    try:
        guard.observe(self_bot_id=bot, sender_bot_id="peer", now=now)
    finally:
        sys.setprofile(None)
        if collecting:
            gc.enable()
    return calls


def test_issue10_observe_runs_hot_and_churning_pairs_with_one_call_for_the_rules() -> None:
    # The benchmark's two workloads, small: every call is the rules and nothing else
    # (no table method, no tuple-returning wrapper), but for a sweep at most once a
    # sixteenth of the window (issue 24): that is what brought churn under
    # praisonaiagents' figure.
    pairs = 200
    policy = BotLoopPolicy()
    for period in (10.0, 120.0):  # hot pairs, then pairs idle (and forgotten) between events
        guard = BotLoopGuard(policy)
        step = period / pairs
        for i in range(3 * pairs):  # past the first window: the steady state
            guard.observe(self_bot_id=f"bot{i % pairs}", sender_bot_id="peer", now=i * step)
        runs = [
            _python_calls(guard, f"bot{i % pairs}", i * step) for i in range(3 * pairs, 4 * pairs)
        ]
        sweeps = [run for run in runs if run != ["observe", "_step"]]
        assert all(run[:3] == ["observe", "_decide", "_sweep"] for run in sweeps), sweeps
        gap = policy.window_seconds / 16
        assert len(sweeps) <= pairs * step / gap + 1


def test_issue10_a_new_pair_through_observe_takes_over_the_record_just_gone_idle() -> None:
    guard = BotLoopGuard(BotLoopPolicy(window_seconds=10.0))
    guard.observe(self_bot_id="old", sender_bot_id="peer", now=0.0)
    guard.observe(self_bot_id="live", sender_bot_id="peer", now=5.0)
    (old, _) = [record for _, record in guard._pairs.items()]
    assert guard.observe(self_bot_id="new", sender_bot_id="peer", now=10.0)
    assert [key for key, _ in guard._pairs.items()] == [
        (None, "live", "peer"),
        (None, "new", "peer"),
    ]
    assert guard._pairs.peek((None, "new", "peer")) is old
    assert list(old.times) == [10.0]
    # Time going back: the live pair's record is never handed to another new pair.
    assert guard.observe(self_bot_id="other", sender_bot_id="peer", now=9.0)
    assert len(guard) == 3
    assert guard.decide(self_bot_id="live", sender_bot_id="peer", now=9.0).count == 2


def test_issue10_new_pairs_during_a_backlog_still_free_two_idle_pairs_per_call() -> None:
    guard = _guard(budget=10_000, window=10.0)
    for i in range(1000):
        guard.observe(self_bot_id=f"idle{i}", sender_bot_id="peer", now=i / 1000)
    # All idle at 20: each new pair frees two of them (one it takes over), not just one.
    for n in range(501):
        guard.observe(self_bot_id=f"new{n}", sender_bot_id="peer", now=20.0 + n / 1000)
    assert len(guard) == 501
    assert all(key[1].startswith("new") for key, _ in guard._pairs.items())


def test_issue10_observe_and_decide_keep_the_same_pairs_as_the_reference() -> None:
    seen = {"examples": 0, "taken_over": 0}
    bots = st.sampled_from([f"bot{i}" for i in range(12)])

    @settings(max_examples=150, deadline=None)
    @given(
        small_policies,
        st.lists(st.tuples(gaps | st.floats(min_value=0, max_value=40), bots), max_size=150),
    )
    def prop(policy: BotLoopPolicy, steps: list[tuple[float, str]]) -> None:
        observed, decided = BotLoopGuard(policy), BotLoopGuard(policy)
        reference = _ReferenceGuard(policy)
        now = 0.0
        for dt, bot in steps:
            now += dt
            held = {id(record): key for key, record in observed._pairs.items()}
            expected = reference.decide((None, *pair_key(bot, "peer")), now)
            assert observed.observe(self_bot_id=bot, sender_bot_id="peer", now=now) is (
                expected.allowed
            )
            assert decided.decide(self_bot_id=bot, sender_bot_id="peer", now=now) == expected
            assert observed.snapshot(now=now) == decided.snapshot(now=now)
            assert [key for key, _ in observed._pairs.items()] == [
                key for key, _ in decided._pairs.items()
            ]
            key = (None, *pair_key(bot, "peer"))
            taken = held.get(id(observed._pairs.peek(key)))
            seen["taken_over"] += taken is not None and taken != key
        assert set(observed.snapshot(now=now)) == reference.snapshot(now)
        seen["examples"] += 1

    prop()
    # Not vacuous: new pairs often take over the record of one that went idle.
    assert seen["taken_over"] >= seen["examples"] // 4, seen


@pytest.mark.parametrize(
    "now",
    [math.nan, math.inf, -math.inf, 1e308, -1e15, 1e15, 10**5000],
    ids=["nan", "inf", "-inf", "1e308", "-1e15", "1e15", "5000-digit int"],
)
def test_issue10_a_now_that_is_no_clock_reading_is_refused_and_changes_nothing(
    now: float,
) -> None:
    guard = _guard(budget=1)
    assert _decide(guard, 0.0).allowed
    for call in (guard.observe, guard.decide):
        with pytest.raises(ValueError, match="now must be a finite number of seconds"):
            call(self_bot_id="a", sender_bot_id="b", now=now)
        with pytest.raises(ValueError, match="now must be a finite number of seconds"):
            call(self_bot_id="new", sender_bot_id="b", now=now)
    # The pair kept its event and the next call is served: the budget is spent.
    assert _decide(guard, 1.0) == PairDecision(False, "budget_exceeded", COOLDOWN, 1)
    assert len(guard) == 1


# --- issue 24: the random-gap churn the bench measures ------------------------------------


def test_issue24_random_gap_churn_is_the_measured_workload_and_decides_as_the_reference() -> None:
    from bench.bot_loop_bench import ID_LENGTH, random_gap_events

    pairs, events = 500, 20_000
    span = 120.0 * events / pairs  # a pair's events two minutes apart on average
    workload = random_gap_events(events, pairs, span)
    assert {len(a) for a, _, _ in workload} | {len(b) for _, b, _ in workload} == {ID_LENGTH}
    times = [at for _, _, at in workload]
    assert times == sorted(times)
    last: dict[tuple[str, str], float] = {}
    gaps = []
    for a, b, at in workload:
        if (a, b) in last:
            gaps.append(at - last[a, b])
        last[a, b] = at
    assert 100.0 < sum(gaps) / len(gaps) < 140.0
    # Random gaps around the 60 s window: pairs go idle, are forgotten and come back, and
    # some bursts exceed a budget of 2; every decision is the reference model's.
    policy = BotLoopPolicy(max_events_per_window=2, window_seconds=60.0, cooldown_seconds=60.0)
    guard = BotLoopGuard(policy)
    reference = _ReferenceGuard(policy)
    reasons = set()
    for a, b, at in workload:
        got = guard.decide(self_bot_id=a, sender_bot_id=b, now=at)
        assert got == reference.decide((None, *pair_key(a, b)), at)
        reasons.add(got.reason)
    assert reasons == {"ok", "budget_exceeded", "cooldown"}
    # The table holds about the live pairs, not every pair ever seen.
    assert len(guard) < pairs * 0.6


def test_issue24_random_gap_churn_through_observe_builds_few_records(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Pairs drawn at random go idle between most of their events: each such event frees a
    # record or needs one. Freed records are taken over or kept spare, so the guard builds
    # about as many records as the table ever held, not one per pair coming back (about
    # 5 times that before).
    from bench.bot_loop_bench import random_gap_events
    from guards import bot_loop

    built = {"observe": 0, "decide": 0}
    counting = "observe"
    idle_record = bot_loop._idle_record

    def counted() -> bot_loop.PairRecord:
        built[counting] += 1
        return idle_record()

    monkeypatch.setattr(bot_loop, "_idle_record", counted)
    pairs, events = 2_000, 30_000
    workload = random_gap_events(events, pairs, 120.0 * events / pairs)
    observed, decided = BotLoopGuard(), BotLoopGuard()
    reference = _ReferenceGuard(BotLoopPolicy())
    for n, (a, b, at) in enumerate(workload):
        expected = reference.decide((None, *pair_key(a, b)), at)
        counting = "observe"
        assert observed.observe(self_bot_id=a, sender_bot_id=b, now=at) is expected.allowed
        counting = "decide"
        assert decided.decide(self_bot_id=a, sender_bot_id=b, now=at) == expected
        if n % 1_000 == 0:  # observe's inline sweep keeps what the sweep keeps
            assert [key for key, _ in observed._pairs.items()] == [
                key for key, _ in decided._pairs.items()
            ]
    peak = observed._pairs.peak
    assert built["observe"] <= peak + peak // 4, (built, peak)


def test_issue24_an_idle_pair_is_forgotten_within_a_sixteenth_of_the_window() -> None:
    # Idle pairs are freed by a sweep at most every sixteenth of the window (or taken
    # over by a new pair): with only a live pair's traffic going on, an idle one is gone
    # within that long of going idle, and not before it is idle.
    for via in ("observe", "decide"):
        guard = _guard(budget=10_000, window=16.0)
        guard.observe(self_bot_id="quiet", sender_bot_id="peer", now=0.0)
        at = 0.0
        while at < 17.1:
            at = round(at + 0.1, 1)
            if via == "observe":
                guard.observe(self_bot_id="busy", sender_bot_id="peer", now=at)
            else:
                _decide(guard, at, "busy", "peer")
            if at < 16.0:
                assert len(guard) == 2, at  # the quiet pair is live until 16
        assert len(guard) == 1, via
        assert guard.decide(self_bot_id="quiet", sender_bot_id="peer", now=at).count == 1
