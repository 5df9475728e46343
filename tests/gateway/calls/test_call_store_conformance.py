"""One conformance suite for every CallStore backend: memory, sqlite and redis (issue 6).

Every case runs against all three with an injected clock (the redis store passes it to its
scripts instead of the server's TIME), so nothing waits for wall time. Besides the cases
of tests/guards/test_call_loop.py, a seeded random script of calls, provider failures,
reopens and clock steps is replayed against each backend and against CallLoopGuard, the
reference, and every decision must agree.
"""

from __future__ import annotations

import asyncio
import random
import sqlite3
from collections.abc import Mapping
from pathlib import Path

import pytest

from gateway.app.errors import StateError
from gateway.calls.entry import CallLogEntry
from gateway.calls.redis_store import RedisCallStore
from gateway.calls.sqlite_store import SCHEMA_VERSION, SqliteCallStore
from gateway.calls.store import CallStore
from guards.call_loop import (
    CallDecision,
    CallLoopGuard,
    CallLoopPolicy,
    PausedCircuit,
    UniquenessRule,
    circuit_key,
    fingerprint_call,
)
from tests.fakes.redis_server import RedisServer
from tests.gateway.calls.store_helpers import Clock, MakeStore, redis_replicas

MODEL = "gpt-4o-mini"
SESSION = circuit_key("billing-bot", "run-1")


def fp(text: str, model: str = MODEL) -> str:
    return fingerprint_call(model, [{"role": "user", "content": text}])


A = fp("Check order 12345 at 10:00")
B = fp("Check order 12345, what is its status?")
C = fp("Summarise the invoice")


@pytest.fixture
def clock() -> Clock:
    """This suite's clock starts at 1,000,000 s (`make` builds its stores on it)."""
    return Clock(1_000_000.0)


async def send(
    store: CallStore,
    clock: Clock,
    fingerprint: str,
    at: float,
    circuit: str = SESSION,
    *,
    fields: Mapping[str, str] | None = None,
) -> CallDecision:
    clock.at(at)
    return await store.decide(circuit, fingerprint, fields or {})


def rule(**overrides: object) -> UniquenessRule:
    data: dict[str, object] = {
        "name": "once-per-step",
        "fields": ["session", "step"],
        "max_calls": 1,
        "window_seconds": "24h",
    }
    data.update(overrides)
    return UniquenessRule.from_dict(data)


# ---------------------------------------------------------------------------------------
# Loop detection
# ---------------------------------------------------------------------------------------


async def test_issue6_sixth_identical_call_is_refused_and_pauses_the_circuit(
    make: MakeStore, clock: Clock
) -> None:
    store = await make()
    decisions = [await send(store, clock, A, 10.0 + i) for i in range(5)]
    assert [d.allowed for d in decisions] == [True] * 5
    assert [d.count for d in decisions] == [1, 2, 3, 4, 5]

    sixth = await send(store, clock, A, 15.0)
    assert (sixth.allowed, sixth.code, sixth.count) == (False, "loop_detected", 6)
    assert sixth.retry_after == 300.0
    assert "billing-bot" in sixth.message
    assert "300 seconds" in sixth.message

    different = await send(store, clock, B, 75.0)
    assert different.code == "loop_paused"
    assert different.retry_after == pytest.approx(240.0)

    assert (await send(store, clock, A, 75.0, circuit_key("billing-bot", "run-2"))).allowed
    assert (await send(store, clock, A, 75.0, circuit_key("support-bot", "run-1"))).allowed


async def test_issue6_a_call_60_001_s_after_the_first_of_five_is_allowed(
    make: MakeStore, clock: Clock
) -> None:
    store = await make()
    for i in range(5):
        assert (await send(store, clock, A, 100.0 + i * 10)).allowed
    assert (await send(store, clock, A, 160.001)).allowed
    assert (await send(store, clock, A, 160.002)).code == "loop_detected"


async def test_issue10_a_call_is_decided_under_the_policy_it_carries(
    make: MakeStore, clock: Clock
) -> None:
    # A room's `policy.call_loop` travels with each call; the store's own is the default.
    store = await make()
    three = CallLoopPolicy(max_repeats=3, window_seconds=600.0, pause_seconds=30.0)
    for _ in range(3):
        assert (await store.decide(SESSION, A, policy=three)).allowed
    clock.at(100.0)
    refused = await store.decide(SESSION, A, policy=three)
    assert (refused.code, refused.count, refused.retry_after) == ("loop_detected", 4, 30.0)
    # The calls already counted stay counted when the policy changes mid-window: under a
    # budget of 5 in 600 s a circuit with 3 counted calls has two more.
    other = circuit_key("billing-bot", "run-2")
    five = CallLoopPolicy(max_repeats=5, window_seconds=600.0)
    for i in range(3):
        clock.at(200.0 + i)
        assert (await store.decide(other, A, policy=three)).allowed
    clock.at(300.0)  # past the store's own 60 s window, inside the carried 600 s one
    assert [(await store.decide(other, A, policy=five)).allowed for _ in range(3)] == [
        True,
        True,
        False,
    ]


async def test_the_window_is_half_open(make: MakeStore, clock: Clock) -> None:
    store = await make(CallLoopPolicy(max_repeats=1, window_seconds=10.0))
    assert (await send(store, clock, A, 0.0)).allowed
    assert (await send(store, clock, A, 10.0)).allowed
    assert (await send(store, clock, A, 19.999)).code == "loop_detected"


async def test_issue6_occurrences_count_not_runs(make: MakeStore, clock: Clock) -> None:
    store = await make()
    for i, fingerprint in enumerate([A, A, B, A, A, A]):
        assert (await send(store, clock, fingerprint, 10.0 + i)).allowed
    assert (await send(store, clock, A, 20.0)).code == "loop_detected"


@pytest.mark.parametrize(
    ("status", "error"),
    [(429, None), (500, None), (503, None), (408, None), (None, "timeout"), (None, "dropped")],
)
async def test_issue6_provider_failures_are_not_counted(
    make: MakeStore, clock: Clock, status: int | None, error: str | None
) -> None:
    store = await make()
    for i in range(12):
        decision = await send(store, clock, A, 10.0 + i)
        assert decision.allowed
        assert await store.record_outcome(decision, status, error)


@pytest.mark.parametrize("status", [200, 400, 422])
async def test_issue6_successes_and_other_4xx_are_counted(
    make: MakeStore, clock: Clock, status: int
) -> None:
    store = await make()
    for i in range(5):
        decision = await send(store, clock, A, 10.0 + i)
        assert not await store.record_outcome(decision, status)
    assert (await send(store, clock, A, 15.0)).code == "loop_detected"


async def test_concurrent_repeats_are_caught_before_their_outcome(
    make: MakeStore, clock: Clock
) -> None:
    store = await make()
    clock.at(10.0)
    decisions = await asyncio.gather(*(store.decide(SESSION, A, {}) for _ in range(12)))
    assert sum(d.allowed for d in decisions) == 5
    assert sum(d.code == "loop_detected" for d in decisions) == 1


async def test_a_refusal_cannot_be_uncounted(make: MakeStore, clock: Clock) -> None:
    store = await make(CallLoopPolicy(max_repeats=1))
    await send(store, clock, A, 0.0)
    refused = await send(store, clock, A, 1.0)
    assert not await store.record_outcome(refused, 503)


async def test_issue6_the_pause_ends_after_pause_seconds(make: MakeStore, clock: Clock) -> None:
    store = await make()
    for i in range(6):
        await send(store, clock, A, 10.0 + i)
    assert (await send(store, clock, A, 314.999)).code == "loop_paused"
    after = await send(store, clock, A, 315.0)
    assert (after.allowed, after.count) == (True, 1)


async def test_a_pause_shorter_than_the_window_keeps_the_counts(
    make: MakeStore, clock: Clock
) -> None:
    store = await make(CallLoopPolicy(max_repeats=2, window_seconds=60.0, pause_seconds=5.0))
    await send(store, clock, A, 0.0)
    await send(store, clock, A, 1.0)
    assert (await send(store, clock, A, 2.0)).code == "loop_detected"
    assert (await send(store, clock, B, 7.0)).allowed
    assert (await send(store, clock, A, 7.0)).code == "loop_detected"
    assert (await send(store, clock, A, 61.0)).allowed


async def test_issue6_reopen_lifts_the_pause_and_forgets_the_counts(
    make: MakeStore, clock: Clock
) -> None:
    store = await make()
    for i in range(6):
        await send(store, clock, A, 10.0 + i)
    clock.at(20.0)
    assert await store.paused() == [PausedCircuit(SESSION, 295.0, "loop_detected", 1)]
    assert (await send(store, clock, B, 20.0)).code == "loop_paused"
    assert (await store.paused())[0].count == 2

    clock.at(30.0)
    assert await store.reopen(SESSION)
    assert await store.paused() == []
    reopened = await send(store, clock, A, 31.0)
    assert (reopened.allowed, reopened.count) == (True, 1)
    clock.at(32.0)
    assert not await store.reopen(SESSION)


async def test_issue6_the_same_step_is_the_same_call(make: MakeStore, clock: Clock) -> None:
    store = await make()
    circuit = circuit_key("billing-bot", "run-1", "page-3")
    fields = {"session": "run-1", "step": "page-3", "model": MODEL}
    for attempt in range(5):
        decision = await send(store, clock, fp(f"attempt {attempt}"), 1.0, circuit, fields=fields)
        assert decision.allowed
    assert (await send(store, clock, fp("attempt 9"), 2.0, circuit, fields=fields)).code == (
        "loop_detected"
    )


# ---------------------------------------------------------------------------------------
# Uniqueness rules
# ---------------------------------------------------------------------------------------


async def ask(
    store: CallStore, clock: Clock, at: float, prompt: str = "Process page", **fields: str
) -> CallDecision:
    circuit = circuit_key("billing-bot", fields.get("session"))
    return await send(store, clock, fp(prompt), at, circuit, fields=fields)


async def test_issue6_reject_rule_refuses_with_duplicate_call(
    make: MakeStore, clock: Clock
) -> None:
    store = await make(rules=[rule(window_seconds=60)])
    assert (await ask(store, clock, 0.0, "Process page 3", session="s1", step="page-3")).allowed
    again = await ask(store, clock, 10.0, "Please process page 3", session="s1", step="page-3")
    assert (again.code, again.rule, again.count) == ("duplicate_call", "once-per-step", 2)
    assert again.retry_after == pytest.approx(50.0)
    assert "once-per-step" in again.message
    assert (await ask(store, clock, 10.0, session="s1", step="page-4")).allowed
    assert (await ask(store, clock, 10.0, session="s2", step="page-3")).allowed
    assert (await ask(store, clock, 11.0, session="s1")).allowed
    assert (await ask(store, clock, 60.0, session="s1", step="page-3")).allowed


async def test_issue6_trailing_star_filters_match_prefixes(make: MakeStore, clock: Clock) -> None:
    store = await make(rules=[rule(fields=["session", "feature"], filters={"feature": "inv*"})])
    assert (await ask(store, clock, 0.0, session="s1", feature="invoices")).allowed
    assert (await ask(store, clock, 1.0, session="s1", feature="invoices")).code == (
        "duplicate_call"
    )
    assert (await ask(store, clock, 1.0, session="s1", feature="billing")).allowed
    assert (await ask(store, clock, 2.0, session="s1", feature="billing")).allowed


async def test_issue6_pause_rule_pauses_the_group_even_with_a_different_prompt(
    make: MakeStore, clock: Clock
) -> None:
    same_prompt = rule(
        name="same-prompt-per-customer",
        fields=["customer", "prompt"],
        max_calls=3,
        window_seconds="10m",
        action="pause",
    )
    store = await make(CallLoopPolicy(pause_seconds=300.0), [same_prompt])
    for i in range(3):
        decision = await ask(store, clock, float(i), "Where is my refund?", customer="c1")
        assert decision.allowed
    tripped = await ask(store, clock, 3.0, "Where is my refund?", session="s9", customer="c1")
    assert (tripped.code, tripped.retry_after) == ("duplicate_call", 300.0)
    later = await ask(store, clock, 4.0, "Cancel my order", session="s10", customer="c1")
    assert (later.code, later.rule) == ("loop_paused", "same-prompt-per-customer")
    assert (await ask(store, clock, 4.0, "Where is my refund?", customer="c2")).allowed

    group = "rule=same-prompt-per-customer/customer=c1"
    clock.at(5.0)
    paused = await store.paused()
    assert [(p.circuit, p.reason, p.count) for p in paused] == [
        (group, "rule:same-prompt-per-customer", 2)
    ]
    clock.at(6.0)
    assert await store.reopen(group)
    assert (await ask(store, clock, 7.0, "Where is my refund?", customer="c1")).allowed


async def test_the_prompt_field_falls_back_to_the_fingerprint(
    make: MakeStore, clock: Clock
) -> None:
    store = await make(rules=[rule(fields=["customer", "prompt"], max_calls=1)])
    assert (await ask(store, clock, 0.0, "Check order 12345 at 10:00", customer="c1")).allowed
    assert (await ask(store, clock, 1.0, "Check order 67890 at 10:05", customer="c1")).code == (
        "duplicate_call"
    )
    assert (await ask(store, clock, 1.0, "Extract page 2", customer="c1")).allowed


async def test_rule_counts_are_released_on_provider_failure(make: MakeStore, clock: Clock) -> None:
    store = await make(rules=[rule()])
    first = await ask(store, clock, 0.0, session="s1", step="p1")
    assert await store.record_outcome(first, 503)
    assert (await ask(store, clock, 1.0, session="s1", step="p1")).allowed


# ---------------------------------------------------------------------------------------
# The reference: CallLoopGuard
# ---------------------------------------------------------------------------------------


def _comparable(decision: CallDecision) -> tuple[object, ...]:
    """A decision without its receipt (stores may number their calls differently)."""
    return (
        decision.allowed,
        decision.code,
        round(decision.retry_after, 6),
        decision.count,
        decision.circuit,
        decision.message,
        decision.rule,
        decision.rule,
        decision.paused_group,
    )


async def test_every_decision_agrees_with_the_guard_on_a_random_script(
    make: MakeStore, clock: Clock
) -> None:
    policy = CallLoopPolicy(max_repeats=3, window_seconds=20.0, pause_seconds=15.0)
    rules = [
        rule(name="per-step", fields=["session", "step"], max_calls=2, window_seconds=30),
        rule(
            name="per-customer",
            fields=["customer", "prompt"],
            max_calls=4,
            window_seconds=40,
            action="pause",
            filters={"feature": "inv*"},
        ),
    ]
    store = await make(policy, rules)
    guard = CallLoopGuard(policy, rules, clock=clock)
    rng = random.Random(6)
    prompts = [fp(f"question {n}") for n in range(3)]
    circuits = [circuit_key("bot", s) for s in ("s1", "s2")]
    allowed: list[CallDecision] = []
    pairs: dict[int, CallDecision] = {}
    for step in range(400):
        clock.now += rng.choice([0.0, 0.5, 1.0, 3.0, 7.0])
        roll = rng.random()
        if roll < 0.08 and allowed:
            index = rng.randrange(len(allowed))
            status = rng.choice([200, 429, 503, None])
            # Whether a call whose window already ended is "found" again depends on when
            # each backend sweeps; only the decisions that follow must agree.
            await store.record_outcome(allowed[index], status, "timeout")
            guard.record_outcome(pairs[index], status=status, error="timeout")
            continue
        if roll < 0.12:
            target = rng.choice([*circuits, "rule=per-customer/customer=c1"])
            assert await store.reopen(target) == guard.reopen(target), step
            continue
        circuit = rng.choice(circuits)
        fields = {"session": circuit[-2:], "model": MODEL}
        if rng.random() < 0.5:
            fields["step"] = rng.choice(["p1", "p2"])
        if rng.random() < 0.6:
            fields["customer"] = rng.choice(["c1", "c2"])
            fields["feature"] = rng.choice(["invoices", "billing"])
        fingerprint = rng.choice(prompts)
        ours_decision = await store.decide(circuit, fingerprint, fields)
        theirs_decision = guard.check(circuit=circuit, fingerprint=fingerprint, fields=fields)
        assert _comparable(ours_decision) == _comparable(theirs_decision), step
        if ours_decision.allowed:
            pairs[len(allowed)] = theirs_decision
            allowed.append(ours_decision)
    assert _paused_view(await store.paused()) == _paused_view(guard.paused())


def _paused_view(paused: list[PausedCircuit]) -> list[tuple[str, float, str, int]]:
    return [(p.circuit, round(p.remaining, 6), p.reason, p.count) for p in paused]


# ---------------------------------------------------------------------------------------
# One step, three backends (issue 10): what the copies of the decision could get wrong
# ---------------------------------------------------------------------------------------


async def decide(
    store: CallStore,
    clock: Clock,
    at: float,
    fingerprint: str = A,
    circuit: str = SESSION,
    *,
    policy: CallLoopPolicy | None = None,
    fields: Mapping[str, str] | None = None,
) -> CallDecision:
    clock.at(at)
    return await store.decide(circuit, fingerprint, fields or {}, policy=policy)


async def test_issue10_repeats_count_occurrences_and_the_refusal_names_what_it_paused(
    make: MakeStore, clock: Clock
) -> None:
    store = await make()
    decisions = [await decide(store, clock, 10.0 + i, f) for i, f in enumerate([A, A, B, A, A, A])]
    assert [(d.code, d.count, d.paused_group) for d in decisions] == [
        ("ok", 1, None),
        ("ok", 2, None),
        ("ok", 1, None),
        ("ok", 3, None),
        ("ok", 4, None),
        ("ok", 5, None),
    ]
    sixth = await decide(store, clock, 16.0)
    assert (sixth.code, sixth.count, sixth.paused_group) == ("loop_detected", 6, SESSION)
    paused = await decide(store, clock, 17.0, B)
    assert (paused.code, paused.count, paused.paused_group) == ("loop_paused", 2, None)


async def test_issue10_a_pause_and_its_reopen(make: MakeStore, clock: Clock) -> None:
    store = await make(CallLoopPolicy(max_repeats=2, window_seconds=60.0, pause_seconds=30.0))
    for at in (0.0, 1.0):
        assert (await decide(store, clock, at)).allowed
    assert (await decide(store, clock, 2.0)).code == "loop_detected"
    assert [
        (d.code, d.count) for d in [await decide(store, clock, 3.0 + i, B) for i in range(2)]
    ] == [
        ("loop_paused", 2),
        ("loop_paused", 3),
    ]
    clock.at(5.0)
    assert await store.reopen(SESSION)
    assert not await store.reopen(SESSION)  # not paused any more: nothing lifted
    # The counts before the reopen are forgotten; the ones after it count as usual.
    assert [(await decide(store, clock, 6.0 + i)).code for i in range(3)] == [
        "ok",
        "ok",
        "loop_detected",
    ]
    assert (await decide(store, clock, 37.999, B)).code == "loop_paused"
    assert (await decide(store, clock, 38.0, B)).allowed  # the pause ends at exactly now


async def test_issue10_rule_groups_pause_and_reject(make: MakeStore, clock: Clock) -> None:
    per_customer = rule(
        name="per-customer", fields=["customer"], max_calls=2, window_seconds=60, action="pause"
    )
    per_step = rule(name="per-step", fields=["session", "step"], max_calls=1, window_seconds=60)
    store = await make(CallLoopPolicy(pause_seconds=20.0), [per_customer, per_step])
    one = {"customer": "c1", "session": "s1", "step": "p1"}
    assert (await decide(store, clock, 0.0, fp("q1"), fields=one)).allowed
    rejected = await decide(store, clock, 1.0, fp("q2"), fields=one)
    assert (rejected.code, rejected.rule, rejected.paused_group) == (
        "duplicate_call",
        "per-step",
        None,
    )
    assert rejected.retry_after == pytest.approx(59.0)
    assert (await decide(store, clock, 2.0, fp("q3"), fields={**one, "step": "p2"})).allowed
    tripped = await decide(store, clock, 3.0, fp("q4"), fields={**one, "step": "p3"})
    group = "rule=per-customer/customer=c1"
    assert (tripped.code, tripped.rule, tripped.count) == ("duplicate_call", "per-customer", 3)
    assert (tripped.paused_group, tripped.retry_after) == (group, 20.0)
    later = await decide(store, clock, 4.0, fp("q5"), fields={"customer": "c1"})
    assert (later.code, later.rule, later.count, later.paused_group) == (
        "loop_paused",
        "per-customer",
        2,
        None,
    )
    assert (await decide(store, clock, 4.0, fp("q5"), fields={"customer": "c2"})).allowed
    assert (await decide(store, clock, 22.999, fp("q6"), fields={"customer": "c1"})).code == (
        "loop_paused"
    )
    # The pause ends at exactly 23; the group's two counted calls (at 0 and 2) still count.
    assert (await decide(store, clock, 23.0, fp("q7"), fields={"customer": "c1"})).code == (
        "duplicate_call"
    )


async def test_issue10_a_provider_failure_is_uncounted(make: MakeStore, clock: Clock) -> None:
    store = await make(rules=[rule(name="per-session", fields=["session"], max_calls=5)])
    fields = {"session": "s1"}
    decisions = [await decide(store, clock, float(i), fields=fields) for i in range(5)]
    assert await store.record_outcome(decisions[2], 503)
    assert not await store.record_outcome(decisions[2], 503)  # once only
    assert not await store.record_outcome(decisions[3], 400)  # the caller's fault counts
    sixth = await decide(store, clock, 6.0, fields=fields)
    assert (sixth.code, sixth.count) == ("ok", 5)
    assert (await decide(store, clock, 7.0, fields=fields)).code == "loop_detected"


async def test_issue10_max_repeats_down_and_up_mid_window(make: MakeStore, clock: Clock) -> None:
    store = await make()
    five, three, seven = CallLoopPolicy(), CallLoopPolicy(max_repeats=3), CallLoopPolicy(7)
    for i in range(4):
        assert (await decide(store, clock, float(i), policy=five)).allowed
    down = await decide(store, clock, 4.0, policy=three)
    assert (down.code, down.count) == ("loop_detected", 5)

    other = circuit_key("billing-bot", "run-2")
    for i in range(5):
        assert (await decide(store, clock, float(i), circuit=other, policy=five)).allowed
    up = [await decide(store, clock, 5.0 + i, circuit=other, policy=seven) for i in range(3)]
    assert [(d.code, d.count) for d in up] == [("ok", 6), ("ok", 7), ("loop_detected", 8)]


async def test_issue10_window_shorter_and_longer_mid_window(make: MakeStore, clock: Clock) -> None:
    store = await make()
    wide, narrow = CallLoopPolicy(window_seconds=60.0), CallLoopPolicy(window_seconds=20.0)
    for at in (0.0, 10.0, 20.0, 25.0):
        await decide(store, clock, at, policy=wide)
    # Under a 20 s window at 30 only the calls of 20 and 25 still count (10 + 20 <= 30).
    assert (await decide(store, clock, 30.0, policy=narrow)).count == 3
    # The shorter window dropped the calls of 0 and 10: a wider one does not bring them back.
    assert (await decide(store, clock, 31.0, policy=wide)).count == 4

    longer = circuit_key("billing-bot", "run-2")
    short = CallLoopPolicy(window_seconds=10.0)
    for at in (0.0, 1.0, 2.0):
        await decide(store, clock, at, circuit=longer, policy=short)
    # Still counted at 11.999 (the last call's 10 s window is open): they count in 60 s.
    assert (await decide(store, clock, 11.999, circuit=longer, policy=wide)).count == 4

    idle = circuit_key("billing-bot", "run-3")
    for at in (0.0, 1.0, 2.0):
        await decide(store, clock, at, circuit=idle, policy=short)
    # At exactly 12 the last call left the window it was counted in: the record is idle,
    # forgotten (or as good as) on every backend, whatever the window is now.
    assert (await decide(store, clock, 12.0, circuit=idle, policy=wide)).count == 1


async def test_issue10_pause_seconds_changed_during_a_pause(make: MakeStore, clock: Clock) -> None:
    store = await make(CallLoopPolicy(max_repeats=1))
    quick = CallLoopPolicy(max_repeats=1, pause_seconds=10.0)
    await decide(store, clock, 0.0)
    assert (await decide(store, clock, 1.0)).retry_after == 300.0
    # The running pause keeps the end it was opened with.
    during = await decide(store, clock, 100.0, B, policy=quick)
    assert during.code == "loop_paused"
    assert during.retry_after == pytest.approx(201.0)
    assert (await decide(store, clock, 300.999, B, policy=quick)).code == "loop_paused"
    assert (await decide(store, clock, 301.0, B, policy=quick)).allowed
    # The next pause is the new length.
    assert (await decide(store, clock, 302.0, B, policy=quick)).retry_after == 10.0
    assert (await decide(store, clock, 312.0, A, policy=quick)).allowed


async def test_issue10_exact_boundaries(make: MakeStore, clock: Clock) -> None:
    store = await make(
        CallLoopPolicy(max_repeats=2, window_seconds=10.0, pause_seconds=5.0),
        [rule(name="per-session", fields=["session"], max_calls=3, window_seconds=20)],
    )
    fields = {"session": "s1"}
    await decide(store, clock, 0.0, fields=fields)
    await decide(store, clock, 5.0, fields=fields)
    # The call of 0 leaves its window at exactly 10: one repeat counted, not two.
    assert (await decide(store, clock, 10.0, fields=fields)).count == 2
    over = await decide(store, clock, 15.0, B, fields=fields)
    assert (over.code, over.count, over.retry_after) == ("duplicate_call", 4, 5.0)
    assert (await decide(store, clock, 20.0, B, fields=fields)).allowed  # 0 + 20 = now

    other = circuit_key("billing-bot", "run-2")
    for at in (0.0, 5.0, 10.0):
        assert (await decide(store, clock, at, circuit=other)).allowed
    tripped = await decide(store, clock, 14.0, circuit=other)
    assert (tripped.code, tripped.count) == ("loop_detected", 3)
    assert (await decide(store, clock, 18.999, C, circuit=other)).code == "loop_paused"
    assert (await decide(store, clock, 19.0, C, circuit=other)).allowed  # the pause ends now


@pytest.mark.parametrize("fingerprints", ["identical", "distinct"])
async def test_issue10_64_concurrent_decisions_on_one_circuit(
    make: MakeStore, clock: Clock, fingerprints: str
) -> None:
    # Identical calls: the repeat budget (5) holds exactly; distinct ones: a rule's (10).
    store = await make(rules=[rule(name="per-session", fields=["session"], max_calls=10)])
    prints = [A] * 64 if fingerprints == "identical" else [fp(f"q{i}") for i in range(64)]
    clock.at(10.0)
    decisions = await asyncio.gather(*(store.decide(SESSION, f, {"session": "s1"}) for f in prints))
    codes = sorted(d.code for d in decisions)
    if fingerprints == "identical":
        assert codes == ["loop_detected"] + ["loop_paused"] * 58 + ["ok"] * 5
    else:
        assert codes == ["duplicate_call"] * 54 + ["ok"] * 10
    counts = sorted(d.count for d in decisions if d.allowed)
    assert counts == ([1, 2, 3, 4, 5] if fingerprints == "identical" else [1] * 10)


async def test_issue10_policy_changes_agree_with_the_guard_on_a_random_script(
    make: MakeStore, clock: Clock
) -> None:
    policies = [
        CallLoopPolicy(max_repeats=r, window_seconds=w, pause_seconds=p)
        for r, w, p in [(2, 10.0, 5.0), (3, 20.0, 15.0), (5, 5.0, 0.0), (1, 30.0, 8.0)]
    ]
    rules = [
        rule(name="per-step", fields=["session", "step"], max_calls=2, window_seconds=15),
        rule(
            name="per-customer", fields=["customer"], max_calls=3, window_seconds=25, action="pause"
        ),
    ]
    store = await make(policies[0], rules)
    guard = CallLoopGuard(policies[0], rules, clock=clock)
    rng = random.Random(10)
    allowed: list[tuple[CallDecision, CallDecision]] = []
    for step in range(500):
        clock.now += rng.choice([0.0, 0.5, 1.0, 2.5, 6.0])
        roll = rng.random()
        if roll < 0.08 and allowed:
            ours, theirs = rng.choice(allowed)
            await store.record_outcome(ours, 503)
            guard.record_outcome(theirs, status=503)
            continue
        if roll < 0.11:
            target = rng.choice([SESSION, "rule=per-customer/customer=c1"])
            assert await store.reopen(target) == guard.reopen(target), step
            continue
        policy = rng.choice(policies)
        fields = {"session": "s1", "customer": rng.choice(["c1", "c2"])}
        if rng.random() < 0.5:
            fields["step"] = rng.choice(["p1", "p2"])
        fingerprint = rng.choice([A, B])
        ours = await store.decide(SESSION, fingerprint, fields, policy=policy)
        theirs = guard.check(circuit=SESSION, fingerprint=fingerprint, fields=fields, policy=policy)
        assert _comparable(ours) == _comparable(theirs), step
        if ours.allowed:
            allowed.append((ours, theirs))
    assert _paused_view(await store.paused()) == _paused_view(guard.paused())


# ---------------------------------------------------------------------------------------
# The request log
# ---------------------------------------------------------------------------------------


def entry(at: float, n: int, outcome: str = "forwarded") -> CallLogEntry:
    assert outcome in ("forwarded", "loop_detected")
    return CallLogEntry(
        at=at,
        provider="openai",
        agent="billing-bot",
        session=f"run-{n}",
        circuit=circuit_key("billing-bot", f"run-{n}"),
        model=MODEL,
        outcome="forwarded" if outcome == "forwarded" else "loop_detected",
        status=200 if outcome == "forwarded" else None,
        input_tokens=10 + n,
        output_tokens=20 + n,
        cost=0.001 * n,
        estimated=outcome != "forwarded",
        fingerprint=A,
        rule=None,
        retry=n % 3,
        duration_ms=1.5,
        fields={"session": f"run-{n}", "model": MODEL},
    )


async def test_the_log_returns_the_calls_since_a_time_oldest_first(
    make: MakeStore, clock: Clock
) -> None:
    store = await make()
    clock.at(0.0)
    start = clock.now
    for n in (3, 1, 2):
        await store.log_call(entry(start + n * 100, n))
    await store.log_call(entry(start + 200, 4, "loop_detected"))
    clock.at(300.0)
    since = await store.calls_since(150.0)
    assert [(e.session, e.outcome) for e in since] == [
        ("run-2", "forwarded"),
        ("run-4", "loop_detected"),
        ("run-3", "forwarded"),
    ]
    assert since[0] == entry(start + 200, 2)
    assert dict(since[1].fields) == {"session": "run-4", "model": MODEL}
    assert len(await store.calls_since(1_000.0)) == 4


async def test_the_log_keeps_the_newest_entries(make: MakeStore, clock: Clock) -> None:
    store = await make(log_keep=3)
    clock.at(100.0)
    for n in range(5):
        await store.log_call(entry(clock.now - 50 + n, n))
    assert [e.session for e in await store.calls_since(1_000.0)] == ["run-2", "run-3", "run-4"]


async def test_issue10_a_batch_is_appended_in_order_and_trimmed_to_the_newest(
    make: MakeStore, clock: Clock
) -> None:
    store = await make(log_keep=4)
    clock.at(100.0)
    await store.log_calls([])
    await store.log_calls([entry(clock.now - 10 + n, n) for n in range(3)])
    await store.log_calls([entry(clock.now - 10 + n, n) for n in range(3, 6)])
    assert [e.session for e in await store.calls_since(1_000.0)] == [
        f"run-{n}" for n in range(2, 6)
    ]


# ---------------------------------------------------------------------------------------
# Backend specifics: persistence (sqlite), shared replicas and outages (redis)
# ---------------------------------------------------------------------------------------


async def test_sqlite_pauses_and_the_log_survive_a_restart(tmp_path: Path, clock: Clock) -> None:
    path = tmp_path / "state.sqlite3"
    first = SqliteCallStore(path, clock=clock, wall_clock=clock)
    await first.start()
    for i in range(6):
        await send(first, clock, A, 10.0 + i)
    await first.log_call(entry(clock.now, 1))
    await first.aclose()

    second = SqliteCallStore(path, clock=clock, wall_clock=clock)
    await second.start()
    try:
        clock.at(115.0)
        assert [(p.circuit, p.remaining) for p in await second.paused()] == [(SESSION, 200.0)]
        assert (await send(second, clock, B, 116.0)).code == "loop_paused"
        assert [e.session for e in await second.calls_since(3_600.0)] == ["run-1"]
    finally:
        await second.aclose()


async def test_issue10_sqlite_refuses_a_malformed_record_and_serves_the_next_call(
    tmp_path: Path, clock: Clock
) -> None:
    path = tmp_path / "state.sqlite3"
    store = SqliteCallStore(path, clock=clock, wall_clock=clock)
    await store.start()
    try:
        await send(store, clock, A, 1.0)
        with sqlite3.connect(path) as db:
            db.execute("UPDATE call_windows SET times = ?", (b"\x00" * 7,))
        with pytest.raises(StateError, match="malformed record of counted calls"):
            await send(store, clock, A, 2.0)
        assert (await send(store, clock, B, 3.0)).allowed
    finally:
        await store.aclose()


async def test_issue10_sqlite_upgrades_a_schema_1_file_keeping_its_pauses(
    tmp_path: Path, clock: Clock
) -> None:
    path = tmp_path / "state.sqlite3"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE call_meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL)")
        db.execute("INSERT INTO call_meta VALUES ('schema', 1)")
        db.execute(
            "CREATE TABLE call_holds (key TEXT PRIMARY KEY, paused_until REAL NOT NULL, "
            "fresh_from REAL, expires_at REAL NOT NULL, reason TEXT NOT NULL, rule TEXT, "
            "count INTEGER NOT NULL)"
        )
        until = clock.now + 100.0
        db.execute(
            "INSERT INTO call_holds VALUES (?, ?, NULL, ?, 'loop_detected', NULL, 1)",
            (SESSION, until, until),
        )
        db.execute(
            "CREATE TABLE call_events (id INTEGER PRIMARY KEY, key TEXT NOT NULL, "
            "at REAL NOT NULL, expires_at REAL NOT NULL)"
        )
    store = SqliteCallStore(path, clock=clock, wall_clock=clock)
    await store.start()
    try:
        assert (await send(store, clock, B, 1.0)).code == "loop_paused"
        assert (await send(store, clock, B, 1.0, circuit_key("billing-bot", "run-2"))).allowed
    finally:
        await store.aclose()
    with sqlite3.connect(path) as db:
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master")}
        assert "call_events" not in tables
        assert db.execute("SELECT value FROM call_meta").fetchone() == (SCHEMA_VERSION,)


@pytest.mark.redis
async def test_redis_replicas_share_circuits(redis_url: str, clock: Clock) -> None:
    async with redis_replicas(redis_url, clock, "shared:") as replicas:
        for i in range(5):
            assert (await send(replicas[i % 2], clock, A, 10.0 + i)).allowed
        assert (await send(replicas[1], clock, A, 15.0)).code == "loop_detected"
        assert (await send(replicas[0], clock, B, 16.0)).code == "loop_paused"
        clock.at(17.0)
        assert await replicas[0].reopen(SESSION)
        assert (await send(replicas[1], clock, A, 18.0)).allowed


@pytest.mark.redis
@pytest.mark.parametrize("on_error", ["allow", "deny"])
async def test_issue9_redis_down_follows_on_error_and_logs_once(
    tmp_path: Path, clock: Clock, caplog: pytest.LogCaptureFixture, on_error: str
) -> None:
    server = RedisServer(tmp_path / "redis")
    server.start()
    store = RedisCallStore(
        server.url,
        on_error="allow" if on_error == "allow" else "deny",
        clock=clock,
        probe_interval=0.0,
        timeout=0.5,
    )
    await store.start()
    try:
        assert (await send(store, clock, A, 1.0)).allowed
        server.stop()
        decisions = [await send(store, clock, A, 2.0 + i) for i in range(8)]
        # Circuits are local to this process while Redis is down, not switched off; `deny`
        # refuses budgeted calls only (issue 24, tests/gateway/proxy/test_proxy_state_outage.py).
        assert [d.code for d in decisions] == ["ok"] * 5 + ["loop_detected"] + ["loop_paused"] * 2
        await store.log_call(entry(clock.now, 1))
        with pytest.raises(Exception, match="unreachable"):
            await store.reopen(SESSION)
        downs = [r for r in caplog.records if "unreachable" in r.getMessage()]
        assert len(downs) == 1
        assert store.degraded
        server.start()
        assert (await send(store, clock, A, 20.0)).allowed
        assert not store.degraded
        # The local counts were dropped when Redis came back: a new outage starts fresh.
        server.stop()
        assert (await send(store, clock, A, 21.0)).allowed
    finally:
        await store.aclose()
        server.stop()
