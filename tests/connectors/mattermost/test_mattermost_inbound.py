"""Unit tests of the pure Mattermost translation, on websocket events shaped like the server's."""

from __future__ import annotations

import json
from typing import Any

import pytest

from connectors.mattermost.inbound import (
    BotIdentity,
    is_bot_flagged,
    parse_frame,
    to_inbound,
    translate_event,
)
from connectors.skips import Skip
from gateway.app.types import InboundMessage

BOT = BotIdentity(bot_id="helper-mm", user_id="bot0000000000000000000000a", username="helper")
ALICE = "alice00000000000000000000a"
CHANNEL = "chan0000000000000000000000"


def posted(
    message: str = "hello there",
    *,
    user_id: str = ALICE,
    root_id: str = "",
    props: dict[str, Any] | None = None,
    post_type: str = "",
    channel_type: str = "O",
    sender_name: str = "@alice",
    mentions: list[str] | None = None,
    event: str = "posted",
) -> dict[str, Any]:
    """A `posted` event as the server sends it: the post a JSON string inside `data`."""
    post = {
        "id": "post0000000000000000000000",
        "create_at": 1_700_000_000_000,
        "update_at": 1_700_000_000_000,
        "user_id": user_id,
        "channel_id": CHANNEL,
        "root_id": root_id,
        "message": message,
        "type": post_type,
        "props": props or {},
    }
    data: dict[str, Any] = {
        "channel_display_name": "Town Square",
        "channel_name": "town-square",
        "channel_type": channel_type,
        "post": json.dumps(post),
        "sender_name": sender_name,
        "set_online": True,
        "team_id": "team0000000000000000000000",
    }
    if mentions is not None:
        data["mentions"] = json.dumps(mentions)
    return {"event": event, "data": data, "broadcast": {"channel_id": CHANNEL}, "seq": 3}


def message(frame: dict[str, Any]) -> InboundMessage:
    result = translate_event(frame, bot=BOT, received_at=12.5)
    assert isinstance(result, InboundMessage), result
    return result


def test_issue23_a_person_in_a_channel_is_a_human_message_keyed_by_the_post() -> None:
    got = message(posted())
    assert (got.platform, got.bot_id, got.channel_id, got.message_id) == (
        "mattermost",
        "helper-mm",
        CHANNEL,
        "post0000000000000000000000",
    )
    assert (got.sender_id, got.sender_name, got.sender_is_bot) == (ALICE, "alice", False)
    assert (got.text, got.thread_id, got.mentions_bot, got.is_direct) == (
        "hello there",
        None,
        False,
        False,
    )
    assert got.event_id is None  # seq restarts per connection: dedupe by channel + post id
    assert got.bot_user_id == BOT.user_id
    assert got.received_at == 12.5


def test_issue23_thread_replies_carry_root_id_and_direct_channels_are_direct() -> None:
    assert message(posted(root_id="root0000000000000000000000")).thread_id == (
        "root0000000000000000000000"
    )
    assert message(posted(channel_type="D")).is_direct
    assert not message(posted(channel_type="G")).is_direct


@pytest.mark.parametrize(
    ("props", "expected"),
    [
        ({"from_bot": "true"}, True),
        ({"from_webhook": "true", "override_username": "ci"}, True),
        ({"from_bot": True}, True),
        ({"from_bot": "false"}, False),
        ({}, False),
    ],
)
def test_issue23_bots_are_the_posts_flagged_from_bot_or_from_webhook(
    props: dict[str, Any], expected: bool
) -> None:
    assert message(posted(props=props)).sender_is_bot is expected
    assert is_bot_flagged({"props": props}) is expected
    assert not is_bot_flagged({"props": "from_bot"})


def test_issue23_mentions_by_the_mentions_field_or_at_username_and_a_leading_one_is_removed() -> (
    None
):
    by_field = message(posted("can you look?", mentions=[BOT.user_id]))
    assert by_field.mentions_bot
    lead = message(posted("@Helper: !loop status"))
    assert (lead.mentions_bot, lead.text) == (True, "!loop status")
    inside = message(posted("ask @helper about it"))
    assert (inside.mentions_bot, inside.text) == (True, "ask @helper about it")
    assert message(posted("@helper")).text == "@helper"
    for other in ("@helper2 hi", "@helper-bot hi", "mail a@helper.org", "@helper.bot hi"):
        assert not message(posted(other)).mentions_bot, other
    assert not message(posted("hi", mentions=["someone0000000000000000000"])).mentions_bot
    assert not message(posted("hi", mentions=None)).mentions_bot


@pytest.mark.parametrize(
    ("frame", "skip"),
    [
        (posted(user_id=BOT.user_id), Skip.OWN),
        (posted(post_type="system_join_channel"), Skip.SERVICE),
        (posted("   "), Skip.NO_TEXT),
        (posted(user_id=""), Skip.NO_SENDER),
        (posted(event="post_edited"), Skip.UNSUPPORTED),
        ({"event": "typing", "data": {}}, Skip.UNSUPPORTED),
        ({"event": "posted", "data": "nope"}, Skip.MALFORMED),
        ({"event": "posted", "data": {"post": "{not json"}}, Skip.MALFORMED),
        ({"event": "posted", "data": {"post": json.dumps({"id": 5})}}, Skip.MALFORMED),
        ({"event": "posted", "data": {"post": "[1, 2]"}}, Skip.MALFORMED),
    ],
)
def test_issue23_odd_and_unanswerable_events_are_dropped_with_a_reason(
    frame: dict[str, Any], skip: Skip
) -> None:
    assert translate_event(frame, bot=BOT) is skip
    assert to_inbound(frame, bot=BOT) is None


def test_issue23_hostile_frames_are_refused_without_raising() -> None:
    assert parse_frame("{not json") is None
    assert parse_frame("[1]") is None
    assert parse_frame('{"a": ' * 100 + "1" + "}" * 100) is None  # nested too deep
    assert parse_frame('{"n": ' + "9" * 5000 + "}") is None  # beyond the digit limit
    assert parse_frame("x" * (1024 * 1024 + 1)) is None
    frame = posted("hi")
    frame["data"]["mentions"] = "{" * 5000
    assert not message(frame).mentions_bot
