"""Admin commands in chat: every subcommand, authorisation, refusal wording, once per message."""

from __future__ import annotations

import logging
import re

import pytest
from pydantic import BaseModel

import gateway.config as config_module
from gateway.app.middlewares.admin import parse_command
from gateway.config.limits import parse_duration
from gateway.state.base import GLOBAL_SCOPE
from tests.fakes.inmemory import ConstantAgent, InMemoryRoom, PipelineRig, rig_config

ADMIN = "U_ADMIN"
ADMIN_YAML = f"admins: {{room: [{ADMIN}], discord: ['998877']}}\n"
ROOM = "room:C1"


async def make_rig(extra: str = "", *, bots: tuple[str, ...] = ("parrot",)) -> PipelineRig:
    rig = PipelineRig(rig_config(ADMIN_YAML + extra, bots=bots))
    await rig.start()
    return rig


async def command(
    rig: PipelineRig, text: str, *, sender_id: str = ADMIN, bot: str = "parrot"
) -> str:
    """Send `text` to one hosted bot and return what it answered (the last chunk sent)."""
    connector = rig.connector(bot)
    before = len(connector.sent)
    await connector.push(connector.message(text, sender_id=sender_id, sender_name="boss"))
    sent = connector.sent[before:]
    return "\n".join(s.reply.text for s in sent)


def config_keys() -> set[str]:
    """Every field name of every config model: none may appear in a refusal."""
    keys: set[str] = set()
    for value in vars(config_module).values():
        if isinstance(value, type) and issubclass(value, BaseModel) and value is not BaseModel:
            keys.update(value.model_fields)
    return keys


def test_parse_command_forms() -> None:
    assert parse_command("/loop status") is not None
    assert parse_command("  !LOOP reset all").args == ("reset", "all")  # type: ignore[union-attr]
    assert parse_command("/loop@parrot_bot pause 10m").args == ("pause", "10m")  # type: ignore[union-attr]
    assert parse_command("/looping around") is None
    assert parse_command("please /loop status") is None
    assert parse_command("") is None


def test_parse_duration() -> None:
    assert parse_duration("30s") == 30
    assert parse_duration("10m") == 600
    assert parse_duration("2h") == 7_200
    assert parse_duration("1d") == 86_400
    assert parse_duration("45") == 45
    assert parse_duration("soon") is None
    assert parse_duration("0s") is None


async def test_commands_never_reach_the_agent() -> None:
    agent = ConstantAgent("agent speaking")
    rig = PipelineRig(rig_config(ADMIN_YAML), {"parrot": agent})
    await rig.start()
    for text in ("/loop status", "/loop help", "/loop nonsense", "!loop policy"):
        await command(rig, text)
        await command(rig, text, sender_id="U_STRANGER")
    assert agent.turns == []


async def test_issue3_status_shows_policy_pairs_with_counts_pause_and_refusals() -> None:
    rig = await make_rig("policy: {bot_loop: {max_events_per_window: 1}}")
    connector = rig.connector()
    for _ in range(3):
        await connector.push(
            connector.message("beep", sender_id="U_BOT2", sender_name="bot2", sender_is_bot=True)
        )
    await connector.push(
        connector.message("beep", sender_id="U_BOT3", sender_name="bot3", sender_is_bot=True)
    )
    await command(rig, "/loop pause 10m")
    answer = await command(rig, "/loop status")
    assert answer.startswith("Loop status for room:C1")
    assert "pair budget 1 per 1 min" in answer
    assert "Paused: yes, 10 min left" in answer
    # The pair held: its count in the window and the cooldown time left, both.
    assert "  U_BOT2 ↔ parrot: cooling down, 1 min left (1 in window)\n" in answer
    assert "  U_BOT3 ↔ parrot: 1 in window\n" in answer
    assert "budget_exceeded" in answer
    assert "cooldown" in answer


async def test_status_of_a_quiet_room() -> None:
    rig = await make_rig()
    answer = await command(rig, "/loop status")
    assert "Paused: no" in answer
    assert "Bot pairs: none" in answer
    assert "Recent refusals: none" in answer


async def test_reset_clears_room_pairs_and_bot_turns() -> None:
    rig = await make_rig("policy: {bot_loop: {max_events_per_window: 1}}")
    connector = rig.connector()
    bot_message = {"sender_id": "U_BOT2", "sender_name": "bot2", "sender_is_bot": True}
    await connector.push(connector.message("beep", **bot_message))  # type: ignore[arg-type]
    assert await rig.state.pair_snapshot(ROOM)
    answer = await command(rig, "/loop reset")
    assert answer == "Loop guard reset for this room: 1 bot pair cleared, bot-turn count back to 0."
    assert await rig.state.pair_snapshot(ROOM) == []
    assert await rig.state.bot_turn(ROOM, is_bot=True) == 1


async def test_reset_all_and_reset_bot() -> None:
    rig = await make_rig("policy: {bot_loop: {max_events_per_window: 5}}")
    connector = rig.connector()
    for channel in ("C1", "C2"):
        for sender in ("U_B1", "U_B2"):
            await connector.push(
                connector.message("beep", sender_id=sender, sender_is_bot=True, channel_id=channel)
            )
    assert len(await rig.state.pair_snapshot()) == 4
    assert (
        await command(rig, "/loop reset U_B1") == "Loop guard reset for U_B1: 2 bot pairs cleared."
    )
    assert len(await rig.state.pair_snapshot()) == 2
    assert (
        await command(rig, "/loop reset all") == "Loop guard reset everywhere: 2 bot pairs cleared."
    )
    assert await rig.state.pair_snapshot() == []


async def test_reset_hosted_bot_by_config_id() -> None:
    rig = await make_rig()
    connector = rig.connector()
    await connector.push(connector.message("beep", sender_id="U_B1", sender_is_bot=True))
    answer = await command(rig, "/loop reset parrot")
    assert answer == "Loop guard reset for parrot: 1 bot pair cleared."


async def test_pause_and_resume() -> None:
    agent = ConstantAgent("hi")
    rig = PipelineRig(rig_config(ADMIN_YAML), {"parrot": agent})
    await rig.start()
    connector = rig.connector()
    assert (
        await command(rig, "/loop pause")
        == "Paused: bots won't answer in this room until /loop resume."
    )
    await connector.push(connector.message("anyone?"))
    assert agent.turns == []
    assert rig.metrics.value("refusals_total", stage="admission", reason="paused") == 1
    assert await command(rig, "/loop resume") == "Resumed: bots answer in this room again."
    await connector.push(connector.message("anyone?"))
    assert len(agent.turns) == 1
    assert await command(rig, "/loop resume") == "This room wasn't paused."


async def test_timed_pause_ends_by_itself() -> None:
    agent = ConstantAgent("hi")
    rig = PipelineRig(rig_config(ADMIN_YAML), {"parrot": agent})
    await rig.start()
    connector = rig.connector()
    answer = await command(rig, "/loop pause 30s")
    assert (
        answer == "Paused: bots won't answer in this room for 30 s (/loop resume ends it sooner)."
    )
    await connector.push(connector.message("anyone?"))
    rig.clock.advance(31)
    await connector.push(connector.message("anyone?"))
    assert len(agent.turns) == 1


async def test_pause_with_bad_duration_changes_nothing() -> None:
    rig = await make_rig()
    answer = await command(rig, "/loop pause forever")
    assert answer.startswith("Can't pause for 'forever'")
    assert await rig.state.pause_remaining(ROOM) is None


async def test_set_stores_a_validated_override() -> None:
    rig = await make_rig()
    answer = await command(rig, "/loop set bot_loop.max_events_per_window 6")
    assert answer == "Set bot_loop.max_events_per_window = 6 for this room."
    assert await rig.state.get_overrides(ROOM) == {"bot_loop.max_events_per_window": 6}
    assert "pair budget 6 per" in await command(rig, "/loop status")
    assert "max_events_per_window: 6" in await command(rig, "/loop policy")


async def test_set_takes_effect_in_the_pipeline() -> None:
    agent = ConstantAgent("hi")
    rig = PipelineRig(rig_config(ADMIN_YAML), {"parrot": agent})
    await rig.start()
    await command(rig, "/loop set respond_to.humans none")
    connector = rig.connector()
    await connector.push(connector.message("hello"))
    assert agent.turns == []


async def test_set_list_value() -> None:
    rig = await make_rig()
    answer = await command(rig, "/loop set silence.tokens [NO_REPLY, SKIP]")
    assert answer == "Set silence.tokens = [NO_REPLY, SKIP] for this room."


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("/loop set bot_loop.max_events_per_window 0", "greater than or equal to 1"),
        ("/loop set bot_loop.max_events_per_window lots", "valid integer"),
        ("/loop set bot_loop.nope 3", "no such field"),
        ("/loop set bot_loop 3", "no such field"),
        ("/loop set tool_loop.no_progress_halt 0", "no_progress_halt"),
        ("/loop set tool_loop.bogus 1", "no such field"),
        ("/loop set respond_to.humans sometimes", "all"),
    ],
)
async def test_bad_set_explains_and_stores_nothing(text: str, reason: str) -> None:
    rig = await make_rig()
    answer = await command(rig, text)
    assert answer.startswith("Can't set ")
    assert reason in answer
    assert answer.endswith("Nothing was changed.")
    assert await rig.state.get_overrides(ROOM) == {}


async def test_set_usage() -> None:
    rig = await make_rig()
    assert (await command(rig, "/loop set bot_loop.window_seconds")).startswith("Usage: /loop set")


async def test_global_overrides_apply_under_room_overrides() -> None:
    rig = await make_rig()
    await rig.state.set_override(GLOBAL_SCOPE, "bot_loop.max_events_per_window", 9)
    assert "pair budget 9 per" in await command(rig, "/loop status")
    await command(rig, "/loop set bot_loop.max_events_per_window 4")
    assert "pair budget 4 per" in await command(rig, "/loop status")


async def test_help_and_unknown_subcommand() -> None:
    rig = await make_rig()
    help_text = await command(rig, "/loop help")
    for name in ("status", "reset", "reset all", "reset <bot>", "pause", "resume", "set", "policy"):
        assert f"/loop {name}" in help_text
    assert await command(rig, "/loop frobnicate") == help_text
    assert await command(rig, "/loop") == help_text
    assert (await command(rig, "!loop help")).startswith("Loop guard commands:")
    assert "!loop status" in await command(rig, "!loop help")


async def test_policy_is_compact_yaml() -> None:
    rig = await make_rig()
    answer = await command(rig, "/loop policy")
    assert answer.startswith("Effective policy for room:C1:\n```yaml\n")
    assert "respond_to: {humans: all, bots: all}" in answer


async def test_issue3_refusal_names_no_key_no_admin_and_is_ephemeral() -> None:
    rig = await make_rig()
    connector = rig.connector()
    await connector.push(connector.message("/loop reset all", sender_id="U_STRANGER"))
    [sent] = connector.sent
    text = sent.reply.text
    assert text == "Sorry, you can't run loop commands here."
    assert sent.reply.ephemeral_to == "U_STRANGER"
    lowered = text.lower()
    assert "admins" not in lowered
    assert "config" not in lowered
    assert ADMIN.lower() not in lowered
    assert "998877" not in lowered
    for key in config_keys():
        assert not re.search(rf"\b{re.escape(key.lower())}\b", lowered), key


async def test_authorisation_by_id_not_name() -> None:
    rig = await make_rig()
    connector = rig.connector()
    impostor = connector.message("/loop pause", sender_id="U_IMPOSTOR", sender_name="boss")
    await connector.push(impostor)
    assert await rig.state.pause_remaining(ROOM) is None
    assert connector.texts() == ["Sorry, you can't run loop commands here."]


async def test_admins_are_per_platform() -> None:
    rig = await make_rig()
    # 998877 is a Discord admin, not an admin of the room platform.
    answer = await command(rig, "/loop pause", sender_id="998877")
    assert answer == "Sorry, you can't run loop commands here."


async def test_issue3_bots_cannot_run_commands() -> None:
    rig = await make_rig()
    connector = rig.connector()
    await connector.push(
        connector.message("/loop pause", sender_id=ADMIN, sender_name="boss", sender_is_bot=True)
    )
    assert connector.sent == []  # dropped silently
    assert await rig.state.pause_remaining(ROOM) is None
    [entry] = await rig.state.recent_audit()
    assert not entry.allowed
    assert entry.outcome == "ignored: sent by a bot"


async def test_issue3_every_attempt_is_audited() -> None:
    rig = await make_rig()
    await command(rig, "/loop status")
    await command(rig, "/loop reset", sender_id="U_STRANGER")
    await command(rig, "/loop set bot_loop.nope 1")
    entries = await rig.state.recent_audit(scope=ROOM)
    assert [(e.user_id, e.command, e.allowed, e.outcome) for e in entries] == [
        (ADMIN, "/loop set bot_loop.nope 1", True, "rejected"),
        ("U_STRANGER", "/loop reset", False, "refused"),
        (ADMIN, "/loop status", True, "done"),
    ]
    assert all(e.platform == "room" and e.user_name == "boss" for e in entries)


async def test_issue3_command_executed_once_when_two_hosted_bots_see_it() -> None:
    rig = await make_rig(bots=("parrot", "echo"))
    room = InMemoryRoom(rig)
    await room.post("/loop pause 1h", sender_id=ADMIN, sender_name="boss")
    acks = rig.sent()
    assert len(acks) == 1
    assert acks[0].reply.text.startswith("Paused:")
    assert len(await rig.state.recent_audit()) == 1


async def test_refusal_once_when_two_hosted_bots_see_it() -> None:
    rig = await make_rig(bots=("parrot", "echo"))
    room = InMemoryRoom(rig)
    await room.post("/loop reset", sender_id="U_STRANGER")
    assert [s.reply.text for s in rig.sent()] == ["Sorry, you can't run loop commands here."]
    assert len(await rig.state.recent_audit()) == 1


async def test_commands_work_in_a_paused_room_and_bypass_mentions() -> None:
    rig = await make_rig("policy: {respond_to: {humans: mentions}}")
    await command(rig, "/loop pause")
    assert (await command(rig, "/loop resume")).startswith("Resumed")


async def test_admin_commands_switched_off_go_to_the_agent() -> None:
    agent = ConstantAgent("agent speaking")
    rig = PipelineRig(
        rig_config(ADMIN_YAML + "pipeline: {admin_commands: false}"), {"parrot": agent}
    )
    await rig.start()
    assert await command(rig, "/loop pause") == "agent speaking"
    assert await rig.state.pause_remaining(ROOM) is None


async def test_issue3_commands_are_logged_with_who_ran_them(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rig = await make_rig()
    with caplog.at_level(logging.INFO, logger="loopwarden.decision"):
        await command(rig, "/loop reset all")
        await command(rig, "/loop reset", sender_id="U_STRANGER")
    assert "room:C1 admin reset all by boss (done)" in caplog.messages
    [refused] = [line for line in caplog.messages if "not_authorised" in line]
    assert refused.startswith("room:C1 admin refused not_authorised (command refused)")
    assert rig.metrics.value("refusals_total", stage="admin", reason="not_authorised") == 1


SMALL_BOMB = (
    "[&a [x, x, x, x, x, x, x, x, x], "
    + ", ".join(
        f"&{c} [{', '.join([f'*{p}'] * 9)}]" for p, c in zip("abcdefg", "bcdefgh", strict=True)
    )
    + "]"
)


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("bot_loop.window_seconds", "inf", "finite"),
        ("bot_loop.window_seconds", ".inf", "finite"),
        ("bot_loop.window_seconds", "nan", "finite"),
        ("bot_loop.cooldown_seconds", "inf", "finite"),
        ("bot_loop.window_seconds", "1e308", "366 days"),
        ("bot_loop.max_events_per_window", "99999999999999999999999", "1000000"),
        ("bot_loop.cooldown_seconds", "99999999999", "366 days"),
        ("tool_loop.max_time_per_turn", "1e300", "366 days"),
        ("bot_loop.window_seconds", "-5", "greater than 0"),
        ("silence.tokens", "['']", "silence tokens"),
        ("silence.tokens", "['***']", "silence tokens"),
        ("bot_loop.max_events_per_window", "５", "look-alike"),
        ("tool_loop.idempotent_warn_threshold", "５", "look-alike"),
        ("bot_loop.max_events_per_window", "9" * 5_000, "longer than 500 characters"),
        ("silence.tokens", "[" + "x" * 600 + "]", "longer than 500 characters"),
        ("silence.tokens", SMALL_BOMB, "aliases expand"),
        ("silence.tokens", "[" * 70 + "]" * 70, "nested deeper"),
    ],
)
async def test_issue9_set_refuses_what_the_guards_cannot_run_with_and_the_room_still_answers(
    field: str, value: str, reason: str
) -> None:
    rig = await make_rig()
    answer = await command(rig, f"/loop set {field} {value}")
    assert answer.startswith(f"Can't set {field}: ")
    assert reason in answer
    assert answer.endswith("Nothing was changed.")
    assert await rig.state.get_overrides(ROOM) == {}
    assert await command(rig, "hello") == "pong"


@pytest.mark.parametrize("duration", ["99999999999d", "367d", "31622401", "1e308", "５m"])
async def test_issue9_pause_refuses_durations_beyond_366_days(duration: str) -> None:
    rig = await make_rig()
    answer = await command(rig, f"/loop pause {duration}")
    assert answer.startswith("Can't pause for ")
    assert "at most 366d" in answer
    assert await rig.state.pause_remaining(ROOM) is None
    assert await command(rig, "hello") == "pong"


async def test_issue9_pause_for_366_days_and_until_resumed_still_work() -> None:
    rig = await make_rig()
    assert (await command(rig, "/loop pause 366d")).startswith("Paused:")
    assert await rig.state.pause_remaining(ROOM) == 366 * 86_400
    assert (await command(rig, "/loop pause")).startswith("Paused:")
    assert parse_duration("366d") == 366 * 86_400
    assert parse_duration("367d") is None


async def test_issue9_a_stored_override_that_is_now_refused_does_not_break_the_room(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rig = await make_rig()
    # As a version without the bounds stored them: every message used to fail.
    await rig.state.set_override(ROOM, "bot_loop.window_seconds", "inf")
    await rig.state.set_override(ROOM, "silence.tokens", ["***"])
    with caplog.at_level(logging.WARNING, logger="loopwarden.config"):
        assert await command(rig, "hello") == "pong"
    assert "bot_loop.window_seconds" in caplog.text
    assert "window_seconds: 60" in await command(rig, "/loop policy")
    answer = await command(rig, "/loop set bot_loop.max_events_per_window 6")
    assert answer == "Set bot_loop.max_events_per_window = 6 for this room."
    assert (await command(rig, "/loop set bot_loop.window_seconds 30")).startswith("Set ")
    assert "window_seconds: 30" in await command(rig, "/loop policy")
    assert await command(rig, "hello again") == "pong"
