"""Unit tests of the pure Slack translation, on payloads shaped like real Events API bodies."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from connectors.skips import Skip
from connectors.slack.inbound import (
    BotIdentity,
    to_inbound,
    translate_command,
    translate_event,
    translate_payload,
)
from gateway.app.types import InboundMessage

BOT = BotIdentity(bot_id="parrot-sl", user_id="U0PARROT", app_bot_id="B0PARROT", team_id="T0FAKE")

CHANNEL_MESSAGE: dict[str, Any] = {
    "token": "XXYYZZ",
    "team_id": "T0FAKE",
    "api_app_id": "A0PARROT",
    "event": {
        "type": "message",
        "channel": "C2147483705",
        "user": "U2147483697",
        "text": "Hello world",
        "ts": "1355517523.000005",
        "event_ts": "1355517523.000005",
        "channel_type": "channel",
        "client_msg_id": "5d8e4b2a-0000-4c5e-9b1a-7f0c2d1e3f4a",
        "team": "T0FAKE",
        "blocks": [{"type": "rich_text", "block_id": "x", "elements": []}],
    },
    "type": "event_callback",
    "authorizations": [{"team_id": "T0FAKE", "user_id": "U0PARROT", "is_bot": True}],
    "event_id": "Ev0PV52K21",
    "event_time": 1355517523,
}

BOT_MESSAGE: dict[str, Any] = {
    "type": "message",
    "text": "echo: Hello world",
    "user": "U0ECHO",
    "ts": "1355517524.000006",
    "bot_id": "B0ECHO",
    "app_id": "A0ECHO",
    "bot_profile": {"id": "B0ECHO", "name": "echo", "app_id": "A0ECHO", "team_id": "T0FAKE"},
    "channel": "C2147483705",
    "event_ts": "1355517524.000006",
    "channel_type": "channel",
}

APP_MENTION: dict[str, Any] = {
    "type": "app_mention",
    "user": "U061F7AUR",
    "text": "<@U0PARROT> is it everything a river should be?",
    "ts": "1515449522.000016",
    "channel": "C0LAN2Q65",
    "event_ts": "1515449522000016",
}


def payload(**event: Any) -> dict[str, Any]:
    """The channel message payload with some event fields replaced (None removes one)."""
    body = copy.deepcopy(CHANNEL_MESSAGE)
    for key, value in event.items():
        if value is None:
            body["event"].pop(key, None)
        else:
            body["event"][key] = value
    return body


def inbound(raw: object) -> InboundMessage:
    result = translate_payload(raw, bot=BOT, received_at=12.5)
    assert isinstance(result, InboundMessage), result
    return result


def skip(raw: object) -> Skip:
    result = translate_payload(raw, bot=BOT)
    assert isinstance(result, Skip), result
    return result


def test_channel_message_from_a_human() -> None:
    message = inbound(CHANNEL_MESSAGE)
    assert message.platform == "slack"
    assert message.bot_id == "parrot-sl"
    assert message.bot_user_id == "U0PARROT"
    assert message.channel_id == "C2147483705"
    assert message.thread_id is None
    assert message.message_id == "1355517523.000005"
    assert message.event_id is None
    assert message.sender_id == "U2147483697"
    assert message.sender_name == "U2147483697"
    assert message.sender_is_bot is False
    assert message.text == "Hello world"
    assert not message.mentions_bot
    assert not message.reply_to_bot
    assert not message.is_direct
    assert message.received_at == 12.5
    assert message.raw == CHANNEL_MESSAGE["event"]
    assert message.room == "slack:C2147483705"


def test_to_inbound_returns_none_for_a_drop() -> None:
    assert to_inbound(CHANNEL_MESSAGE, bot=BOT) is not None
    assert to_inbound({"type": "event_callback", "event": {"type": "pin_added"}}, bot=BOT) is None


def test_bot_message_with_user_and_bot_id() -> None:
    message = inbound({**CHANNEL_MESSAGE, "event": BOT_MESSAGE})
    assert message.sender_is_bot
    assert message.sender_id == "U0ECHO"
    assert message.sender_name == "echo"


def test_legacy_bot_message_subtype_without_user() -> None:
    event = {
        "type": "message",
        "subtype": "bot_message",
        "text": "a webhook says hi",
        "ts": "1358877455.000010",
        "username": "hookbot",
        "bot_id": "BB12033",
        "channel": "C2147483705",
    }
    message = inbound({**CHANNEL_MESSAGE, "event": event})
    assert message.sender_is_bot
    assert message.sender_id == "BB12033"
    assert message.sender_name == "hookbot"


def test_bot_profile_alone_marks_a_bot() -> None:
    event = {k: v for k, v in BOT_MESSAGE.items() if k != "bot_id"}
    assert inbound({**CHANNEL_MESSAGE, "event": event}).sender_is_bot


@pytest.mark.parametrize(
    "event",
    [
        {**BOT_MESSAGE, "user": "U0PARROT", "bot_id": "B0PARROT"},
        {**BOT_MESSAGE, "user": "U0PARROT", "bot_id": None},
        {
            "type": "message",
            "subtype": "bot_message",
            "bot_id": "B0PARROT",
            "text": "mine",
            "ts": "1.0",
            "channel": "C1",
        },
    ],
    ids=["user-and-bot-id", "user-only", "bot-id-only"],
)
def test_own_messages_are_dropped(event: dict[str, Any]) -> None:
    event = {k: v for k, v in event.items() if v is not None}
    assert skip({**CHANNEL_MESSAGE, "event": event}) is Skip.OWN


def test_app_mention_strips_the_leading_mention_and_counts_as_one() -> None:
    message = inbound({**CHANNEL_MESSAGE, "event": APP_MENTION})
    assert message.mentions_bot
    assert message.text == "is it everything a river should be?"
    assert message.message_id == "1515449522.000016"
    assert message.is_direct is False


def test_message_and_app_mention_of_one_post_share_their_keys() -> None:
    as_message = inbound(payload(text="<@U0PARROT> hi", ts="5.5"))
    mention = {**CHANNEL_MESSAGE["event"], "type": "app_mention", "text": "<@U0PARROT> hi"}
    mention["ts"] = "5.5"
    as_mention = inbound({**CHANNEL_MESSAGE, "event_id": "Ev2", "event": mention})
    assert as_message.delivery_key == as_mention.delivery_key
    assert as_message.mentions_bot
    assert as_mention.mentions_bot
    assert as_message.text == as_mention.text == "hi"


def test_redelivery_with_another_event_id_has_the_same_delivery_key() -> None:
    first = inbound(CHANNEL_MESSAGE)
    again = inbound({**CHANNEL_MESSAGE, "event_id": "Ev0OTHER"})
    assert first.delivery_key == again.delivery_key


@pytest.mark.parametrize(
    ("text", "mentions", "cleaned"),
    [
        ("<@U0PARROT|parrot> !loop status", True, "!loop status"),
        ("  <@U0PARROT>: hello", True, "hello"),
        ("hey <@U0PARROT> look", True, "hey <@U0PARROT> look"),
        ("<@U0PARROT>", True, "<@U0PARROT>"),
        ("<@U0PARROTX> hi", False, "<@U0PARROTX> hi"),
        ("<@U0OTHER> hi", False, "<@U0OTHER> hi"),
        ("@parrot hi", False, "@parrot hi"),
    ],
)
def test_mentions(text: str, mentions: bool, cleaned: str) -> None:
    message = inbound(payload(text=text))
    assert message.mentions_bot is mentions
    assert message.text == cleaned


def test_thread_reply_under_the_bot() -> None:
    message = inbound(payload(thread_ts="1355517500.000001", parent_user_id="U0PARROT"))
    assert message.thread_id == "1355517500.000001"
    assert message.reply_to_bot
    assert message.addressed


def test_thread_reply_under_someone_else() -> None:
    message = inbound(payload(thread_ts="1355517500.000001", parent_user_id="U0BOB"))
    assert message.thread_id == "1355517500.000001"
    assert not message.reply_to_bot


def test_a_thread_parent_is_not_in_a_thread() -> None:
    message = inbound(payload(thread_ts="1355517523.000005", parent_user_id="U0PARROT"))
    assert message.thread_id is None
    assert not message.reply_to_bot


def test_direct_message() -> None:
    assert inbound(payload(channel="D024BE91L", channel_type="im")).is_direct
    assert inbound(payload(channel="G024BE91L", channel_type="group")).is_direct is False
    mention_in_dm = {**APP_MENTION, "channel": "D024BE91L"}
    assert inbound({**CHANNEL_MESSAGE, "event": mention_in_dm}).is_direct


def test_display_name_from_the_user_profile() -> None:
    profile = {"display_name": "", "real_name": "Alice Liddell", "name": "alice"}
    assert inbound(payload(user_profile=profile)).sender_name == "Alice Liddell"


@pytest.mark.parametrize("subtype", ["file_share", "thread_broadcast", "me_message"])
def test_text_subtypes_are_messages(subtype: str) -> None:
    assert inbound(payload(subtype=subtype)).text == "Hello world"


@pytest.mark.parametrize(
    "subtype",
    ["message_changed", "message_deleted", "channel_join", "channel_topic", "pinned_item"],
)
def test_service_subtypes_are_dropped(subtype: str) -> None:
    assert skip(payload(subtype=subtype)) is Skip.SERVICE


def test_file_share_without_text_is_dropped() -> None:
    assert skip(payload(subtype="file_share", text="", files=[{"id": "F1"}])) is Skip.NO_TEXT
    assert skip(payload(text="   ")) is Skip.NO_TEXT
    assert skip(payload(text=None)) is Skip.NO_TEXT


def test_message_without_a_sender_is_dropped() -> None:
    assert skip(payload(user=None)) is Skip.NO_SENDER


@pytest.mark.parametrize(
    "raw",
    [
        None,
        "text",
        [1, 2],
        {"type": "event_callback"},
        {"type": "event_callback", "event": "message"},
        payload(channel=None),
        payload(ts=None),
        payload(channel=5),
        payload(ts=1355517523.5),
    ],
)
def test_malformed_payloads(raw: object) -> None:
    assert skip(raw) is Skip.MALFORMED


@pytest.mark.parametrize(
    "raw",
    [
        {"type": "url_verification", "challenge": "abc", "token": "x"},
        {"type": "app_rate_limited", "minute_rate_limited": 1518467820},
        {"type": "event_callback", "event": {"type": "reaction_added", "user": "U1"}},
        {"type": "event_callback", "event": {"type": "member_joined_channel", "user": "U1"}},
        {"type": "block_actions", "actions": []},
    ],
)
def test_unsupported_payloads(raw: object) -> None:
    assert skip(raw) is Skip.UNSUPPORTED


def test_odd_field_types_do_not_raise() -> None:
    odd = payload(user=["U1"], bot_id=7, text={"t": 1}, thread_ts=3, channel_type=None)
    assert skip(odd) is Skip.NO_SENDER
    assert translate_event({"type": 1}, bot=BOT) is Skip.UNSUPPORTED


SLASH: dict[str, Any] = {
    "token": "gIkuvaNzQIHg97ATvDxqgjtO",
    "team_id": "T0FAKE",
    "team_domain": "example",
    "channel_id": "C2147483705",
    "channel_name": "test",
    "user_id": "U2147483697",
    "user_name": "Steve",
    "command": "/loop",
    "text": " reset ",
    "api_app_id": "A123456",
    "response_url": "https://hooks.slack.com/commands/1234/5678",
    "trigger_id": "13345224609.738474920.8088930838d88f008e0",
}


def test_slash_command_becomes_loop_text() -> None:
    message = inbound(SLASH)
    assert message.text == "/loop reset"
    assert message.message_id == SLASH["trigger_id"]
    assert message.sender_id == "U2147483697"
    assert message.sender_name == "Steve"
    assert not message.sender_is_bot
    assert message.mentions_bot
    assert not message.is_direct


def test_slash_command_without_text_and_in_a_dm() -> None:
    dm = {**SLASH, "text": "", "channel_id": "D1", "channel_name": "directmessage"}
    message = inbound(dm)
    assert message.text == "/loop"
    assert message.is_direct


def test_other_or_broken_slash_commands_are_dropped() -> None:
    assert translate_command({**SLASH, "command": "/weather"}, bot=BOT) is Skip.UNSUPPORTED
    assert translate_command({**SLASH, "trigger_id": None}, bot=BOT) is Skip.MALFORMED
    assert translate_command({**SLASH, "user_id": ""}, bot=BOT) is Skip.NO_SENDER
