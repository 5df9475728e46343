"""Pure translation of Matrix timeline events (connectors.matrix.inbound), and replies out."""

from __future__ import annotations

from typing import Any

import pytest

from connectors.matrix.inbound import (
    BotIdentity,
    encryption_seen,
    member_names,
    to_inbound,
    translate_event,
)
from connectors.matrix.outbound import retry_after, to_content, to_edit, transaction_id
from connectors.skips import Skip
from gateway.app.types import InboundMessage, Reply

BOT = BotIdentity("helper-mx", "@helper:example.org", ("@telegram_*:example.org",))
ROOM = "!room:example.org"
SINCE = 1_000


def _event(**content: Any) -> dict[str, Any]:
    event: dict[str, Any] = {
        "type": "m.room.message",
        "event_id": "$e1",
        "sender": "@alice:example.org",
        "origin_server_ts": SINCE + 1,
        "content": {"msgtype": "m.text", "body": "hello", **content},
    }
    return event


def _message(event: object, **kwargs: Any) -> InboundMessage:
    result = translate_event(event, room_id=ROOM, bot=BOT, since_ms=SINCE, **kwargs)
    assert isinstance(result, InboundMessage), result
    return result


def test_issue23_a_text_message_becomes_an_inbound_message() -> None:
    message = _message(_event(), names={"@alice:example.org": "Alice"})

    assert (message.platform, message.channel_id, message.message_id) == ("matrix", ROOM, "$e1")
    assert (message.sender_id, message.sender_name, message.text) == (
        "@alice:example.org",
        "Alice",
        "hello",
    )
    assert not message.sender_is_bot
    assert not message.mentions_bot
    assert message.thread_id is None
    assert message.event_id is None
    assert message.bot_user_id == "@helper:example.org"


def test_issue23_notice_senders_and_bot_users_globs_are_bots() -> None:
    notice = _message(_event(msgtype="m.notice"))
    bridged = _message({**_event(), "sender": "@telegram_42:example.org"})
    lookalike = _message({**_event(), "sender": "@Telegram_42:example.org"})

    assert notice.sender_is_bot
    assert bridged.sender_is_bot
    assert not lookalike.sender_is_bot  # Matrix ids are case-sensitive


@pytest.mark.parametrize(
    "content",
    [
        {"m.mentions": {"user_ids": ["@helper:example.org"]}},
        {"formatted_body": '<a href="https://matrix.to/#/@helper:example.org">helper</a>: hi'},
        {"formatted_body": '<a href="https://matrix.to/#/%40helper:example.org">h</a>'},
    ],
)
def test_issue23_mentions_by_m_mentions_and_pills(content: dict[str, Any]) -> None:
    assert _message(_event(**content)).mentions_bot


def test_issue23_m_mentions_naming_others_is_no_mention_even_if_the_body_names_the_bot() -> None:
    event = _event(body="@helper:example.org said", **{"m.mentions": {"user_ids": []}})
    assert not _message(event).mentions_bot
    assert _message(_event(body="ask @helper:example.org")).mentions_bot


def test_issue23_a_leading_mention_is_removed_so_commands_reach_the_admin_stage() -> None:
    event = _event(
        body="helper: /loop status", **{"m.mentions": {"user_ids": ["@helper:example.org"]}}
    )
    assert _message(event).text == "/loop status"


def test_issue23_threads_are_m_thread_roots() -> None:
    event = _event(**{"m.relates_to": {"rel_type": "m.thread", "event_id": "$root"}})
    assert _message(event).thread_id == "$root"


@pytest.mark.parametrize(
    ("event", "skip"),
    [
        ({**_event(), "type": "m.room.encrypted"}, Skip.ENCRYPTED),
        ({**_event(), "sender": "@helper:example.org"}, Skip.OWN),
        ({**_event(), "origin_server_ts": SINCE - 1}, Skip.HISTORY),
        ({**_event(), "origin_server_ts": "soon"}, Skip.HISTORY),
        (_event(msgtype="m.image"), Skip.NO_TEXT),
        (_event(body="  "), Skip.NO_TEXT),
        (
            _event(**{"m.relates_to": {"rel_type": "m.replace", "event_id": "$e0"}}),
            Skip.UNSUPPORTED,
        ),
        ({**_event(), "type": "m.reaction"}, Skip.UNSUPPORTED),
        ({**_event(), "state_key": ""}, Skip.UNSUPPORTED),
        ({**_event(), "sender": None}, Skip.NO_SENDER),
        ({**_event(), "content": "x"}, Skip.MALFORMED),
        ({**_event(), "event_id": 7}, Skip.MALFORMED),
        (["not", "an", "event"], Skip.MALFORMED),
    ],
)
def test_issue23_events_that_are_not_answered_say_why(event: object, skip: Skip) -> None:
    assert translate_event(event, room_id=ROOM, bot=BOT, since_ms=SINCE) == skip
    assert to_inbound(event, room_id=ROOM, bot=BOT, since_ms=SINCE) is None


def test_issue23_a_message_in_an_encrypted_room_is_refused() -> None:
    result = translate_event(_event(), room_id=ROOM, bot=BOT, since_ms=SINCE, encrypted=True)
    assert result is Skip.ENCRYPTED


def test_issue23_room_state_gives_encryption_and_display_names() -> None:
    events: list[object] = [
        {
            "type": "m.room.member",
            "state_key": "@bob:example.org",
            "content": {"displayname": "Bob"},
        },
        {"type": "m.room.member", "state_key": "@eve:example.org", "content": {"displayname": " "}},
        {"type": "m.room.encryption", "state_key": "", "content": {"algorithm": "m.megolm.v1"}},
        "junk",
    ]
    assert encryption_seen(events)
    assert not encryption_seen(events[:2])
    assert member_names(events) == {"@bob:example.org": "Bob"}


def test_issue23_replies_are_notices_that_ping_nobody_in_the_thread() -> None:
    content = to_content(Reply("hi", thread_id="$root", reply_to="$q"), msgtype="m.notice")

    assert content["msgtype"] == "m.notice"
    assert content["m.mentions"] == {}
    assert content["m.relates_to"]["rel_type"] == "m.thread"
    assert content["m.relates_to"]["event_id"] == "$root"
    assert content["m.relates_to"]["m.in_reply_to"] == {"event_id": "$q"}
    edit = to_edit("$posted", Reply("more"), msgtype="m.notice")
    assert edit["m.new_content"]["body"] == "more"
    assert edit["m.relates_to"] == {"rel_type": "m.replace", "event_id": "$posted"}


def test_issue23_transaction_ids_are_derived_from_what_is_sent() -> None:
    first = transaction_id("helper-mx", ROOM, "$e1", 0, "hi")
    assert first == transaction_id("helper-mx", ROOM, "$e1", 0, "hi")
    assert first != transaction_id("helper-mx", ROOM, "$e1", 1, "hi")
    assert first != transaction_id("other-mx", ROOM, "$e1", 0, "hi")


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (2500, 2.5),
        (0, 0.0),
        (None, 1.0),
        ("soon", 1.0),
        (-5, 1.0),
        (float("nan"), 1.0),
        (10**12, 3600.0),
    ],
)
def test_issue23_retry_after_ms_is_read_safely(value: object, seconds: float) -> None:
    assert retry_after(value) == seconds
