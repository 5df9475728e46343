"""Translation of MESSAGE_CREATE payloads, with payloads shaped like Discord's own."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from connectors.discord.inbound import BotIdentity, thread_name, to_inbound, translate_message
from connectors.skips import Skip
from gateway.app.types import InboundMessage

BOT = BotIdentity(bot_id="parrot-dc", user_id="900000000000000001")
OTHER_BOT_ID = "900000000000000002"
GUILD = "110000000000000001"
CHANNEL = "120000000000000001"
THREAD = "130000000000000001"

Json = dict[str, Any]


def user(user_id: object = "500000000000000001", name: str = "alice", **extra: Any) -> Json:
    return {
        "id": user_id,
        "username": name,
        "discriminator": "0",
        "global_name": name.title(),
        "avatar": None,
        "public_flags": 0,
        **extra,
    }


def payload(content: object = "hello", **overrides: Any) -> Json:
    """The `d` of a guild MESSAGE_CREATE, as Discord sends it."""
    data: Json = {
        "type": 0,
        "tts": False,
        "timestamp": "2026-01-01T10:00:00.000000+00:00",
        "pinned": False,
        "nonce": "1444",
        "mentions": [],
        "mention_roles": [],
        "mention_everyone": False,
        "member": {
            "roles": [],
            "nick": None,
            "mute": False,
            "joined_at": "2025-01-01T00:00:00+00:00",
            "flags": 0,
            "deaf": False,
        },
        "id": "140000000000000001",
        "flags": 0,
        "embeds": [],
        "edited_timestamp": None,
        "content": content,
        "components": [],
        "channel_id": CHANNEL,
        "author": user(),
        "attachments": [],
        "guild_id": GUILD,
    }
    data.update(overrides)
    return data


def reply_payload(content: str, *, to_author: Json, ping: bool = True, **overrides: Any) -> Json:
    """A reply (type 19) to a message by `to_author`; `ping` adds Discord's reply mention."""
    referenced = payload("earlier message", id="139999999999999999", author=to_author)
    fields: Json = {
        "type": 19,
        "mentions": [to_author] if ping else [],
        "message_reference": {
            "type": 0,
            "channel_id": CHANNEL,
            "guild_id": GUILD,
            "message_id": referenced["id"],
        },
        "referenced_message": referenced,
    }
    return payload(content, **{**fields, **overrides})


def translate(raw: object, **kwargs: Any) -> InboundMessage:
    result = translate_message(raw, bot=kwargs.pop("bot", BOT), **kwargs)
    assert isinstance(result, InboundMessage), result
    return result


def test_a_guild_message_becomes_an_inbound_message() -> None:
    raw = payload("hello there")
    message = translate(raw, received_at=12.5)
    assert message == InboundMessage(
        platform="discord",
        bot_id="parrot-dc",
        channel_id=CHANNEL,
        thread_id=None,
        message_id="140000000000000001",
        sender_id="500000000000000001",
        sender_name="Alice",
        sender_is_bot=False,
        text="hello there",
        mentions_bot=False,
        reply_to_bot=False,
        is_direct=False,
        received_at=12.5,
        bot_user_id=BOT.user_id,
        event_id="140000000000000001",
    )
    assert message.raw is raw
    assert message.room == f"discord:{CHANNEL}"


def test_the_guild_nickname_wins_over_the_global_name_and_the_username() -> None:
    nicked = payload(member={"nick": "Ali", "roles": []})
    assert translate(nicked).sender_name == "Ali"
    bare = payload(author=user(global_name=None))
    assert translate(bare).sender_name == "alice"


def test_bot_authors_and_webhooks_are_bots_and_unknown_botness_fails_closed() -> None:
    assert translate(payload(author=user(OTHER_BOT_ID, "echo", bot=True))).sender_is_bot
    assert translate(payload(webhook_id="77", author=user("77", "hook"))).sender_is_bot
    assert translate(payload(author=user(bot="yes"))).sender_is_bot
    assert not translate(payload(author=user(bot=False))).sender_is_bot


def test_a_dm_is_direct_and_has_no_guild() -> None:
    raw = payload("psst")
    del raw["guild_id"], raw["member"]
    message = translate(raw)
    assert message.is_direct
    assert message.addressed
    assert message.channel_id == CHANNEL
    assert message.thread_id is None


def test_a_thread_message_is_in_its_parent_channel_room_with_the_thread_id() -> None:
    message = translate(payload(channel_id=THREAD), thread_parent=CHANNEL)
    assert message.channel_id == CHANNEL
    assert message.thread_id == THREAD
    assert message.room == f"discord:{CHANNEL}"


def test_reply_in_thread_names_the_thread_the_reply_will_open() -> None:
    bot = BotIdentity(BOT.bot_id, BOT.user_id, reply_in_thread=True)
    message = translate(payload("open a thread"), bot=bot)
    assert message.thread_id == message.message_id
    in_thread = translate(payload(channel_id=THREAD), bot=bot, thread_parent=CHANNEL)
    assert in_thread.thread_id == THREAD
    dm = payload()
    del dm["guild_id"]
    assert translate(dm, bot=bot).thread_id is None


@pytest.mark.parametrize("mention", ["<@{id}>", "<@!{id}>"])
def test_an_explicit_mention_in_the_text_is_a_mention(mention: str) -> None:
    tag = mention.format(id=BOT.user_id)
    message = translate(payload(f"hey {tag} look", mentions=[user(BOT.user_id, "parrot")]))
    assert message.mentions_bot
    assert message.text == f"hey {tag} look"


def test_a_leading_mention_of_this_bot_is_removed_from_the_text() -> None:
    tag = f"<@{BOT.user_id}>"
    assert translate(payload(f"  {tag} /loop status")).text == "/loop status"
    assert translate(payload(tag)).text == tag  # nothing else said: keep the mention
    other = f"<@{OTHER_BOT_ID}> hi"
    assert translate(payload(other)).text == other


def test_a_mention_of_another_user_is_not_a_mention_of_this_bot() -> None:
    message = translate(payload(f"<@{OTHER_BOT_ID}> hi", mentions=[user(OTHER_BOT_ID, "echo")]))
    assert not message.mentions_bot


def test_the_automatic_reply_mention_is_a_reply_not_a_mention() -> None:
    me = user(BOT.user_id, "parrot", bot=True)
    from_bot = reply_payload("echo: hi", to_author=me, author=user(OTHER_BOT_ID, "echo", bot=True))
    message = translate(from_bot)
    assert message.reply_to_bot
    assert not message.mentions_bot
    assert message.sender_is_bot


def test_a_reply_that_also_mentions_the_bot_in_the_text_is_both() -> None:
    me = user(BOT.user_id, "parrot", bot=True)
    message = translate(reply_payload(f"<@{BOT.user_id}> and you?", to_author=me))
    assert message.reply_to_bot
    assert message.mentions_bot


def test_a_reply_to_someone_else_that_pings_this_bot_in_mentions_is_a_mention() -> None:
    raw = reply_payload("hi", to_author=user())
    raw["mentions"].append(user(BOT.user_id, "parrot", bot=True))
    message = translate(raw)
    assert not message.reply_to_bot
    assert message.mentions_bot


def test_a_reply_without_ping_to_the_bot_is_still_a_reply() -> None:
    me = user(BOT.user_id, "parrot", bot=True)
    message = translate(reply_payload("quietly", to_author=me, ping=False))
    assert message.reply_to_bot
    assert not message.mentions_bot


def test_a_reply_to_a_deleted_message_that_pings_the_bot_counts_as_a_reply() -> None:
    me = user(BOT.user_id, "parrot", bot=True)
    raw = reply_payload("where did it go", to_author=me, referenced_message=None)
    message = translate(raw)
    assert message.reply_to_bot
    assert not message.mentions_bot


def test_a_forward_is_not_a_reply() -> None:
    me = user(BOT.user_id, "parrot", bot=True)
    raw = reply_payload("fwd", to_author=me)
    raw["message_reference"]["type"] = 1
    raw["mentions"] = []
    message = translate(raw)
    assert not message.reply_to_bot
    assert not message.mentions_bot


def test_the_bots_own_message_is_dropped() -> None:
    raw = payload("echo: hi", author=user(BOT.user_id, "parrot", bot=True))
    assert translate_message(raw, bot=BOT) is Skip.OWN


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(
            payload("", attachments=[{"id": "1", "filename": "cat.png"}]), id="attachment"
        ),
        pytest.param(payload("   "), id="blank"),
        pytest.param(payload("", sticker_items=[{"id": "1", "name": "wave"}]), id="sticker"),
    ],
)
def test_a_message_without_text_is_dropped(raw: Json) -> None:
    assert translate_message(raw, bot=BOT) is Skip.NO_TEXT


@pytest.mark.parametrize("kind", [6, 7, 8, 18, 21, 46])
def test_system_messages_are_dropped(kind: int) -> None:
    assert translate_message(payload("joined", type=kind), bot=BOT) is Skip.SERVICE


def test_command_messages_are_conversation() -> None:
    bot_author = user(OTHER_BOT_ID, "echo", bot=True)
    assert translate(payload("result", type=20, author=bot_author)).sender_is_bot
    assert translate(payload("menu", type=23, author=bot_author)).text == "menu"


def test_the_system_user_is_a_service_message() -> None:
    raw = payload("Welcome!", author=user("643945264868098049", "Discord", system=True))
    assert translate_message(raw, bot=BOT) is Skip.SERVICE


@pytest.mark.parametrize(
    "author",
    [pytest.param(None, id="null"), pytest.param({}, id="empty"), pytest.param("x", id="text")],
)
def test_a_message_without_a_sender_is_dropped(author: object) -> None:
    raw = payload("from nobody", author=author)
    assert translate_message(raw, bot=BOT) is Skip.NO_SENDER
    missing = payload("from nobody")
    del missing["author"]
    assert translate_message(missing, bot=BOT) is Skip.NO_SENDER


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(None, id="null"),
        pytest.param([1, 2], id="list"),
        pytest.param(payload(id=None), id="no-id"),
        pytest.param(payload(id="abc"), id="bad-id"),
        pytest.param(payload(channel_id=None), id="no-channel"),
        pytest.param(payload(content=None), id="null-content"),
        pytest.param(payload(content=["x"]), id="list-content"),
    ],
)
def test_malformed_payloads_are_dropped(raw: object) -> None:
    assert translate_message(raw, bot=BOT) is Skip.MALFORMED
    assert to_inbound(raw, bot=BOT) is None


@pytest.mark.parametrize("kind", ["0", None, True, 3.0])
def test_an_odd_type_is_not_conversation(kind: object) -> None:
    assert translate_message(payload(type=kind), bot=BOT) is Skip.SERVICE


def test_odd_field_values_never_raise() -> None:
    raw = payload(
        f"<@{BOT.user_id}> hi",
        mentions="everyone",
        member=["x"],
        message_reference={"message_id": 5},
        referenced_message="gone",
    )
    message = translate(raw)
    assert message.mentions_bot
    assert not message.reply_to_bot


def test_integer_ids_are_accepted_as_text() -> None:
    raw = payload(id=140000000000000001, channel_id=int(CHANNEL), author=user(user_id=5))
    message = translate(raw)
    assert (message.message_id, message.channel_id, message.sender_id) == (
        "140000000000000001",
        CHANNEL,
        "5",
    )


def test_to_inbound_does_not_modify_the_payload() -> None:
    raw = reply_payload(f"<@{BOT.user_id}> hi", to_author=user())
    before = copy.deepcopy(raw)
    assert to_inbound(raw, bot=BOT) is not None
    assert raw == before


def test_thread_names_are_the_first_line_shortened() -> None:
    assert thread_name("\n  Can you help with the deploy?\nmore") == "Can you help with the deploy?"
    long = thread_name("x" * 200)
    assert len(long) == 80
    assert long.endswith("…")
    assert thread_name("   ") == "reply"
