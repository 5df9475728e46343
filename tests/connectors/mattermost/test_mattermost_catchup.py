"""The pure catch-up reading: positions, the channel list, `since` answers (no I/O)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from connectors.mattermost.catchup import (
    MAX_IDS_AT_ONE_MS,
    ChannelInfo,
    Position,
    as_event,
    listed_posts,
    member_channels,
    new_posts,
    parse_position,
)
from connectors.mattermost.inbound import BotIdentity, translate_event
from gateway.app.types import InboundMessage

BOT = BotIdentity(bot_id="helper-mm", user_id="b" * 26, username="helper")
TOWN = ChannelInfo("c" * 26, "O", 1_700_000_000_500)


def post(post_id: str, create_at: object, **fields: Any) -> dict[str, Any]:
    return {
        "id": post_id,
        "create_at": create_at,
        "update_at": create_at,
        "delete_at": 0,
        "user_id": "u" * 26,
        "channel_id": TOWN.id,
        "root_id": "",
        "message": f"post {post_id}",
        "type": "",
        "props": {},
        **fields,
    }


def test_issue23_a_position_keeps_the_posts_of_its_millisecond_so_none_is_missed_or_repeated() -> (
    None
):
    start = Position(100)
    one = start.after(105, "a")
    two = one.after(105, "b")
    assert two == Position(105, frozenset({"a", "b"}))
    assert not two.is_new(105, "a")
    assert two.is_new(105, "c")
    assert not two.is_new(104, "z")
    assert two.after(104, "z") is two  # an older post does not move it back
    assert two.after(106, "c") == Position(106, frozenset({"c"}))
    assert two.since() == 104  # `update_at > 104` brings the posts created at 105 too
    assert Position(0).since() == 0


def test_issue23_a_position_holds_a_bounded_number_of_ids_for_one_millisecond() -> None:
    position = Position(7)
    for n in range(MAX_IDS_AT_ONE_MS + 50):
        position = position.after(7, f"id{n}")
    assert len(position.ids) == MAX_IDS_AT_ONE_MS


@pytest.mark.parametrize(
    "saved",
    [
        None,
        "",
        "{not json",
        "[]",
        '{"at": "5", "ids": []}',
        '{"at": true, "ids": []}',
        '{"at": -1, "ids": []}',
        '{"at": 1e300, "ids": []}',
        '{"at": NaN, "ids": []}',
        '{"at": ' + "9" * 5000 + ', "ids": []}',
        '{"at": 5, "ids": "abc"}',
        '{"at": 5, "ids": [1]}',
        json.dumps({"at": 5, "ids": [f"id{n}" for n in range(MAX_IDS_AT_ONE_MS + 1)]}),
        "[" * 100_000,
    ],
)
def test_issue23_a_saved_position_that_is_not_one_is_ignored(saved: str | None) -> None:
    assert parse_position(saved) is None


def test_issue23_a_position_survives_its_saved_form() -> None:
    position = Position(1_700_000_000_123, frozenset({"a", "b"}))
    assert parse_position(position.dumps()) == position


def test_issue23_the_channel_list_keeps_live_channels_and_leaves_out_odd_entries() -> None:
    answer = [
        {"id": "a" * 26, "type": "O", "last_post_at": 10, "delete_at": 0},
        {"id": "d" * 26, "type": "D", "last_post_at": 20},
        {"id": "x" * 26, "type": "O", "last_post_at": 30, "delete_at": 99},  # archived
        {"id": 5, "type": "O"},
        {"id": "", "type": "O"},
        {"id": "y" * 26, "type": None},
        {"id": "z" * 26, "type": "P", "last_post_at": "soon"},
        "not a channel",
    ]
    assert member_channels(answer) == [
        ChannelInfo("a" * 26, "O", 10),
        ChannelInfo("d" * 26, "D", 20),
        ChannelInfo("z" * 26, "P", 0),
    ]
    assert member_channels([]) == []
    assert member_channels({"channels": []}) is None  # not the list: the catch-up is incomplete
    assert member_channels(None) is None


def test_issue23_new_posts_are_the_live_ones_after_the_position_oldest_first() -> None:
    position = Position(200, frozenset({"seen"}))
    answer = {
        "order": ["n2", "n1", "same", "seen", "edited", "deleted", "root"],
        "posts": {
            "n2": post("n2", 300),
            "n1": post("n1", 250),
            "same": post("same", 200),  # the position's millisecond, not handled yet
            "seen": post("seen", 200),
            "edited": post("edited", 150, update_at=260, edit_at=260),
            "deleted": post("deleted", 280, update_at=290, delete_at=290),
            "root": post("root", 50),  # a thread's root, answered for its new reply
            "odd": post("odd", "yesterday"),
            "junk": "not a post",
        },
    }
    listed = listed_posts(answer)
    assert listed is not None
    assert [p["id"] for p in new_posts(listed, position)] == ["same", "n1", "n2"]
    assert listed_posts({"posts": {}}) == []
    assert listed_posts({"posts": []}) is None
    assert listed_posts("down") is None


def test_issue23_a_caught_up_post_translates_as_its_live_event_would() -> None:
    direct = ChannelInfo("d" * 26, "D", 0)
    hooked = post(
        "p" * 26,
        5,
        channel_id=direct.id,
        message="@helper hello",
        props={"from_webhook": "true", "override_username": "ci"},
    )
    message = translate_event(as_event(hooked, direct), bot=BOT)
    assert isinstance(message, InboundMessage)
    assert (message.text, message.is_direct, message.sender_is_bot, message.mentions_bot) == (
        "hello",
        True,
        True,
        True,
    )
    assert message.sender_name == "ci"
    plain = translate_event(as_event(post("q" * 26, 6), TOWN), bot=BOT)
    assert isinstance(plain, InboundMessage)
    assert (plain.sender_name, plain.is_direct) == ("u" * 26, False)


@given(
    handled=st.lists(
        st.tuples(st.integers(0, 20), st.text("abcdef", min_size=1, max_size=3)),
        max_size=40,
        unique_by=lambda post: post[1],
    ),
    later=st.tuples(st.integers(0, 25), st.text("xyz", min_size=1, max_size=3)),
)
def test_issue23_a_position_never_takes_a_handled_post_again_nor_misses_a_newer_one(
    handled: list[tuple[int, str]], later: tuple[int, str]
) -> None:
    position = Position(0)
    for create_at, post_id in sorted(handled):  # a channel's posts are handled in order
        position = position.after(create_at, post_id)
    assert not any(position.is_new(*post) for post in handled)
    newest = max((create_at for create_at, _ in handled), default=-1)
    if later[0] >= newest:  # a post not handled yet, created no earlier than the newest
        assert position.is_new(*later)
