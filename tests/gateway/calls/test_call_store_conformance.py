"""One conformance suite for every CallStore backend: memory, sqlite and redis (issue 6).

Every case runs against all three with an injected clock (the redis store passes it to its
scripts instead of the server's TIME), so nothing waits for wall time. Besides the cases
of tests/guards/test_call_loop.py, a seeded random script of calls, provider failures,
reopens and clock steps is replayed against each backend and against CallLoopGuard, the
reference, and every decision must agree.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import AsyncIterator, Awaitable, Iterable, Mapping
from pathlib import Path
from typing import Protocol

import pytest

from gateway.calls.redis_store import RedisCallStore
from gateway.calls.sqlite_store import SqliteCallStore
from gateway.calls.store import CallLogEntry, CallStore, MemoryCallStore
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

BACKENDS = ["memory", "sqlite", pytest.param("redis", marks=pytest.mark.redis)]
MODEL = "gpt-4o-mini"
SESSION = circuit_key("billing-bot", "run-1")
_prefixes = itertools.count()


def fp(text: str, model: str = MODEL) -> str:
    return fingerprint_call(model, [{"role": "user", "content": text}])


A = fp("Check order 12345 at 10:00")
B = fp("Check order 12345, what is its status?")


class Clock:
    """A settable clock shared by the store under test and the test."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def at(self, offset: float) -> None:
        """Set the time to the start plus `offset` seconds."""
        self.now = 1_000_000.0 + offset


class MakeStore(Protocol):
    def __call__(
        self,
        policy: CallLoopPolicy | None = None,
        rules: Iterable[UniquenessRule] = (),
        *,
        log_keep: int = 100_000,
    ) -> Awaitable[CallStore]: ...


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture(params=BACKENDS)
async def make(
    request: pytest.FixtureRequest, clock: Clock, tmp_path: Path
) -> AsyncIterator[MakeStore]:
    """Builds started stores of one backend, all on the test's clock; closes them after."""
    backend: str = request.param
    url: str | None = request.getfixturevalue("redis_url") if backend == "redis" else None
    built: list[CallStore] = []

    async def make(
        policy: CallLoopPolicy | None = None,
        rules: Iterable[UniquenessRule] = (),
        *,
        log_keep: int = 100_000,
    ) -> CallStore:
        store: CallStore
        if backend == "memory":
            store = MemoryCallStore(policy, rules, clock=clock, wall_clock=clock, log_keep=log_keep)
        elif backend == "sqlite":
            path = tmp_path / f"calls-{next(_prefixes)}.sqlite3"
            store = SqliteCallStore(
                path, policy, rules, clock=clock, wall_clock=clock, log_keep=log_keep
            )
        else:
            assert url is not None
            store = RedisCallStore(
                url,
                policy,
                rules,
                key_prefix=f"calls{next(_prefixes)}:",
                clock=clock,
                wall_clock=clock,
                log_keep=log_keep,
            )
        await store.start()
        built.append(store)
        return store

    yield make
    for store in built:
        await store.aclose()


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


@pytest.mark.redis
async def test_redis_replicas_share_circuits(redis_url: str, clock: Clock) -> None:
    replicas = [
        RedisCallStore(redis_url, key_prefix="shared:", clock=clock, wall_clock=clock)
        for _ in range(2)
    ]
    for replica in replicas:
        await replica.start()
    try:
        for i in range(5):
            assert (await send(replicas[i % 2], clock, A, 10.0 + i)).allowed
        assert (await send(replicas[1], clock, A, 15.0)).code == "loop_detected"
        assert (await send(replicas[0], clock, B, 16.0)).code == "loop_paused"
        clock.at(17.0)
        assert await replicas[0].reopen(SESSION)
        assert (await send(replicas[1], clock, A, 18.0)).allowed
    finally:
        for replica in replicas:
            await replica.aclose()


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
        if on_error == "allow":
            # Circuits are local to this process while Redis is down, not switched off.
            assert [d.code for d in decisions] == ["ok"] * 5 + ["loop_detected"] + [
                "loop_paused"
            ] * 2
        else:
            assert all(d.code == "loop_paused" for d in decisions)
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
        assert (await send(store, clock, A, 21.0)).allowed == (on_error == "allow")
    finally:
        await store.aclose()
        server.stop()
