"""The room budget on every backend (issue 20): each answer is `step_room`'s, the Lua's too.

Every backend is driven by an injected clock and compared event by event with the pure
step in guards/room_budget.py, on Hypothesis-generated traffic in two rooms with `/loop
set`-style policy changes between events and messages reported by several receivers.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.state.base import StateStore
from guards.bot_loop import BotLoopPolicy
from guards.room_budget import RoomDecision, RoomRecord, step_room
from tests.gateway.state.test_state_conformance import BACKENDS, Clock, backend_url, build_store

ROOM = "discord:1100"
OTHER_ROOM = "discord:2200"


def budget(events: int, window: float = 60.0, cooldown: float = 60.0) -> BotLoopPolicy:
    """A room budget of `events` per `window` seconds, cooling down for `cooldown`."""
    return BotLoopPolicy(
        cooldown_seconds=cooldown, room_max_events_per_window=events, room_window_seconds=window
    )


@pytest.fixture(params=BACKENDS)
async def store(
    request: pytest.FixtureRequest, clock: Clock, tmp_path: Path
) -> AsyncIterator[StateStore]:
    """A started store of each backend."""
    backend: str = request.param
    url = backend_url(request, backend)
    built = build_store(backend, clock, workdir=tmp_path, redis_url=url)
    await built.start()
    try:
        yield built
    finally:
        await built.aclose()


@pytest.fixture
def clock() -> Clock:
    """The time of the store under test."""
    return Clock()


async def decide(
    store: StateStore,
    bot: str,
    key: str | None,
    policy: BotLoopPolicy,
    scope: str = ROOM,
) -> RoomDecision:
    """One bot message in the room's budget."""
    return await store.room_decide(scope=scope, bot=bot, message_key=key, policy=policy)


async def test_issue20_every_backend_cuts_a_ring_once_and_names_its_bots(
    store: StateStore, clock: Clock
) -> None:
    policy = budget(3)
    answers = []
    for n, bot in enumerate(["A", "B", "C", "A", "B"]):
        answers.append(await decide(store, bot, f"m{n}", policy))
        answers.append(await decide(store, bot, f"m{n}", policy))  # a second receiver
        clock.advance(1)
    assert [(d.reason, d.count) for d in answers] == [
        ("ok", 1),
        ("ok", 1),
        ("ok", 2),
        ("ok", 2),
        ("ok", 3),
        ("ok", 3),
        ("room_budget_exceeded", 3),
        ("room_cooldown", 3),
        ("room_cooldown", 3),
        ("room_cooldown", 3),
    ]
    assert {d.bots for d in answers if not d.allowed} == {("A", "B", "C")}
    assert {d.until for d in answers if not d.allowed} == {answers[6].until}
    assert await store.room_reset(OTHER_ROOM) == 0
    assert await store.room_reset(ROOM) == 1
    assert (await decide(store, "A", "m9", policy)).reason == "ok"
    assert await store.room_reset() == 1


async def test_issue20_odd_names_and_keys_are_kept_exactly(store: StateStore) -> None:
    policy = budget(6)
    names = ["a b", "c\x1fd", "%1F", "é 中", '"quoted" \\ /', ""]
    for n, name in enumerate(names):
        assert (await decide(store, name, f"key {n}\x1f%", policy, scope="slack:C 1\x1f")).allowed
    over = await decide(store, "last", None, policy, scope="slack:C 1\x1f")
    assert over.bots == (*names, "last")


async def test_issue20_a_disabled_room_budget_keeps_nothing(store: StateStore) -> None:
    off = budget(0)
    assert [(await decide(store, "A", None, off)).reason for _ in range(5)] == ["disabled"] * 5
    assert await store.room_reset() == 0


async def test_issue20_huge_durations_are_decided_not_failed(
    store: StateStore, clock: Clock
) -> None:
    forever = budget(1, window=1e308, cooldown=1e308)
    decisions = [await decide(store, "A", f"m{n}", forever) for n in range(2)]
    clock.advance(86_400 * 365 * 1000)
    decisions.append(await decide(store, "A", "m3", forever))
    assert [d.reason for d in decisions] == ["ok", "room_budget_exceeded", "room_cooldown"]


async def test_issue20_concurrent_receivers_of_many_messages_hold_the_budget(
    store: StateStore,
) -> None:
    policy = budget(10)
    calls = [decide(store, f"bot{n % 3}", f"m{n}", policy) for n in range(30) for _ in range(2)]
    decisions = await asyncio.gather(*calls)
    admitted = {n // 2 for n, d in enumerate(decisions) if d.allowed}
    assert len(admitted) == 10
    assert sum(d.reason == "room_budget_exceeded" for d in decisions) == 1


# The reference: `step_room`, event by event, through policy changes

Event = tuple[int, int, int, float, int, int]
"""(bot, room, message, seconds since the previous event, policy index, receivers)."""

BOTS = ("bot-a", "bot b", "bot\x1fc")
STEPS = (0.0, 0.1, 0.5, 1.0, 2.7, 4.0, 10.0, 19.5, 20.0, 30.0, 61.0)
events = st.lists(
    st.tuples(
        st.integers(0, len(BOTS) - 1),
        st.integers(0, 1),
        st.integers(0, 30),
        st.sampled_from(STEPS),
        st.integers(0, 2),
        st.integers(1, 2),
    ),
    max_size=60,
)
policies = st.builds(
    BotLoopPolicy,
    enabled=st.sampled_from((True, True, True, False)),
    cooldown_seconds=st.sampled_from((0.0, 5.0, 20.0)),
    room_max_events_per_window=st.integers(0, 4),
    room_window_seconds=st.sampled_from((10.0, 30.0, 45.5)),
)


async def _replay(
    store: StateStore, clock: Clock, chosen: list[BotLoopPolicy], trace: list[Event]
) -> None:
    """Run the trace through `store` and through `step_room`, comparing every answer."""
    records: dict[str, RoomRecord] = {}
    await store.start()
    try:
        for bot, room, message, step, which, receivers in trace:
            clock.advance(step)
            scope = (ROOM, OTHER_ROOM)[room]
            policy = chosen[which % len(chosen)]
            # Message 0 has no key: it counts at every call.
            key = f"m{message}" if message else None
            for _ in range(receivers):
                record, want = step_room(
                    records.get(scope), policy, clock.now, bot=BOTS[bot], key=key or ""
                )
                if record is not None:
                    records[scope] = record
                got = await decide(store, BOTS[bot], key, policy, scope)
                assert (got, got.until) == (want, want.until)
    finally:
        await store.aclose()


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chosen=st.lists(policies, min_size=1, max_size=3), trace=events)
def test_issue20_every_backend_steps_like_step_room_through_policy_changes(
    backend: str, chosen: list[BotLoopPolicy], trace: list[Event], request: pytest.FixtureRequest
) -> None:
    url = backend_url(request, backend)
    clock = Clock()
    with tempfile.TemporaryDirectory() as workdir:
        store = build_store(backend, clock, workdir=Path(workdir), redis_url=url)
        asyncio.run(_replay(store, clock, chosen, trace))
