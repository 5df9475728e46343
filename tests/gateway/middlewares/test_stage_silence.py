"""Silence stage: NO_REPLY never delivered; an addressed human gets a notice unless set silent."""

from __future__ import annotations

import pytest

from gateway.app.messages import SILENCE_NOTICE
from tests.fakes.inmemory import ConstantAgent, PipelineRig, rig_config


async def reply_to(
    text: str | None,
    *,
    yaml_text: str = "",
    mentions_bot: bool = False,
    reply_to_bot: bool = False,
    is_direct: bool = False,
    sender_is_bot: bool = False,
) -> list[str]:
    rig = PipelineRig(rig_config(yaml_text), {"parrot": ConstantAgent(text)})
    await rig.start()
    connector = rig.connector()
    await connector.push(
        connector.message(
            "hello",
            mentions_bot=mentions_bot,
            reply_to_bot=reply_to_bot,
            is_direct=is_direct,
            sender_is_bot=sender_is_bot,
            sender_id="U_OTHER" if sender_is_bot else "U_ALICE",
        )
    )
    return connector.texts()


@pytest.mark.parametrize(
    "token", ["NO_REPLY", "no reply", "**NO_REPLY**", "`no-reply`", " NO_REPLY. "]
)
async def test_issue3_no_reply_never_delivered(token: str) -> None:
    assert await reply_to(token) == []


@pytest.mark.parametrize("narration", ["*(silent)*", "(no reply)", "🔇", "."])
async def test_narration_is_silence(narration: str) -> None:
    assert await reply_to(narration) == []


async def test_agent_returning_nothing_is_silence() -> None:
    assert await reply_to(None) == []


async def test_trailing_token_line_stripped() -> None:
    assert await reply_to("Here is the answer.\n\nNO_REPLY") == ["Here is the answer."]


async def test_ordinary_reply_untouched() -> None:
    assert await reply_to("No reply needed? Here it is anyway.") == [
        "No reply needed? Here it is anyway."
    ]


@pytest.mark.parametrize("how", ["mention", "reply", "direct"])
async def test_issue3_addressed_human_gets_notice(how: str) -> None:
    replies = await reply_to(
        "NO_REPLY",
        mentions_bot=how == "mention",
        reply_to_bot=how == "reply",
        is_direct=how == "direct",
    )
    assert replies == [SILENCE_NOTICE]


async def test_issue3_addressed_human_with_silent_setting_gets_nothing() -> None:
    yaml_text = "policy: {silence: {on_addressed_human_turn: silent}}"
    assert await reply_to("NO_REPLY", yaml_text=yaml_text, mentions_bot=True) == []


async def test_unaddressed_human_gets_nothing() -> None:
    assert await reply_to("NO_REPLY") == []


async def test_addressed_bot_gets_no_notice() -> None:
    assert await reply_to("NO_REPLY", mentions_bot=True, sender_is_bot=True) == []


async def test_configured_token() -> None:
    yaml_text = "policy: {silence: {tokens: ['[SILENT]']}}"
    assert await reply_to("[silent]", yaml_text=yaml_text) == []
    assert await reply_to("NO_REPLY", yaml_text=yaml_text) == ["NO_REPLY"]


async def test_silence_filter_off_passes_everything() -> None:
    yaml_text = "policy: {silence: {enabled: false}}"
    assert await reply_to("NO_REPLY", yaml_text=yaml_text) == ["NO_REPLY"]


async def test_issue11_reasoning_never_reaches_the_room_even_with_silence_off() -> None:
    yaml_text = "policy: {silence: {enabled: false}}"
    thought = "<think>the user wants a haiku</think>Here it is."
    assert await reply_to(thought, yaml_text=yaml_text) == ["Here it is."]
    assert await reply_to("<thinking>only this</thinking>", yaml_text=yaml_text) == []


async def test_silence_counted() -> None:
    rig = PipelineRig(rig_config(), {"parrot": ConstantAgent("NO_REPLY")})
    await rig.start()
    connector = rig.connector()
    await connector.push(connector.message("hi"))
    await connector.push(connector.message("hi", mentions_bot=True))
    assert rig.metrics.value("guard_decisions_total", guard="silence", code="silent") == 1
    assert rig.metrics.value("guard_decisions_total", guard="silence", code="notice") == 1
    assert rig.metrics.value("replies_out_total", platform="room") == 1
