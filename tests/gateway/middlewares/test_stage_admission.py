"""Admission: paused rooms and who this bot answers (`respond_to`)."""

from __future__ import annotations

import pytest

from gateway.app.middlewares import AdmissionMiddleware, ChannelPolicyMiddleware
from gateway.app.pipeline import build_pipeline
from gateway.app.refusals import DecisionLog
from tests.gateway.middlewares.stage_rig import rig_with


@pytest.mark.parametrize(
    ("mode", "message", "answered"),
    [
        ("all", {}, True),
        ("none", {"mentions_bot": True}, False),
        ("mentions", {}, False),
        ("mentions", {"mentions_bot": True}, True),
        ("mentions", {"reply_to_bot": True}, True),
        ("mentions", {"is_direct": True}, True),
    ],
)
async def test_respond_to_humans(mode: str, message: dict[str, bool], answered: bool) -> None:
    rig, agent = await rig_with(f"policy: {{respond_to: {{humans: {mode}}}}}")
    connector = rig.connector()
    await connector.push(connector.message("hello", **message))  # type: ignore[arg-type]
    assert bool(agent.turns) is answered


@pytest.mark.parametrize(
    ("mode", "message", "answered"),
    [
        ("all", {}, True),
        ("none", {"mentions_bot": True}, False),
        ("mentions", {}, False),
        ("mentions", {"mentions_bot": True}, True),
        ("mentions", {"is_direct": True}, True),
        # A platform's reply feature adds an automatic mention: not a mention from a bot.
        ("mentions", {"reply_to_bot": True}, False),
    ],
)
async def test_issue3_respond_to_bots_and_auto_reply_mention(
    mode: str, message: dict[str, bool], answered: bool
) -> None:
    rig, agent = await rig_with(f"policy: {{respond_to: {{bots: {mode}}}}}")
    connector = rig.connector()
    await connector.push(
        connector.message("hello", sender_id="U_B", sender_is_bot=True, **message)  # type: ignore[arg-type]
    )
    assert bool(agent.turns) is answered


async def test_issue12_routine_admission_refusals_stay_out_of_recent_refusals() -> None:
    # Every hosted bot turns away what is not meant for it; `status` keeps the guards' list.
    rig, _ = await rig_with("policy: {respond_to: {humans: mentions}}")
    connector = rig.connector()
    await connector.push(connector.message("hello"))
    assert b'refusals_total{reason="not_addressed",stage="admission"} 1.0' in rig.metrics.render()
    assert rig.recent.recent("room:C1") == []


async def test_issue10_admission_decides_and_keeps_no_bot_turn_count() -> None:
    # Admission alone (no bot_turns stage): refusing a human in a paused room leaves the
    # room's consecutive-bot-turn count as it was; the bot-loop module owns that count.
    rig, _ = await rig_with()
    room = "room:C1"
    for _ in range(2):
        await rig.state.bot_turn(room, is_bot=True)
    await rig.state.pause(room, None)
    handler = build_pipeline(
        [
            ChannelPolicyMiddleware(rig.admin.policies, rig.state),
            AdmissionMiddleware(rig.state, DecisionLog(rig.metrics, rig.recent)),
        ]
    )
    connector = rig.connector()
    turn = rig.turn(connector.message("anyone?"))
    assert await handler(turn) is None
    assert [(d.stage, d.code) for d in turn.decisions] == [("admission", "paused")]
    assert await rig.state.bot_turn(room, is_bot=True) == 3
