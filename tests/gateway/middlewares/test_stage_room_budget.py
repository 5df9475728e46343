"""The room budget in the bot-loop stage (issue 20): a ring of bots is cut like a pair."""

from __future__ import annotations

import logging
import re

import pytest

from gateway.app.context import TurnContext
from gateway.app.types import AgentResult
from gateway.state.base import StateStore
from gateway.state.memory import MemoryStateStore
from tests.fakes.inmemory import FakeClock, InMemoryRoom, PipelineRig, rig_config
from tests.gateway.middlewares.stage_rig import notices, pongs

RING = ("parrot", "echo", "robin")
ROOM = "room:C1"


class RingAgent:
    """Answers its predecessor in the ring (the first bot also answers people); else silent."""

    def __init__(self, after: str, *, starts: bool = False) -> None:
        self.after = after
        self.starts = starts

    async def respond(self, turn: TurnContext) -> AgentResult:
        """`pong` to the predecessor (or a person, for the starter), None to anyone else."""
        msg = turn.message
        if msg.sender_name == self.after or (self.starts and not msg.sender_is_bot):
            return AgentResult("pong")
        return AgentResult(None)

    async def aclose(self) -> None:
        """Nothing to close."""


def ring_agents(bots: tuple[str, ...]) -> dict[str, RingAgent]:
    """A→B→C→A: each bot answers the one before it."""
    return {bot: RingAgent(bots[i - 1], starts=i == 0) for i, bot in enumerate(bots)}


async def ring_room(
    backend: tuple[StateStore, FakeClock],
    yaml_text: str = "",
    *,
    bots: tuple[str, ...] = RING,
    pace: float = 3.0,
) -> tuple[PipelineRig, InMemoryRoom]:
    """A room of `bots` answering each other in a ring, one message every `pace` seconds."""
    store, clock = backend
    config = rig_config(yaml_text, bots=bots)
    rig = PipelineRig(config, ring_agents(bots), state=store, clock=clock)
    await rig.start()
    return rig, InMemoryRoom(rig, step=pace)


async def test_issue20_three_bot_ring_is_cut_like_a_pair(
    backend: tuple[StateStore, FakeClock],
) -> None:
    rig, room = await ring_room(backend)
    await room.post("hi bots")
    await room.run()
    # Every pair sees two thirds of the traffic (13 a minute at 3 s a message), under its
    # budget of 20 a minute, and the bot-turn cap (30) would wait for the 31st message:
    # the room budget refuses the 21st bot message, as the pair budget does a ping-pong's.
    assert pongs(room) == 21
    [notice] = notices(room)
    assert re.fullmatch(
        r"Loop guard: pausing replies to bots in this room for 1 min 30 s \(20 bot messages in "
        r"1 min 30 s from (parrot|echo|robin), (parrot|echo|robin) and (parrot|echo|robin)\)\. "
        r"An admin can /loop reset\.",
        notice,
    )
    assert {name for name in RING if name in notice} == set(RING)
    metrics = rig.metrics
    assert metrics.value("refusals_total", stage="bot_loop", reason="room_budget_exceeded") == 1
    assert metrics.value("refusals_total", stage="bot_loop", reason="budget_exceeded") == 0
    assert metrics.value("refusals_total", stage="bot_loop", reason="bot_turn_cap") == 0
    assert (
        metrics.value(
            "guard_decisions_total", guard="bot_loop", code="room_budget_exceeded", shadow="false"
        )
        == 1
    )


async def test_issue20_a_ping_pong_at_the_same_pace_is_cut_at_the_same_message(
    backend: tuple[StateStore, FakeClock],
) -> None:
    _, ring = await ring_room(backend, pace=2.0)
    await ring.post("hi bots")
    await ring.run()
    store, clock = backend
    clock.advance(3600)  # both budgets idle again: the same store serves the ping-pong
    _, pair = await ring_room(backend, bots=("parrot", "echo"), pace=2.0)
    await pair.post("hi bots")
    await pair.run()
    # The pair budget cuts the ping-pong at its 21st bot message, the room budget the ring.
    assert pongs(ring) == pongs(pair) == 21
    assert ["between" in text for text in notices(pair)] == [True]
    assert ["to bots in this room" in text for text in notices(ring)] == [True]


async def test_issue20_the_room_cooldown_ends_and_a_new_ring_gets_a_new_notice(
    backend: tuple[StateStore, FakeClock],
) -> None:
    rig, room = await ring_room(backend)
    await room.post("hi bots")
    await room.run()
    rig.clock.advance(91)
    await room.post("hi again")
    await room.run()
    assert pongs(room) == 42
    assert len(notices(room)) == 2


async def test_issue20_a_busy_room_of_bots_and_people_is_not_cut(
    backend: tuple[StateStore, FakeClock],
) -> None:
    # Every bot answers every person (and stays silent to bots): a human message every
    # 15 s for ten minutes is 120 bot messages, 12 a minute, in bursts of three.
    store, clock = backend
    config = rig_config("policy: {bot_loop: {max_consecutive_bot_turns: 0}}", bots=RING)
    rig = PipelineRig(
        config, {bot: RingAgent("nobody", starts=True) for bot in RING}, state=store, clock=clock
    )
    await rig.start()
    room = InMemoryRoom(rig, step=1.0)
    for _ in range(40):
        await room.post("question")
        await room.run()
        clock.advance(12)
    assert pongs(room) == 120
    assert notices(room) == []


async def test_issue20_shadow_decides_like_enforce_posts_nothing_and_counts_shadow(
    backend: tuple[StateStore, FakeClock], caplog: pytest.LogCaptureFixture
) -> None:
    rig, room = await ring_room(backend, "policy: {bot_loop: {mode: shadow}}")
    with caplog.at_level(logging.INFO, logger="loopwarden.decision"):
        await room.post("hi bots")
        await room.run()
    # Nothing is cut until the bot-turn cap's shadow verdicts, which let everything on too.
    assert pongs(room) > 21
    assert notices(room) == []
    assert (
        rig.metrics.value(
            "guard_decisions_total", guard="bot_loop", code="room_budget_exceeded", shadow="true"
        )
        == 1
    )
    assert any("would have refused room_budget_exceeded" in r.getMessage() for r in caplog.records)
    assert rig.recent.shadowed(ROOM)["bot_loop"] >= 1


async def test_issue20_room_budget_zero_turns_it_off(
    backend: tuple[StateStore, FakeClock],
) -> None:
    rig, room = await ring_room(backend, "policy: {bot_loop: {room_max_events_per_window: 0}}")
    await room.post("hi bots")
    await room.run()
    # Only the bot-turn cap stops the ring now: its 31st bot message is refused.
    assert pongs(room) == 31
    assert rig.metrics.value("refusals_total", stage="bot_loop", reason="bot_turn_cap") >= 1


async def test_issue20_loop_set_of_the_room_budget_takes_effect_mid_ring(
    backend: tuple[StateStore, FakeClock],
) -> None:
    rig, room = await ring_room(backend)
    await room.post("hi bots")
    await room.run(max_posts=5)
    assert "room_max_events_per_window = 8" in await rig.admin.set(
        ROOM, "bot_loop.room_max_events_per_window", "8"
    )
    await room.run()
    # The five messages already in the window count against the new budget of eight.
    assert pongs(room) == 9
    assert len(notices(room)) == 1


async def test_issue20_reset_ends_the_room_cooldown(
    backend: tuple[StateStore, FakeClock],
) -> None:
    rig, room = await ring_room(backend)
    await room.post("hi bots")
    await room.run()
    await rig.admin.reset(ROOM)
    await room.post("hi again")
    await room.run()
    assert pongs(room) == 42
    assert len(notices(room)) == 2


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("bot_loop.room_max_events_per_window", "inf", "integer"),
        ("bot_loop.room_window_seconds", "inf", "finite"),
        ("bot_loop.room_window_seconds", ".inf", "finite"),
        ("bot_loop.room_window_seconds", "nan", "finite"),
        ("bot_loop.room_window_seconds", "1e308", "366 days"),
        ("bot_loop.room_max_events_per_window", "1e308", "integer"),
        ("bot_loop.room_max_events_per_window", "9" * 5_000, "longer than 500 characters"),
        ("bot_loop.room_max_events_per_window", "99999999999999999999999", "1000000"),
        ("bot_loop.room_max_events_per_window", "-1", "greater than or equal to 0"),
        ("bot_loop.room_window_seconds", "-5", "greater than 0"),
        ("bot_loop.room_window_seconds", "0", "greater than 0"),
        ("bot_loop.room_max_events_per_window", "2.5", "integer"),
        ("bot_loop.room_max_events_per_window", "２０", "look-alike"),
        ("bot_loop.room_window_seconds", "９０", "look-alike"),
        ("bot_loop.room_max_events_per_window", "twenty", "integer"),
    ],
)
async def test_issue20_loop_set_refuses_hostile_room_budgets_naming_the_field(
    field: str, value: str, reason: str
) -> None:
    clock = FakeClock()
    store = MemoryStateStore(clock=clock)
    rig, room = await ring_room((store, clock))
    answer = await rig.admin.set(ROOM, field, value)
    assert answer.startswith(f"Can't set {field}: ")
    assert reason in answer
    assert await store.get_overrides(ROOM) == {}
    await room.post("hi bots")
    await room.run()
    assert pongs(room) == 21  # the room budget still runs on its defaults
