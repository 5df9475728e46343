"""Shadow mode of the bot-loop stage on every state backend, and the switch to enforce."""

from __future__ import annotations

import logging
import re

import pytest

from gateway.state.base import StateStore
from tests.fakes.inmemory import FakeClock, InMemoryRoom, PipelineRig, rig_config
from tests.gateway.middlewares.stage_rig import notices, pongs

SHADOW = "policy: {bot_loop: {mode: shadow, max_consecutive_bot_turns: 0}}"
ROOM = "room:C1"


async def shadow_room(
    backend: tuple[StateStore, FakeClock], yaml_text: str = SHADOW
) -> tuple[PipelineRig, InMemoryRoom]:
    store, clock = backend
    rig = PipelineRig(rig_config(yaml_text, bots=("parrot", "echo")), state=store, clock=clock)
    await rig.start()
    return rig, InMemoryRoom(rig)


async def test_issue13_shadow_decides_as_enforce_and_stops_nothing_on_every_backend(
    backend: tuple[StateStore, FakeClock], caplog: pytest.LogCaptureFixture
) -> None:
    rig, room = await shadow_room(backend)
    with caplog.at_level(logging.INFO, logger="loopwarden.decision"):
        await room.post("hi bots")
        posted = await room.run(max_posts=40)
    # Nothing is cut (enforce mode stops after 22 posts): every bot message is answered,
    # the bots still have replies queued, and no notice is posted.
    assert posted == pongs(room) == 40
    assert notices(room) == []
    metrics = rig.metrics
    assert metrics.value("refusals_total", stage="bot_loop") == 0
    # The same decisions enforce mode makes: 20 admitted, the 21st opens the cooldown
    # (in the state too), every later one of the pair is a cooldown.
    ok = metrics.value("guard_decisions_total", guard="bot_loop", code="ok", shadow="true")
    assert ok == 20
    opened = metrics.value(
        "guard_decisions_total", guard="bot_loop", code="budget_exceeded", shadow="true"
    )
    assert opened == 1
    cooling = metrics.value(
        "guard_decisions_total", guard="bot_loop", code="cooldown", shadow="true"
    )
    assert cooling == 40 - 21
    assert metrics.value("guard_decisions_total", guard="bot_loop", shadow="false") == 0
    [pair] = await rig.state.pair_snapshot(ROOM)
    assert pair.count == 20
    assert pair.cooldown_remaining > 0
    shadow_lines = [m for m in caplog.messages if "shadow: would have refused" in m]
    assert shadow_lines[0].startswith("room:C1 bot_loop shadow: would have refused budget_exceeded")
    flagged = [getattr(r, "shadow", None) for r in caplog.records if "shadow:" in r.getMessage()]
    assert flagged == ["true"] * 20
    assert rig.recent.recent(ROOM) == []
    status = await rig.admin.status(ROOM)
    assert "bot_loop: shadow: would have refused 20" in status.splitlines()


async def test_issue13_switch_to_enforce_refuses_at_once_and_posts_the_notice_once(
    backend: tuple[StateStore, FakeClock],
) -> None:
    rig, room = await shadow_room(backend)
    await room.post("hi bots")
    await room.run(max_posts=25)  # past the budget: a cooldown opened in shadow
    assert notices(room) == []
    ack = await rig.admin.set(ROOM, "bot_loop.mode", "enforce")
    assert ack == "Set bot_loop.mode = enforce for this room."
    replies = rig.metrics.value("replies_out_total")
    await room.run()
    # The bots' replies already sent reach the room; the next bot message is refused
    # (a `cooldown`, opened in shadow) and that refusal posts the cooldown's one
    # notice, the only reply since the switch; the pair then stays quiet.
    assert rig.metrics.value("replies_out_total") == replies + 1
    [notice] = notices(room)
    assert re.fullmatch(
        r"Loop guard: pausing replies between \w+ and \w+ for \d+ s \(20 bot messages in 1 min\)\. "
        r"An admin can /loop reset\.",
        notice,
    )
    assert rig.metrics.value("refusals_total", stage="bot_loop", reason="cooldown") >= 1
    # More bot messages of that pair during the cooldown: refused, no second notice.
    for _ in range(3):
        await room.post("again?", sender_id="U_echo", sender_name="echo", is_bot=True)
        await room.run()
    assert len(notices(room)) == 1
    # After the cooldown the loop is cut again by `budget_exceeded`, with a new notice.
    rig.clock.advance(61)
    await room.post("hi again")
    await room.run()
    assert len(notices(room)) == 2


async def test_issue13_enforce_posts_one_notice_per_cooldown_on_every_backend(
    backend: tuple[StateStore, FakeClock],
) -> None:
    rig, room = await shadow_room(backend, "policy: {bot_loop: {max_consecutive_bot_turns: 0}}")
    await room.post("hi bots")
    await room.run()
    assert len(notices(room)) == 1
    for _ in range(3):
        await room.post("still there?", sender_id="U_echo", sender_name="echo", is_bot=True)
        await room.run()
    assert len(notices(room)) == 1


async def test_issue13_bot_turn_cap_in_shadow_hands_the_message_on() -> None:
    yaml_text = "policy: {bot_loop: {mode: shadow, max_consecutive_bot_turns: 3}}"
    rig = PipelineRig(rig_config(yaml_text))
    await rig.start()
    connector = rig.connector()
    for n in range(5):
        await connector.push(
            connector.message(f"beep {n}", sender_id="U_BOT", sender_name="bot", sender_is_bot=True)
        )
    assert len(connector.texts()) == 5
    capped = rig.metrics.value(
        "guard_decisions_total", guard="bot_loop", code="bot_turn_cap", shadow="true"
    )
    assert capped == 2
    # As in enforce, a capped message is not charged to the pair budget.
    [pair] = await rig.state.pair_snapshot(ROOM)
    assert pair.count == 3
    shadow = [d for turn in rig.turns for d in turn.decisions if d.shadow]
    assert [d.code for d in shadow] == ["ok"] * 3 + ["bot_turn_cap"] * 2


async def test_issue13_loop_set_bot_loop_mode_from_chat() -> None:
    rig = PipelineRig(rig_config("admins: {room: [U_ADMIN]}"))
    await rig.start()
    connector = rig.connector()
    await connector.push(connector.message("/loop set bot_loop.mode shadow", sender_id="U_ADMIN"))
    assert connector.texts() == ["Set bot_loop.mode = shadow for this room."]
    policy = await rig.admin.effective_policy(ROOM)
    assert policy.bot_loop.mode == "shadow"
    status = await rig.admin.status(ROOM)
    assert "bot_loop: shadow: would have refused 0" in status.splitlines()


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("Shadow", "exactly enforce or shadow"),
        ("SHADOW", "exactly enforce or shadow"),
        ("ѕhadow", "exactly enforce or shadow"),  # Cyrillic dze
        ("shadоw", "exactly enforce or shadow"),  # Cyrillic o
        ("ｓｈａｄｏｗ", "exactly enforce or shadow"),  # full-width
        ("sha\u200bdow", "exactly enforce or shadow"),  # zero-width space
        ("off", "must be enforce or shadow"),
        ("1", "must be enforce or shadow"),
        (" shadow", "whitespace"),
        ("shadow\n", "whitespace"),
    ],
)
async def test_issue13_loop_set_refuses_a_mode_that_only_looks_right(value: str, why: str) -> None:
    rig = PipelineRig(rig_config())
    answer = await rig.admin.set(ROOM, "bot_loop.mode", value)
    assert answer.startswith("Can't set bot_loop.mode:")
    assert why in answer
    assert (await rig.state.get_overrides(ROOM)) == {}
