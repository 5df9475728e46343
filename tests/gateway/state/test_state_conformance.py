"""One conformance suite for every StateStore backend: memory, sqlite and redis.

Every case runs against all three with an injected clock (the redis backend passes it to
its scripts instead of the server's TIME), so nothing waits for wall time. The pair
budget is also checked event by event against guards/bot_loop.py's `step_pair`, the
reference every backend must agree with exactly (the Redis Lua is its second version), on
Hypothesis-generated traffic with policy changes between events.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import sqlite3
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import cast

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis

from gateway.state import audit, transcripts
from gateway.state.base import AuditEntry, StateStore, Transcript, TranscriptEntry
from gateway.state.memory import MemoryStateStore
from gateway.state.redis import OWNER_SECONDS, RedisStateStore
from gateway.state.redis_link import RedisTopology
from gateway.state.sqlite import SqliteStateStore
from guards.bot_loop import (
    BotLoopPolicy,
    PairDecision,
    PairRecord,
    PairSnapshot,
    pair_key,
    pair_view,
    step_pair,
)
from tests.fakes.redis_cluster import RedisCluster

BACKENDS = [
    "memory",
    "sqlite",
    pytest.param("redis", marks=pytest.mark.redis),
    pytest.param("redis-cluster", marks=pytest.mark.redis),
]
ROOM = "discord:1100"
OTHER_ROOM = "discord:2200"
POLICY = BotLoopPolicy(max_events_per_window=3, window_seconds=30.0, cooldown_seconds=20.0)
_prefixes = itertools.count()


class Clock:
    """A settable clock shared by the store under test and the test."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        """Move time forward."""
        self.now += seconds


def build_store(
    backend: str,
    clock: Callable[[], float],
    *,
    workdir: Path,
    redis_url: str | None,
    name: int | None = None,
) -> StateStore:
    """A store of one backend driven by `clock`: fresh, or on the data named `name`."""
    name = next(_prefixes) if name is None else name
    if backend == "memory":
        return MemoryStateStore(clock=clock)
    if backend == "sqlite":
        return SqliteStateStore(workdir / f"state-{name}.sqlite3", clock=clock)
    assert redis_url is not None
    topology = RedisTopology(cluster=backend == "redis-cluster")
    return RedisStateStore(redis_url, key_prefix=f"conf{name}:", clock=clock, topology=topology)


def backend_url(request: pytest.FixtureRequest, backend: str) -> str | None:
    """The URL of the redis backends' server (one node of the cluster), None for the others."""
    if backend == "redis":
        return cast(str, request.getfixturevalue("redis_url"))
    if backend == "redis-cluster":
        return cast(RedisCluster, request.getfixturevalue("redis_cluster")).url
    return None


@pytest.fixture
def clock() -> Clock:
    """The time of the store under test."""
    return Clock()


Restart = Callable[[], Awaitable[StateStore]]
"""Start another store instance on the data of `store`, as a restarted gateway would."""


@pytest.fixture(params=BACKENDS)
async def stores(
    request: pytest.FixtureRequest, clock: Clock, tmp_path: Path
) -> AsyncIterator[tuple[StateStore, Restart]]:
    """A started store of each backend, and a way to start another one on its data."""
    backend: str = request.param
    url = backend_url(request, backend)
    name = next(_prefixes)
    started: list[StateStore] = []

    async def start() -> StateStore:
        built = build_store(backend, clock, workdir=tmp_path, redis_url=url, name=name)
        await built.start()
        started.append(built)
        return built

    try:
        await start()
        yield started[0], start
    finally:
        for built in started:
            await built.aclose()


@pytest.fixture
def store(stores: tuple[StateStore, Restart]) -> StateStore:
    """A started store of each backend."""
    return stores[0]


@pytest.fixture
def restart(stores: tuple[StateStore, Restart]) -> Restart:
    """Start another store instance on the data of `store`."""
    return stores[1]


async def decide(
    store: StateStore,
    me: str = "bot-a",
    sender: str = "bot-b",
    *,
    scope: str = ROOM,
    policy: BotLoopPolicy = POLICY,
) -> PairDecision:
    """One bot-to-bot event of a pair."""
    return await store.pair_decide(scope=scope, self_bot_id=me, sender_bot_id=sender, policy=policy)


def entry(n: int, room: str = ROOM) -> AuditEntry:
    """The n-th audit entry of a test."""
    return AuditEntry(
        at=float(n),
        platform="discord",
        room=room,
        user_id=f"u{n}",
        user_name=f"user {n}",
        command=f"/loop status {n}",
        allowed=n % 2 == 0,
        outcome="done",
    )


# The pair budget


async def test_the_budget_admits_then_refuses_and_opens_a_cooldown(
    store: StateStore, clock: Clock
) -> None:
    counts = []
    for _ in range(3):
        decision = await decide(store)
        assert decision.allowed
        assert decision.reason == "ok"
        counts.append(decision.count)
        clock.advance(1)
    assert counts == [1, 2, 3]
    over = await decide(store)
    assert (over.allowed, over.reason, over.count) == (False, "budget_exceeded", 3)
    assert over.retry_after == pytest.approx(20.0)
    clock.advance(5)
    during = await decide(store)
    assert (during.allowed, during.reason, during.count) == (False, "cooldown", 3)
    assert during.retry_after == pytest.approx(15.0)


async def test_the_cooldown_is_not_extended_and_ends_in_a_fresh_window(
    store: StateStore, clock: Clock
) -> None:
    for _ in range(3):
        await decide(store)
    opened = clock.now
    assert (await decide(store)).reason == "budget_exceeded"
    for _ in range(10):
        clock.advance(1.9)
        refused = await decide(store)
        assert refused.reason == "cooldown"
        assert refused.retry_after == pytest.approx(opened + 20.0 - clock.now)
    clock.now = opened + 20.0 - 0.001
    assert (await decide(store)).reason == "cooldown"
    clock.now = opened + 20.0
    fresh = await decide(store)
    assert (fresh.allowed, fresh.reason, fresh.count) == (True, "ok", 1)
    # The events before the cooldown no longer count, though they are inside the window.
    assert [(await decide(store)).count for _ in range(2)] == [2, 3]
    assert (await decide(store)).reason == "budget_exceeded"


async def test_every_refusal_of_one_cooldown_names_the_same_end(
    store: StateStore, clock: Clock
) -> None:
    """The cooldown notice is claimed by the cooldown's end (issue10: replicas raced it)."""
    for _ in range(3):
        assert (await decide(store)).until is None
    opened = clock.now
    over = await decide(store)
    assert over.until == opened + 20.0
    clock.advance(7.3)
    assert (await decide(store)).until == over.until
    clock.advance(0.123456789)
    assert (await decide(store, "bot-b", "bot-a")).until == over.until
    await store.pair_reset()
    for _ in range(3):
        await decide(store)
    again = await decide(store)
    assert again.reason == "budget_exceeded"
    assert again.until == clock.now + 20.0 != over.until


async def test_an_event_counts_in_a_half_open_window(store: StateStore, clock: Clock) -> None:
    start = clock.now
    for offset in (0.0, 10.0, 20.0):
        clock.now = start + offset
        assert (await decide(store)).allowed
    clock.now = start + 30.0 - 0.001
    assert (await decide(store)).reason == "budget_exceeded"


async def test_the_oldest_event_leaves_the_window_at_exactly_its_end(
    store: StateStore, clock: Clock
) -> None:
    start = clock.now
    for offset in (0.0, 10.0, 20.0):
        clock.now = start + offset
        assert (await decide(store)).allowed
    clock.now = start + 30.0
    decision = await decide(store)
    assert (decision.allowed, decision.count) == (True, 3)


async def test_a_refused_event_during_cooldown_is_not_recorded(
    store: StateStore, clock: Clock
) -> None:
    for _ in range(3):
        await decide(store)
    await decide(store)
    for _ in range(50):
        await decide(store)
    snapshot = await store.pair_snapshot(ROOM)
    assert [(s.count, round(s.cooldown_remaining, 6)) for s in snapshot] == [(3, 20.0)]


async def test_the_pair_is_direction_independent(store: StateStore) -> None:
    await decide(store, "bot-a", "bot-b")
    await decide(store, "bot-b", "bot-a")
    third = await decide(store, "bot-a", "bot-b")
    assert third.count == 3
    assert (await decide(store, "bot-b", "bot-a")).reason == "budget_exceeded"
    assert (await decide(store, "bot-a", "bot-b")).reason == "cooldown"


async def test_rooms_and_pairs_have_separate_budgets(store: StateStore) -> None:
    for _ in range(3):
        await decide(store)
    assert (await decide(store)).reason == "budget_exceeded"
    assert (await decide(store, scope=OTHER_ROOM)).count == 1
    assert (await decide(store, "bot-a", "bot-c")).count == 1
    assert (await decide(store, "bot-c", "bot-b")).count == 1


async def test_a_disabled_policy_admits_without_recording(store: StateStore) -> None:
    off = BotLoopPolicy(enabled=False)
    for _ in range(10):
        decision = await decide(store, policy=off)
        assert (decision.allowed, decision.reason, decision.count) == (True, "disabled", 0)
    assert await store.pair_snapshot() == []
    assert (await decide(store)).count == 1


async def test_a_zero_cooldown_refuses_once_then_starts_afresh(store: StateStore) -> None:
    policy = BotLoopPolicy(max_events_per_window=2, window_seconds=30.0, cooldown_seconds=0.0)
    assert [(await decide(store, policy=policy)).count for _ in range(2)] == [1, 2]
    over = await decide(store, policy=policy)
    assert (over.reason, over.retry_after) == ("budget_exceeded", 0.0)
    again = await decide(store, policy=policy)
    assert (again.allowed, again.count) == (True, 1)


async def test_a_budget_of_one(store: StateStore, clock: Clock) -> None:
    policy = BotLoopPolicy(max_events_per_window=1, window_seconds=10.0, cooldown_seconds=5.0)
    assert (await decide(store, policy=policy)).allowed
    assert (await decide(store, policy=policy)).reason == "budget_exceeded"
    clock.advance(5)
    assert (await decide(store, policy=policy)).allowed


# Reset and snapshot


async def test_reset_of_one_room(store: StateStore) -> None:
    for _ in range(4):
        await decide(store)
    await decide(store, "bot-a", "bot-c")
    await decide(store, scope=OTHER_ROOM)
    assert await store.pair_reset(scope=ROOM) == 2
    assert (await decide(store)).count == 1
    assert (await decide(store, scope=OTHER_ROOM)).count == 2


async def test_reset_of_one_bot_in_every_room(store: StateStore) -> None:
    await decide(store, "bot-a", "bot-b")
    await decide(store, "bot-c", "bot-a", scope=OTHER_ROOM)
    await decide(store, "bot-b", "bot-c")
    assert await store.pair_reset(bot_id="bot-a") == 2
    pairs = {(s.scope, s.bot_a, s.bot_b) for s in await store.pair_snapshot()}
    assert pairs == {(ROOM, "bot-b", "bot-c")}


async def test_reset_of_one_bot_in_one_room(store: StateStore) -> None:
    await decide(store, "bot-a", "bot-b")
    await decide(store, "bot-a", "bot-b", scope=OTHER_ROOM)
    assert await store.pair_reset(scope=ROOM, bot_id="bot-b") == 1
    assert [(s.scope, s.count) for s in await store.pair_snapshot()] == [(OTHER_ROOM, 1)]


async def test_reset_of_everything_frees_a_cooling_pair(store: StateStore) -> None:
    for _ in range(4):
        await decide(store)
    await decide(store, scope=OTHER_ROOM)
    assert await store.pair_reset() == 2
    assert await store.pair_snapshot() == []
    assert (await decide(store)).allowed
    assert await store.pair_reset(scope="discord:none") == 0


async def test_the_snapshot_lists_live_pairs_with_counts_and_cooldown_left(
    store: StateStore, clock: Clock
) -> None:
    for _ in range(4):
        await decide(store)
    await decide(store, "bot-c", "bot-a")
    await decide(store, scope=OTHER_ROOM)
    clock.advance(5)
    snapshot = sorted(await store.pair_snapshot(), key=lambda s: (s.scope or "", s.bot_a, s.bot_b))
    assert [(s.scope, s.bot_a, s.bot_b, s.count) for s in snapshot] == [
        (ROOM, "bot-a", "bot-b", 3),
        (ROOM, "bot-a", "bot-c", 1),
        (OTHER_ROOM, "bot-a", "bot-b", 1),
    ]
    assert [round(s.cooldown_remaining, 6) for s in snapshot] == [15.0, 0.0, 0.0]
    assert {(s.bot_a, s.bot_b) for s in await store.pair_snapshot(OTHER_ROOM)} == {
        ("bot-a", "bot-b")
    }


async def test_the_snapshot_leaves_out_idle_pairs(store: StateStore, clock: Clock) -> None:
    await decide(store)
    for _ in range(4):
        await decide(store, "bot-c", "bot-d")
    clock.advance(20.0)
    assert [(s.bot_a, s.count) for s in await store.pair_snapshot()] == [("bot-a", 1)]
    clock.advance(10.0)
    assert await store.pair_snapshot() == []
    assert await store.pair_snapshot(ROOM) == []


async def test_the_snapshot_count_shrinks_as_events_leave_the_window(
    store: StateStore, clock: Clock
) -> None:
    for _ in range(3):
        await decide(store)
        clock.advance(10)
    expected = [PairSnapshot(ROOM, "bot-a", "bot-b", count=2, cooldown_remaining=0.0)]
    assert await store.pair_snapshot(ROOM) == expected


# Consecutive bot turns


async def test_bot_turns_count_up_and_a_human_resets_them(store: StateStore) -> None:
    assert [await store.bot_turn(ROOM, is_bot=True) for _ in range(3)] == [1, 2, 3]
    assert await store.bot_turn(OTHER_ROOM, is_bot=True) == 1
    assert await store.bot_turn(ROOM, is_bot=False) == 0
    assert await store.bot_turn(ROOM, is_bot=True) == 1
    assert await store.bot_turn(OTHER_ROOM, is_bot=True) == 2


async def test_a_message_seen_by_several_bots_counts_once(store: StateStore) -> None:
    first = [await store.bot_turn(ROOM, is_bot=True, message_key=f"m{n}") for n in range(3)]
    again = [await store.bot_turn(ROOM, is_bot=True, message_key=f"m{n}") for n in range(3)]
    assert first == again == [1, 2, 3]
    assert await store.bot_turn(ROOM, is_bot=False, message_key="h1") == 0
    assert await store.bot_turn(ROOM, is_bot=True, message_key="m2") == 3
    assert await store.bot_turn(ROOM, is_bot=True, message_key="m9") == 1


async def test_concurrent_reports_of_one_message_agree(store: StateStore) -> None:
    counts = await asyncio.gather(
        *(store.bot_turn(ROOM, is_bot=True, message_key="m1") for _ in range(10))
    )
    assert set(counts) == {1}
    assert await store.bot_turn(ROOM, is_bot=True) == 2


async def test_issue12_peeking_at_bot_turns_reads_the_count_and_changes_nothing(
    store: StateStore, restart: Restart
) -> None:
    assert await store.bot_turns_peek(ROOM) == 0
    for _ in range(3):
        await store.bot_turn(ROOM, is_bot=True)
    assert [await store.bot_turns_peek(ROOM) for _ in range(3)] == [3, 3, 3]
    assert await store.bot_turns_peek(OTHER_ROOM) == 0
    assert await store.bot_turn(ROOM, is_bot=True) == 4
    another = await restart()  # a replica on the same data (memory has no shared data)
    assert await another.bot_turns_peek(ROOM) == (0 if isinstance(store, MemoryStateStore) else 4)
    await store.bot_turn(ROOM, is_bot=False)
    assert await store.bot_turns_peek(ROOM) == 0


async def test_issue23_a_cursor_is_saved_replaced_and_read_after_a_restart(
    store: StateStore, restart: Restart
) -> None:
    assert await store.cursor_get("matrix:mx") is None
    await store.cursor_set("matrix:mx", "s1_2_3")
    await store.cursor_set("matrix:mx", '{"since": "s9", "first_sync_ms": 5}')
    await store.cursor_set("matrix:other", "x")
    assert await store.cursor_get("matrix:mx") == '{"since": "s9", "first_sync_ms": 5}'
    another = await restart()  # memory keeps nothing across a restart
    expected = None if isinstance(store, MemoryStateStore) else "x"
    assert await another.cursor_get("matrix:other") == expected


# Claims (dedupe receipts, admin commands, cooldown notices)


async def test_a_claim_is_won_once_until_its_ttl_runs_out(store: StateStore, clock: Clock) -> None:
    assert await store.claim("dedupe:discord:1", 60.0)
    assert not await store.claim("dedupe:discord:1", 60.0)
    assert await store.claim("dedupe:discord:2", 60.0)
    clock.advance(59.999)
    assert not await store.claim("dedupe:discord:1", 60.0)
    clock.advance(0.001)
    assert await store.claim("dedupe:discord:1", 60.0)
    assert not await store.claim("dedupe:discord:1", 60.0)


async def test_concurrent_claims_have_one_winner(store: StateStore) -> None:
    won = await asyncio.gather(*(store.claim("admin:room:lobby:7", 600.0) for _ in range(20)))
    assert sorted(won) == [False] * 19 + [True]


async def test_expired_claims_do_not_hold_others(store: StateStore, clock: Clock) -> None:
    for n in range(20):
        assert await store.claim(f"notice:{n}", 1.0)
    clock.advance(2.0)
    assert all([await store.claim(f"notice:{n}", 1.0) for n in range(20)])


# Dedupe receipts

RECEIPT = "dedupe:telegram:parrot-tg:update:7001"


async def test_issue9_a_receipt_refuses_duplicates_in_flight_and_after_the_answer(
    store: StateStore, clock: Clock
) -> None:
    assert await store.receive(RECEIPT, 60.0)
    assert not await store.receive(RECEIPT, 60.0)
    assert await store.receive(RECEIPT + "1", 60.0)
    clock.advance(50.0)
    await store.confirm(RECEIPT, 60.0)
    clock.advance(59.999)
    assert not await store.receive(RECEIPT, 60.0)
    clock.advance(0.001)
    assert await store.receive(RECEIPT, 60.0)


async def test_issue9_concurrent_deliveries_of_one_message_have_one_receiver(
    store: StateStore,
) -> None:
    taken = await asyncio.gather(*(store.receive(RECEIPT, 600.0) for _ in range(20)))
    assert sorted(taken) == [False] * 19 + [True]


async def test_issue9_a_restarted_store_answers_what_a_killed_run_left_in_flight(
    store: StateStore, restart: Restart, clock: Clock
) -> None:
    assert await store.receive(RECEIPT, 600.0)
    await store.receive(RECEIPT + ":answered", 600.0)
    await store.confirm(RECEIPT + ":answered", 600.0)
    # The first run is killed mid-turn: no confirm, no close. A killed redis replica's
    # liveness key lapses on its own; the other backends need no time to pass.
    clock.advance(OWNER_SECONDS)
    restarted = await restart()
    assert await restarted.receive(RECEIPT, 600.0)
    assert not await restarted.receive(RECEIPT, 600.0)
    await restarted.confirm(RECEIPT, 600.0)
    assert not await restarted.receive(RECEIPT, 600.0)


async def test_issue9_a_restarted_store_refuses_what_was_answered_before(
    store: StateStore, restart: Restart
) -> None:
    if isinstance(store, MemoryStateStore):
        pytest.skip("a memory store keeps nothing across a restart")
    assert await store.receive(RECEIPT, 600.0)
    await store.confirm(RECEIPT, 600.0)
    restarted = await restart()
    assert not await restarted.receive(RECEIPT, 600.0)


# Overrides


async def test_overrides_are_set_read_and_cleared_per_scope(store: StateStore) -> None:
    assert await store.get_overrides(ROOM) == {}
    await store.set_override(ROOM, "bot_loop.max_events_per_window", 6)
    await store.set_override(ROOM, "bot_loop.enabled", False)
    await store.set_override(ROOM, "silence.tokens", ["NO_REPLY", "[SILENT]"])
    await store.set_override(ROOM, "respond_to.bots", "mentions")
    await store.set_override("*", "bot_loop.window_seconds", 12.5)
    await store.set_override(ROOM, "bot_loop.max_events_per_window", 7)
    assert await store.get_overrides(ROOM) == {
        "bot_loop.max_events_per_window": 7,
        "bot_loop.enabled": False,
        "silence.tokens": ["NO_REPLY", "[SILENT]"],
        "respond_to.bots": "mentions",
    }
    assert await store.get_overrides("*") == {"bot_loop.window_seconds": 12.5}
    await store.clear_overrides(ROOM)
    assert await store.get_overrides(ROOM) == {}
    assert await store.get_overrides("*") == {"bot_loop.window_seconds": 12.5}


async def test_the_overrides_returned_are_a_copy(store: StateStore) -> None:
    await store.set_override(ROOM, "bot_loop.max_events_per_window", 6)
    got = await store.get_overrides(ROOM)
    assert isinstance(got, dict)
    got["bot_loop.max_events_per_window"] = 99
    assert await store.get_overrides(ROOM) == {"bot_loop.max_events_per_window": 6}


# Pauses


async def test_a_timed_pause_runs_out(store: StateStore, clock: Clock) -> None:
    assert await store.pause_remaining(ROOM) is None
    await store.pause(ROOM, 600.0)
    clock.advance(100)
    assert await store.pause_remaining(ROOM) == pytest.approx(500.0)
    assert await store.pause_remaining(OTHER_ROOM) is None
    clock.advance(500)
    assert await store.pause_remaining(ROOM) is None


async def test_an_indefinite_pause_lasts_until_resumed(store: StateStore, clock: Clock) -> None:
    await store.pause(ROOM, None)
    clock.advance(86_400 * 30)
    assert await store.pause_remaining(ROOM) == math.inf
    await store.resume(ROOM)
    assert await store.pause_remaining(ROOM) is None
    await store.resume(ROOM)


async def test_a_new_pause_replaces_the_old_one(store: StateStore, clock: Clock) -> None:
    await store.pause(ROOM, None)
    await store.pause(ROOM, 60.0)
    clock.advance(30)
    assert await store.pause_remaining(ROOM) == pytest.approx(30.0)
    await store.pause(ROOM, None)
    clock.advance(60)
    assert await store.pause_remaining(ROOM) == math.inf


# Audit


async def test_the_audit_log_is_newest_first_with_a_limit_and_a_room_filter(
    store: StateStore,
) -> None:
    for n in range(1, 8):
        await store.audit(entry(n, ROOM if n % 3 else OTHER_ROOM))
    assert await store.recent_audit(3) == [entry(7), entry(6, OTHER_ROOM), entry(5)]
    assert await store.recent_audit(20, scope=OTHER_ROOM) == [
        entry(6, OTHER_ROOM),
        entry(3, OTHER_ROOM),
    ]
    assert [e.at for e in await store.recent_audit()] == [7.0, 6.0, 5.0, 4.0, 3.0, 2.0, 1.0]
    assert await store.recent_audit(5, scope="room:none") == []


def attempt(n: int, who: str, *, room: str = ROOM) -> AuditEntry:
    """The n-th refused attempt of a test, by the non-admin `who`."""
    return AuditEntry(float(n), "discord", room, who, who.title(), "/loop reset", False, "refused")


async def test_issue20_a_thousand_refused_attempts_leave_every_admin_action(
    store: StateStore,
) -> None:
    done = AuditEntry(1.0, "discord", ROOM, "admin-1", "Ann", "/loop pause", True, "done")
    await store.audit(done)
    for n in range(2, 1_052):
        await store.audit(attempt(n, "mallory"))
    assert await store.recent_audit(20, kind="admin") == [done]
    kept = await store.recent_audit(1_000, kind="others")
    # Bounded per sender: mallory's newest OTHERS_PER_SENDER, newest first.
    assert [e.at for e in kept] == [float(n) for n in range(1_051, 1_051 - 50, -1)]
    assert {e.kind for e in kept} == {"others"}
    assert (await store.recent_audit(100))[-1] == done


async def test_issue20_the_others_log_is_bounded_per_sender_and_overall(
    store: StateStore, restart: Restart, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(audit, "OTHERS_KEEP", 5)
    monkeypatch.setattr(audit, "OTHERS_PER_SENDER", 2)
    for n, who in enumerate(["ann", "bob", "ann", "ann"], start=1):
        await store.audit(attempt(n, who))
    # ann's third attempt dropped her first, not bob's.
    assert await store.recent_audit(10, kind="others") == [
        attempt(4, "ann"),
        attempt(3, "ann"),
        attempt(2, "bob"),
    ]
    for n, who in enumerate(["cy", "cy", "dee"], start=5):
        await store.audit(attempt(n, who))
    # Six held, five kept: the oldest of all (bob's) went.
    assert [(e.at, e.user_id) for e in await store.recent_audit(10, kind="others")] == [
        (7.0, "dee"),
        (6.0, "cy"),
        (5.0, "cy"),
        (4.0, "ann"),
        (3.0, "ann"),
    ]
    held = await restart() if not isinstance(store, MemoryStateStore) else store
    await held.audit(attempt(8, "ann"))
    assert [(e.at, e.user_id) for e in await held.recent_audit(10, kind="others")] == [
        (8.0, "ann"),
        (7.0, "dee"),
        (6.0, "cy"),
        (5.0, "cy"),
        (4.0, "ann"),
    ]
    assert await held.recent_audit(10, kind="admin") == []


async def test_issue20_each_log_reads_back_its_own_kind_and_both_merge_by_time(
    store: StateStore,
) -> None:
    # A person's own `/new` in a DM is allowed, but not an admin's act.
    own_forget = AuditEntry(
        2.0, "discord", "discord:dm", "u9", "Uma", "/new", True, "done", kind="others"
    )
    await store.audit(entry(1))
    await store.audit(own_forget)
    for n in range(3, 7):
        await store.audit(entry(n))
    assert [e.at for e in await store.recent_audit(kind="admin")] == [6.0, 4.0]
    assert await store.recent_audit(kind="others") == [entry(5), entry(3), own_forget, entry(1)]
    assert [e.at for e in await store.recent_audit(4)] == [6.0, 5.0, 4.0, 3.0]
    assert [e.kind for e in await store.recent_audit(20, scope=ROOM)] == [
        "admin",
        "others",
        "admin",
        "others",
        "others",
    ]


# Policy changes mid-window (`/loop set`): the pair keeps its events (issue 10)


def budget(events: int, window: float = 60.0, cooldown: float = 30.0) -> BotLoopPolicy:
    """A pair budget of `events` per `window` seconds, cooling down for `cooldown`."""
    return BotLoopPolicy(
        max_events_per_window=events, window_seconds=window, cooldown_seconds=cooldown
    )


def outcomes(decisions: list[PairDecision]) -> list[tuple[str, int]]:
    """(reason, count) of each decision."""
    return [(d.reason, d.count) for d in decisions]


async def test_issue10_a_lower_budget_mid_window_counts_the_events_already_in_it(
    store: StateStore, clock: Clock
) -> None:
    decisions = []
    for policy in [budget(10)] * 5 + [budget(6)] * 3:
        decisions.append(await decide(store, policy=policy))
        clock.advance(1)
    assert outcomes(decisions) == [("ok", n) for n in range(1, 7)] + [
        ("budget_exceeded", 6),
        ("cooldown", 6),
    ]
    # The cooldown opened at the seventh event (t + 6 s) and is announced once.
    assert [d.reason for d in decisions].count("budget_exceeded") == 1
    assert decisions[-1].retry_after == pytest.approx(29.0)


async def test_issue10_a_higher_budget_mid_window_admits_up_to_it_but_ends_no_cooldown(
    store: StateStore, clock: Clock
) -> None:
    decisions = [await decide(store, policy=budget(3)) for _ in range(3)]
    decisions += [await decide(store, policy=budget(5)) for _ in range(3)]
    clock.advance(10)
    decisions.append(await decide(store, policy=budget(50)))
    assert outcomes(decisions) == [("ok", n) for n in range(1, 6)] + [
        ("budget_exceeded", 5),
        ("cooldown", 5),
    ]
    assert decisions[-1].retry_after == pytest.approx(20.0)


async def test_issue10_a_shorter_window_drops_the_events_that_left_it(
    store: StateStore, clock: Clock
) -> None:
    start = clock.now
    for offset in (0.0, 10.0, 20.0):
        clock.now = start + offset
        assert (await decide(store, policy=budget(3, window=30.0))).allowed
    clock.now = start + 25.0
    # Under a 10 s window the events at 0 s and 10 s have left it; the one at 20 s counts.
    shorter = budget(3, window=10.0)
    decisions = [await decide(store, policy=shorter) for _ in range(3)]
    assert outcomes(decisions) == [("ok", 2), ("ok", 3), ("budget_exceeded", 3)]


async def test_issue10_a_longer_window_keeps_counting_the_events_held(
    store: StateStore, clock: Clock
) -> None:
    start = clock.now
    for offset in (0.0, 5.0):
        clock.now = start + offset
        assert (await decide(store, policy=budget(3, window=10.0))).allowed
    longer = budget(3, window=60.0)
    clock.now = start + 8.0
    assert outcomes([await decide(store, policy=longer)]) == [("ok", 3)]
    # At 12 s the first event would have left a 10 s window; it counts in the 60 s one.
    clock.now = start + 12.0
    assert outcomes([await decide(store, policy=longer)]) == [("budget_exceeded", 3)]
    assert [(s.count, s.cooldown_remaining) for s in await store.pair_snapshot()] == [(3, 30.0)]


async def test_issue10_a_cooldown_changed_during_a_cooldown_keeps_its_end(
    store: StateStore, clock: Clock
) -> None:
    for _ in range(2):
        await decide(store, policy=budget(2, cooldown=20.0))
    opened = clock.now
    over = await decide(store, policy=budget(2, cooldown=20.0))
    assert (over.reason, over.retry_after) == ("budget_exceeded", 20.0)
    clock.now = opened + 5.0
    longer = await decide(store, policy=budget(2, cooldown=100.0))
    assert longer.reason == "cooldown"
    assert longer.retry_after == pytest.approx(15.0)
    clock.now = opened + 10.0
    shorter = await decide(store, policy=budget(2, cooldown=5.0))
    assert shorter.reason == "cooldown"
    assert shorter.retry_after == pytest.approx(10.0)
    clock.now = opened + 20.0
    assert outcomes([await decide(store, policy=budget(2, cooldown=5.0))]) == [("ok", 1)]


async def test_issue10_exact_boundaries_after_a_policy_change(
    store: StateStore, clock: Clock
) -> None:
    start = clock.now
    assert (await decide(store, policy=budget(2, window=30.0, cooldown=20.0))).allowed
    tight = budget(2, window=10.0, cooldown=5.0)
    # An event at t + window: the event at t has just left the (new) window.
    clock.now = start + 10.0
    decisions = [await decide(store, policy=tight) for _ in range(3)]
    assert outcomes(decisions) == [("ok", 1), ("ok", 2), ("budget_exceeded", 2)]
    assert decisions[-1].retry_after == 5.0
    clock.now = start + 15.0 - 0.001
    assert (await decide(store, policy=tight)).reason == "cooldown"
    # A cooldown ending at exactly now: the pair is idle, and starts a fresh window.
    clock.now = start + 15.0
    assert await store.pair_snapshot() == []
    assert outcomes([await decide(store, policy=tight)]) == [("ok", 1)]


async def test_issue10_reset_by_room_and_by_bot_during_a_cooldown(store: StateStore) -> None:
    first, second = budget(2), budget(5)
    for _ in range(3):
        await decide(store, policy=first)
    # The cooldown holds under another policy and through a reset elsewhere.
    assert await store.pair_reset(scope=OTHER_ROOM) == 0
    assert (await decide(store, policy=second)).reason == "cooldown"
    assert await store.pair_reset(scope=ROOM) == 1
    assert outcomes([await decide(store, policy=second)]) == [("ok", 1)]
    for _ in range(5):
        await decide(store, policy=second)
    assert (await decide(store, policy=first)).reason == "cooldown"
    assert await store.pair_reset(bot_id="bot-c") == 0
    assert (await decide(store, policy=second)).reason == "cooldown"
    assert await store.pair_reset(bot_id="bot-b") == 1
    assert outcomes([await decide(store, policy=first)]) == [("ok", 1)]


async def test_issue10_64_concurrent_decisions_on_one_pair_hold_the_budget_exactly(
    store: StateStore,
) -> None:
    # Two policies with one budget, as while a `/loop set` of the window reaches replicas.
    policies = (budget(10, window=60.0), budget(10, window=45.0))
    decisions = await asyncio.gather(*(decide(store, policy=policies[n % 2]) for n in range(64)))
    reasons = [d.reason for d in decisions]
    assert (reasons.count("ok"), reasons.count("budget_exceeded"), reasons.count("cooldown")) == (
        10,
        1,
        53,
    )
    assert sorted(d.count for d in decisions if d.allowed) == list(range(1, 11))


async def test_issue10_the_snapshot_lists_a_pair_once_after_a_policy_change(
    store: StateStore,
) -> None:
    for policy in (POLICY, POLICY, budget(6)):
        await decide(store, policy=policy)
    assert await store.pair_snapshot() == [
        PairSnapshot(ROOM, "bot-a", "bot-b", count=3, cooldown_remaining=0.0)
    ]


async def test_issue10_huge_durations_are_decided_not_failed(
    store: StateStore, clock: Clock
) -> None:
    forever = budget(1, window=1e308, cooldown=1e308)
    decisions = [await decide(store, policy=forever) for _ in range(2)]
    clock.advance(86_400 * 365 * 1000)
    decisions.append(await decide(store, policy=forever))
    assert outcomes(decisions) == [("ok", 1), ("budget_exceeded", 1), ("cooldown", 1)]
    assert decisions[1].retry_after == 1e308
    assert [s.count for s in await store.pair_snapshot()] == [1]


async def test_issue10_names_with_separators_and_patterns_are_kept_apart(
    store: StateStore,
) -> None:
    names = ("bot\x1f", "bot\x1fb", "bot%1F", "bot%25", "b[o]t*", "b{o}t", "bоt")  # о: Cyrillic
    room = "slack:C1\x1fbot\x1f%"
    for name in names:
        await decide(store, name, "bot", scope=room)
    await decide(store, "bot\x1f", "bot", scope=room)
    snapshot = await store.pair_snapshot(room)
    assert sorted((s.scope, s.bot_a, s.bot_b, s.count) for s in snapshot) == sorted(
        (room, *pair_key(name, "bot"), 2 if name == "bot\x1f" else 1) for name in names
    )
    assert await store.pair_snapshot("slack:C1") == []
    assert await store.pair_reset(bot_id="bot%1F") == 1
    assert await store.pair_reset(scope=room) == len(names) - 1
    assert await store.pair_snapshot() == []


# The reference: `step_pair`, event by event, through policy changes (issue 10)

Event = tuple[int, int, float, int]
"""(pair index, room index, seconds since the previous event, policy index)."""

PAIRS = (("bot-a", "bot-b"), ("bot-b", "bot-a"), ("bot-a", "bot-c"))
# 0.1 and 2.7 have no exact binary form: every backend must still keep times exactly.
STEPS = (0.0, 0.1, 0.5, 1.0, 2.7, 4.0, 10.0, 19.5, 20.0, 30.0, 61.0)
events = st.lists(
    st.tuples(
        st.integers(0, len(PAIRS) - 1),
        st.integers(0, 1),
        st.sampled_from(STEPS),
        st.integers(0, 2),
    ),
    max_size=60,
)
policies = st.builds(
    BotLoopPolicy,
    enabled=st.sampled_from((True, True, True, False)),
    max_events_per_window=st.integers(1, 4),
    window_seconds=st.sampled_from((10.0, 30.0, 45.5)),
    cooldown_seconds=st.sampled_from((0.0, 5.0, 20.0)),
)


async def _replay(
    store: StateStore, clock: Clock, chosen: list[BotLoopPolicy], trace: list[Event]
) -> None:
    """Run the trace through `store` and through `step_pair`, comparing every answer."""
    records: dict[tuple[str, str, str], PairRecord] = {}
    await store.start()
    try:
        for pair, room, step, which in trace:
            clock.advance(step)
            me, sender = PAIRS[pair]
            scope = (ROOM, OTHER_ROOM)[room]
            policy = chosen[which % len(chosen)]
            key = (scope, *pair_key(me, sender))
            record, want = step_pair(records.get(key), policy, clock.now)
            if record is not None:
                records[key] = record
            assert await decide(store, me, sender, scope=scope, policy=policy) == want
        views = ((key, pair_view(record, clock.now)) for key, record in records.items())
        want_pairs = sorted((*key, *view) for key, view in views if view is not None)
        got_pairs = sorted(
            (s.scope, s.bot_a, s.bot_b, s.count, s.cooldown_remaining)
            for s in await store.pair_snapshot()
        )
        assert got_pairs == want_pairs
    finally:
        await store.aclose()


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chosen=st.lists(policies, min_size=1, max_size=3), trace=events)
def test_issue10_every_backend_steps_like_step_pair_through_policy_changes(
    backend: str, chosen: list[BotLoopPolicy], trace: list[Event], request: pytest.FixtureRequest
) -> None:
    url = backend_url(request, backend)
    clock = Clock()
    with tempfile.TemporaryDirectory() as workdir:
        store = build_store(backend, clock, workdir=Path(workdir), redis_url=url)
        asyncio.run(_replay(store, clock, chosen, trace))


# Transcripts (issue 11, DESIGN.md §3)

THREAD = transcripts.scope(ROOM, "t1")
DAY = 86_400.0


def said(key: str, text: str = "", sender: str = "U1", name: str = "ann") -> TranscriptEntry:
    """A transcript entry; its text defaults to its key."""
    return TranscriptEntry(key, sender, name, text or key)


async def append(
    store: StateStore, entry: TranscriptEntry, scope: str = ROOM, *, keep: int = 200
) -> bool:
    """Append under the default bounds (`keep` messages, a day's ttl)."""
    return await store.transcript_append(scope, entry, max_messages=keep, ttl=DAY)


async def texts(store: StateStore, scope: str = ROOM, limit: int = 50) -> list[str]:
    """The texts a read of the transcript answers, oldest first."""
    return [entry.text for entry in (await store.transcript_recent(scope, limit)).entries]


async def test_issue11_a_transcript_reads_its_newest_entries_oldest_first(
    store: StateStore,
) -> None:
    for key in ("m1", "m2", "m3"):
        assert await append(store, said(key))
    assert await texts(store, limit=2) == ["m2", "m3"]
    got = await store.transcript_recent(ROOM, 10)
    assert got == Transcript((said("m1"), said("m2"), said("m3")), skipped=0)
    assert await texts(store, OTHER_ROOM) == []
    assert await texts(store, limit=0) == []


async def test_issue11_a_transcript_keeps_its_newest_max_messages(store: StateStore) -> None:
    for index in range(7):
        await append(store, said(f"m{index}"), keep=3)
    assert await texts(store) == ["m4", "m5", "m6"]
    # A trimmed message's key is free again; a held one is not.
    assert await append(store, said("m0"), keep=3)
    assert not await append(store, said("m6"), keep=3)
    assert await texts(store) == ["m5", "m6", "m0"]


async def test_issue11_a_redelivered_message_is_appended_once(store: StateStore) -> None:
    assert await append(store, said("discord:1100:42", "hello"))
    assert not await append(store, said("discord:1100:42", "hello"))
    assert not await append(store, said("discord:1100:42", "edited"))
    results = await asyncio.gather(*(append(store, said("discord:1100:43")) for _ in range(8)))
    assert sorted(results) == [False] * 7 + [True]
    assert await texts(store) == ["hello", "discord:1100:43"]


async def test_issue11_a_transcript_is_forgotten_ttl_after_its_last_message(
    store: StateStore, clock: Clock
) -> None:
    await store.transcript_append(ROOM, said("m1"), max_messages=10, ttl=60.0)
    clock.advance(50.0)
    await store.transcript_append(ROOM, said("m2"), max_messages=10, ttl=60.0)
    clock.advance(50.0)
    assert await texts(store) == ["m1", "m2"]
    clock.advance(10.0)
    assert await texts(store) == []
    # A message after the expiry starts a fresh transcript, its old keys gone too.
    assert await store.transcript_append(ROOM, said("m1"), max_messages=10, ttl=60.0)
    assert await texts(store) == ["m1"]


async def test_issue11_threads_have_transcripts_of_their_own_and_forget_goes_by_scope(
    store: StateStore,
) -> None:
    await append(store, said("room-1"))
    await append(store, said("thread-1"), THREAD)
    await append(store, said("thread-2"), transcripts.scope(ROOM, "t2"))
    await append(store, said("elsewhere"), OTHER_ROOM)
    await append(store, said("room-1"), THREAD)  # the same key in another scope is its own
    assert await texts(store) == ["room-1"]
    assert await texts(store, THREAD) == ["thread-1", "room-1"]
    assert await store.transcript_forget(THREAD) == 2
    assert await texts(store, THREAD) == []
    assert await texts(store) == ["room-1"]
    assert await store.transcript_forget(ROOM, threads=True) == 2
    assert await texts(store) == []
    assert await texts(store, transcripts.scope(ROOM, "t2")) == []
    assert await texts(store, OTHER_ROOM) == ["elsewhere"]
    assert await store.transcript_forget(ROOM) == 0
    assert await append(store, said("room-1"))  # forgotten keys are free again


async def test_issue11_a_transcript_survives_a_restart_except_in_memory(
    store: StateStore, restart: Restart
) -> None:
    await append(store, said("m1"))
    await append(store, said("m2"), THREAD)
    again = await restart()
    if isinstance(store, MemoryStateStore):
        assert await texts(again) == []
        return
    assert await texts(again) == ["m1"]
    assert await texts(again, THREAD) == ["m2"]
    assert not await append(again, said("m1"))


async def test_issue11_huge_texts_and_lone_surrogates_are_stored_bounded(
    store: StateStore,
) -> None:
    huge = "x" * 1_000_000
    assert await append(store, said("big", huge, name="n" * 10_000))
    assert await append(store, said("odd\ud800", "half \ud83d a pair", name="bad\udfff"))
    assert await append(store, said("ok", "emoji 😀 and ünïcode"))
    big, odd, ok = (await store.transcript_recent(ROOM, 10)).entries
    assert big.text == "x" * transcripts.MAX_TEXT_CHARS
    assert big.sender_name == "n" * transcripts.MAX_NAME_CHARS
    assert (odd.key, odd.text, odd.sender_name) == ("odd\ufffd", "half \ufffd a pair", "bad\ufffd")
    assert ok.text == "emoji 😀 and ünïcode"


_UNREADABLE = (
    b"\xff\xfe not UTF-8",
    b"not JSON",
    b'{"k": 1, "t": ["wrong"]}',
    b"[" * 100_000,
    b"42",
    # Valid UTF-8 and JSON, but not what `transcripts.encode` writes (ASCII only).
    '{"k":"x","id":"U","n":"é","t":"é"}'.encode(),
)


async def _corrupt(store: StateStore, request: pytest.FixtureRequest) -> None:
    """Write the `_UNREADABLE` records straight into ROOM's transcript, as its own rows."""
    if isinstance(store, SqliteStateStore):
        with sqlite3.connect(store.path) as db:
            for index, record in enumerate(_UNREADABLE):
                # As TEXT, even where it is not UTF-8, and once more as a BLOB.
                db.execute(
                    "INSERT INTO transcript (scope, key, entry) VALUES (?, ?, CAST(? AS TEXT))",
                    (ROOM, f"text{index}", record),
                )
            db.execute(
                "INSERT INTO transcript (scope, key, entry) VALUES (?, 'blob', ?), (?, 'int', 7)",
                (ROOM, b"\xff", ROOM),
            )
        return
    assert isinstance(store, RedisStateStore)
    # The store's own key for ROOM's transcript, through its own client (a cluster's too).
    await store._link.client.rpush(
        f"{store._prefix}transcript:{{{ROOM}}}", *_UNREADABLE, b"\xff", b"7"
    )


async def test_issue11_unreadable_transcript_records_are_skipped_and_counted(
    store: StateStore, request: pytest.FixtureRequest
) -> None:
    if isinstance(store, MemoryStateStore):
        pytest.skip("the memory backend holds entries, not records that can be corrupted")
    await append(store, said("before"))
    await _corrupt(store, request)
    await append(store, said("after"))
    got = await store.transcript_recent(ROOM, 50)
    assert [entry.text for entry in got.entries] == ["before", "after"]
    assert got.skipped == len(_UNREADABLE) + 2
    # The limit counts the records read: of the newest two, one is unreadable.
    newest = await store.transcript_recent(ROOM, 2)
    assert ([entry.text for entry in newest.entries], newest.skipped) == (["after"], 1)
    # Trimming past unreadable records works too.
    for index in range(3):
        await append(store, said(f"later{index}"), keep=3)
    assert await store.transcript_recent(ROOM, 50) == Transcript(
        (said("later0"), said("later1"), said("later2"))
    )


@pytest.mark.redis
async def test_issue11_a_foreign_key_at_a_transcript_is_skipped_not_fatal(
    redis_url: str, clock: Clock
) -> None:
    store = RedisStateStore(redis_url, key_prefix="foreign11:", clock=clock)
    await store.start()
    client = Redis.from_url(redis_url)
    try:
        await client.set(f"foreign11:transcript:{{{ROOM}}}", "someone else's")
        await client.hset(f"foreign11:transcript:{{{OTHER_ROOM}}}:until", "a", "b")
        for scope in (ROOM, OTHER_ROOM):
            assert not await append(store, said("m1"), scope)
            assert await store.transcript_recent(scope, 10) == Transcript(skipped=1)
        assert await client.get(f"foreign11:transcript:{{{ROOM}}}") == b"someone else's"
        assert await store.transcript_forget(ROOM) == 0
        assert await append(store, said("m1"))  # once the key is gone, the room is recorded
        assert await texts(store) == ["m1"]
    finally:
        await client.aclose()
        await store.aclose()
