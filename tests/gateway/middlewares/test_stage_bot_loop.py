"""Bot loop stage: pair budget, one cooldown notice per cooldown, consecutive-bot-turn cap."""

from __future__ import annotations

import inspect
import logging
import re

import pytest

from connectors.slack.connector import SlackConnector
from gateway.admin.service import AdminService
from gateway.app.middlewares import bot_loop as bot_loop_stage
from gateway.app.refusals import RecentRefusals
from gateway.app.stages import build_gateway_pipeline
from gateway.config import parse_config
from gateway.state.memory import MemoryStateStore
from guards.bot_loop import BotLoopPolicy, PairDecision
from tests.fakes.inmemory import (
    ConstantAgent,
    FakeClock,
    InMemoryConnector,
    InMemoryRoom,
    PipelineRig,
    rig_config,
)
from tests.gateway.middlewares.stage_rig import notices

NO_CAP = "policy: {bot_loop: {max_consecutive_bot_turns: 0}}"


async def ping_pong(
    yaml_text: str = NO_CAP, *, bots: tuple[str, ...] = ("parrot", "echo")
) -> tuple[PipelineRig, InMemoryRoom]:
    rig = PipelineRig(rig_config(yaml_text, bots=bots))
    await rig.start()
    return rig, InMemoryRoom(rig)


async def test_issue3_ping_pong_cut_at_budget_with_one_notice() -> None:
    rig, room = await ping_pong()
    await room.post("hi bots")
    await room.run()
    # Two replies to the human, then twenty admitted bot-to-bot exchanges, then the notice.
    pongs = [post for post in room.bot_posts() if post.text == "pong"]
    assert len(pongs) == 2 + 20
    [notice] = notices(room)
    assert re.fullmatch(
        r"Loop guard: pausing replies between (echo and parrot|parrot and echo) for 1 min "
        r"\(20 bot messages in 1 min\)\. An admin can /loop reset\.",
        notice,
    )
    assert room.transcript[-1].text == notice
    assert rig.metrics.value("refusals_total", stage="bot_loop", reason="budget_exceeded") == 1
    assert rig.metrics.value("guard_decisions_total", guard="bot_loop", code="ok") == 20


async def test_issue3_notice_posted_once_per_cooldown() -> None:
    rig, room = await ping_pong()
    await room.post("hi bots")
    await room.run()
    assert len(notices(room)) == 1
    # More bot messages during the cooldown: dropped silently.
    await room.post("still there?", sender_id="U_OTHERBOT", sender_name="otherbot")
    await room.run()
    assert len(notices(room)) == 1
    # After the cooldown, the loop can start again and is cut again, with a new notice.
    rig.clock.advance(61)
    await room.post("hi again")
    await room.run()
    assert len(notices(room)) == 2


class ReplicaClaimsFirst(MemoryStateStore):
    """A state where another replica's `cooldown` refusal of a new cooldown claims its
    notice between this replica's `budget_exceeded` decision and this replica's claim."""

    async def pair_decide(
        self, *, scope: str, self_bot_id: str, sender_bot_id: str, policy: BotLoopPolicy
    ) -> PairDecision:
        decision = await super().pair_decide(
            scope=scope, self_bot_id=self_bot_id, sender_bot_id=sender_bot_id, policy=policy
        )
        if decision.reason == "budget_exceeded":
            key = bot_loop_stage._notice_key(scope, self_bot_id, sender_bot_id, decision.until)
            assert await self.claim(key, decision.retry_after)  # the other replica posts it
        return decision


async def test_issue10_a_replica_that_claims_the_notice_first_posts_it_alone() -> None:
    clock = FakeClock()
    config = rig_config(NO_CAP, bots=("parrot", "echo"))
    rig = PipelineRig(config, state=ReplicaClaimsFirst(clock=clock), clock=clock)
    await rig.start()
    room = InMemoryRoom(rig)
    await room.post("hi bots")
    await room.run()
    # Cut at the budget, and this replica leaves the notice to the one that claimed it.
    assert len([post for post in room.bot_posts() if post.text == "pong"]) == 2 + 20
    assert notices(room) == []
    assert rig.metrics.value("refusals_total", stage="bot_loop", reason="budget_exceeded") == 1


async def test_cooldown_refusals_are_silent_and_recorded() -> None:
    rig, room = await ping_pong()
    await room.post("hi bots")
    await room.run()
    refusals = rig.recent.recent("room:C1", limit=10)
    assert {r.code for r in refusals} >= {"budget_exceeded", "cooldown"}


async def test_no_notice_when_announce_cooldown_off() -> None:
    rig, room = await ping_pong(
        "policy: {bot_loop: {max_consecutive_bot_turns: 0, announce_cooldown: false}}"
    )
    await room.post("hi bots")
    await room.run()
    assert notices(room) == []
    assert len(room.bot_posts()) == 22


async def test_issue3_reset_then_new_cooldown_is_announced_again() -> None:
    rig, room = await ping_pong(NO_CAP + "\nadmins: {room: [U_ALICE]}")
    await room.post("hi bots")
    await room.run()
    await room.post("/loop reset")
    await room.run()
    # The acknowledgement is a bot message: the other bot answers it and the loop resumes,
    # until the budget is spent again and the new cooldown is announced, well within the
    # first cooldown's time.
    assert rig.clock.now < 1_000 + 60
    assert len(notices(room)) == 2


async def test_issue3_new_cooldown_announced_by_a_replica_that_did_not_see_the_reset() -> None:
    rig, room = await ping_pong(NO_CAP + "\nadmins: {room: [U_ALICE]}")
    await room.post("hi bots")
    await room.run()
    assert len(notices(room)) == 1
    await room.post("/loop reset")  # handled by this replica
    # From here on a second replica, sharing the state store but nothing in process,
    # handles the room: it must announce the cooldown that follows the reset.
    other = RecentRefusals(clock=rig.clock)
    rig.handler = build_gateway_pipeline(
        rig.config,
        state=rig.state,
        admin=AdminService(rig.config, rig.state, recent=other),
        delivery=rig.delivery,
        recent=other,
    )
    await room.run()
    assert len(notices(room)) == 2
    assert rig.clock.now < 1_000 + 60  # still inside the first cooldown's time


async def test_budget_follows_channel_rule() -> None:
    rig, room = await ping_pong(
        NO_CAP
        + "\nchannels: [{match: {channel: 'C*'}, policy: {bot_loop: {max_events_per_window: 4}}}]"
    )
    await room.post("hi bots")
    await room.run()
    assert len([p for p in room.bot_posts() if p.text == "pong"]) == 2 + 4


async def test_decision_log_line_is_readable(caplog: pytest.LogCaptureFixture) -> None:
    rig, room = await ping_pong()
    with caplog.at_level(logging.INFO, logger="loopwarden.decision"):
        await room.post("hi bots")
        await room.run()
    lines = [r.getMessage() for r in caplog.records if r.name == "loopwarden.decision"]
    [exceeded] = [line for line in lines if "budget_exceeded" in line]
    assert exceeded.startswith("room:C1 bot_loop refused budget_exceeded (event 21 over 20 per")
    assert "cooldown 1 min" in exceeded
    assert "pair=" in exceeded
    [record] = [r for r in caplog.records if "budget_exceeded" in r.getMessage()]
    assert record.__dict__["decision"] == "budget_exceeded"
    assert record.__dict__["room"] == "room:C1"
    assert "hi bots" not in "\n".join(lines)


async def test_bot_loop_disabled_lets_bots_talk() -> None:
    rig, room = await ping_pong("policy: {bot_loop: {enabled: false}}")
    await room.post("hi bots")
    posted = await room.run(max_posts=100)
    assert posted == 100  # nothing stopped them: that is what the guard is for


async def test_issue3_consecutive_bot_turn_cap_and_human_reset() -> None:
    rig, room = await ping_pong(
        "policy: {bot_loop: {max_consecutive_bot_turns: 5, max_events_per_window: 1000}}"
    )
    await room.post("hi bots")
    await room.run()
    # Two replies to the human, then five admitted bot turns, each answered once; the
    # sixth bot message in a row is refused.
    bot_posts = len(room.bot_posts())
    assert bot_posts == 2 + 5
    assert rig.metrics.value("refusals_total", stage="bot_loop", reason="bot_turn_cap") >= 1
    # A human message resets the count: the bots answer again, up to the cap.
    await room.post("carry on")
    await room.run()
    assert len(room.bot_posts()) == 2 * bot_posts


async def test_issue3_bot_turn_counted_once_per_message_with_three_hosted_bots() -> None:
    rig, room = await ping_pong(
        "policy: {bot_loop: {max_consecutive_bot_turns: 3, max_events_per_window: 1000}}",
        bots=("parrot", "echo", "mimic"),
    )
    await room.post("hello from a bot", sender_id="U_EXT", sender_name="ext", is_bot=True)
    # Three hosted bots saw one bot message: it counts as one turn, not three.
    assert await rig.state.bot_turn("room:C1", is_bot=True) == 2


async def test_cap_off_with_zero() -> None:
    rig, room = await ping_pong("policy: {bot_loop: {max_consecutive_bot_turns: 0}}")
    await room.post("hi")
    await room.run()
    assert rig.metrics.value("refusals_total", stage="bot_loop", reason="bot_turn_cap") == 0


async def test_slack_notice_names_the_bang_prefix() -> None:
    config_text = """
agents: {a: {kind: scripted, default: pong}}
bots:
  - {id: alpha, platform: slack, bot_token: x, signing_secret: y, agent: a}
  - {id: beta, platform: slack, bot_token: x, signing_secret: y, agent: a}
policy: {bot_loop: {max_consecutive_bot_turns: 0, max_events_per_window: 2}}
"""
    rig = PipelineRig(
        parse_config(config_text, env={}),
        command_prefix=SlackConnector.capabilities.command_prefix,
    )
    await rig.start()
    room = InMemoryRoom(rig)
    await room.post("hi")
    await room.run()
    [notice] = notices(room)
    assert notice.endswith("An admin can !loop reset.")


async def test_issue10_the_notice_takes_the_command_prefix_from_the_connector() -> None:
    # A room-platform rig whose connector says "?loop": the stage asks the connector, not
    # the platform's name, so the notice follows it.
    config = rig_config(
        "policy: {bot_loop: {max_consecutive_bot_turns: 0, max_events_per_window: 2}}",
        bots=("parrot", "echo"),
    )
    rig = PipelineRig(config, command_prefix="?loop")
    await rig.start()
    room = InMemoryRoom(rig)
    await room.post("hi")
    await room.run()
    [notice] = notices(room)
    assert notice.endswith("An admin can ?loop reset.")
    assert rig.config.bots[0].platform == "room"


def test_issue10_the_bot_loop_stage_names_no_platform() -> None:
    source = inspect.getsource(bot_loop_stage).lower()
    for platform in ("slack", "telegram", "discord", "roombotconfig"):
        assert platform not in source


async def test_humans_never_touch_the_pair_budget() -> None:
    agent = ConstantAgent("hi")
    rig = PipelineRig(
        rig_config("policy: {bot_loop: {max_events_per_window: 1}}"), {"parrot": agent}
    )
    await rig.start()
    connector = rig.connector()
    for _ in range(5):
        await connector.push(connector.message("hello"))
    assert len(agent.turns) == 5
    assert await rig.state.pair_snapshot() == []


async def test_issue3_a_human_message_nobody_answers_still_resets_the_bot_turn_cap() -> None:
    rig, room = await ping_pong(
        "policy: {respond_to: {humans: mentions}, "
        "bot_loop: {max_consecutive_bot_turns: 3, max_events_per_window: 1000}}"
    )
    await room.post("@parrot hi", mentions=["U_parrot"])
    await room.run()
    assert len(room.bot_posts()) == 1 + 3
    # People talking among themselves, addressing no bot: still a human in the room.
    await room.post("lunch?")
    assert await rig.state.bot_turn("room:C1", is_bot=True) == 1


async def test_issue3_the_refused_turn_carries_its_decision_reason_count_and_retry_after() -> None:
    rig, room = await ping_pong()
    await room.post("hi bots")
    await room.run()
    refused = [
        decision
        for turn in rig.turns
        for decision in turn.decisions
        if decision.code == "budget_exceeded"
    ]
    [decision] = refused
    assert (decision.stage, decision.count, decision.retry_after) == ("bot_loop", 20, 60.0)
    assert "cooldown 1 min" in decision.reason


async def test_issue3_unknown_botness_charges_the_pair_budget_and_gets_no_notice() -> None:
    agent = ConstantAgent(None)
    config = rig_config("policy: {bot_loop: {max_events_per_window: 1}}")
    rig = PipelineRig(config, {"parrot": agent})
    rig.connectors["parrot"] = connector = InMemoryConnector("parrot", knows_bots=False)
    await rig.start()
    for _ in range(2):
        await connector.push(connector.message("hey @parrot", mentions_bot=True))
    # The first is a bot turn: its silence gets no notice (a person's would). The second
    # is over the pair budget: the only thing posted is the cooldown notice.
    assert [turn.sender_is_bot for turn in agent.turns] == [True]
    [posted] = connector.texts()
    assert posted.startswith("Loop guard: pausing replies between parrot and alice")


async def test_issue10_bot_messages_nobody_answers_count_as_bot_turns_in_the_room() -> None:
    # The count is kept before admission: bot messages this room's bots do not answer
    # (here: answered only when they mention a bot) are still bot turns in a row.
    rig, room = await ping_pong(
        "policy: {respond_to: {bots: mentions}, "
        "bot_loop: {max_consecutive_bot_turns: 3, max_events_per_window: 1000}}"
    )
    for _ in range(3):
        await room.post("chatter", sender_id="U_EXT", sender_name="ext", is_bot=True)
    await room.post(
        "@parrot hi", sender_id="U_EXT", sender_name="ext", is_bot=True, mentions=["U_parrot"]
    )
    assert rig.sent() == []
    assert rig.metrics.value("refusals_total", stage="bot_loop", reason="bot_turn_cap") == 1
    # A human message resets it, answered or not.
    await room.post("hello all")
    assert await rig.state.bot_turn("room:C1", is_bot=True) == 1
