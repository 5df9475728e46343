"""Unit tests of the pure Telegram translation, on payloads shaped like real Bot API updates."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from telegram import Message

from connectors.skips import Skip
from connectors.telegram.inbound import (
    BotIdentity,
    is_group,
    misfit,
    parse_update,
    to_inbound,
    translate_peer,
    translate_update,
)
from gateway.app.types import InboundMessage

BOT = BotIdentity(bot_id="parrot-tg", user_id=7001, username="ParrotBot")
PRIVACY_BOT = BotIdentity(
    bot_id="quiet-tg", user_id=7003, username="QuietBot", reads_all_group_messages=False
)

HUMAN = {
    "id": 5678,
    "is_bot": False,
    "first_name": "Alice",
    "last_name": "Liddell",
    "username": "alice",
    "language_code": "en",
}
OTHER_BOT = {"id": 7002, "is_bot": True, "first_name": "Echo", "username": "EchoBot"}
SELF = {"id": 7001, "is_bot": True, "first_name": "Parrot", "username": "ParrotBot"}
SUPERGROUP = {"id": -1001234567890, "title": "Bots lounge", "type": "supergroup"}
FORUM = {"id": -1009876543210, "title": "Forum", "type": "supergroup", "is_forum": True}
GROUP_MESSAGE: dict[str, Any] = {
    "update_id": 812345678,
    "message": {
        "message_id": 42,
        "from": HUMAN,
        "chat": SUPERGROUP,
        "date": 1718000000,
        "text": "hello everyone",
    },
}


def update(**message: Any) -> dict[str, Any]:
    """The group message update with some message fields replaced (None removes one)."""
    payload = copy.deepcopy(GROUP_MESSAGE)
    for key, value in message.items():
        if value is None:
            payload["message"].pop(key, None)
        else:
            payload["message"][key] = value
    return payload


def inbound(payload: object, bot: BotIdentity = BOT) -> InboundMessage:
    result = translate_update(payload, bot=bot, received_at=12.5)
    assert isinstance(result, InboundMessage), result
    return result


def test_group_message_from_a_human() -> None:
    message = inbound(GROUP_MESSAGE)
    assert message.platform == "telegram"
    assert message.bot_id == "parrot-tg"
    assert message.bot_user_id == "7001"
    assert message.channel_id == "-1001234567890"
    assert message.thread_id is None
    assert message.message_id == "42"
    assert message.event_id == "812345678"
    assert message.sender_id == "5678"
    assert message.sender_name == "alice"
    assert message.sender_is_bot is False
    assert message.text == "hello everyone"
    assert not message.mentions_bot
    assert not message.reply_to_bot
    assert not message.is_direct
    assert message.received_at == 12.5
    assert message.delivery_key == "telegram:parrot-tg:812345678"


def test_to_inbound_matches_translate_update() -> None:
    assert to_inbound(GROUP_MESSAGE, bot=BOT, received_at=12.5) == inbound(GROUP_MESSAGE)
    assert to_inbound({"update_id": 1, "poll": {}}, bot=BOT) is None


def test_sender_without_username_uses_full_name() -> None:
    sender = {"id": 99, "is_bot": False, "first_name": "Bob", "last_name": "Smith"}
    assert inbound(update(**{"from": sender})).sender_name == "Bob Smith"


def test_bot_sender_is_a_bot() -> None:
    message = inbound(update(**{"from": OTHER_BOT}))
    assert message.sender_is_bot is True
    assert message.sender_id == "7002"


def test_private_chat_is_direct() -> None:
    chat = {"id": 5678, "first_name": "Alice", "username": "alice", "type": "private"}
    message = inbound(update(chat=chat))
    assert message.is_direct
    assert message.addressed
    assert message.channel_id == "5678"


def test_basic_group_is_not_direct() -> None:
    chat = {"id": -4001, "title": "Small group", "type": "group"}
    assert not inbound(update(chat=chat)).is_direct


def test_forum_topic_message_carries_its_thread() -> None:
    payload = update(chat=FORUM, message_thread_id=17, is_topic_message=True)
    payload["message"]["reply_to_message"] = {
        "message_id": 17,
        "from": SELF,
        "chat": FORUM,
        "date": 1717000000,
        "message_thread_id": 17,
        "forum_topic_created": {"name": "Ideas", "icon_color": 7322096},
        "is_topic_message": True,
    }
    message = inbound(payload)
    assert message.thread_id == "17"
    # Every message of a topic "replies" to the topic's creation message: not to the bot.
    assert not message.reply_to_bot


def test_reply_chain_in_plain_supergroup_is_not_a_thread() -> None:
    assert inbound(update(message_thread_id=40)).thread_id is None


def test_mention_entity_of_this_bot() -> None:
    text = "hey @parrotbot what's up"
    entities = [{"type": "mention", "offset": 4, "length": 10}]
    message = inbound(update(text=text, entities=entities))
    assert message.mentions_bot
    assert message.text == text


def test_mention_after_astral_emoji_uses_utf16_offsets() -> None:
    text = "🦜🦜 @ParrotBot hi"
    entities = [{"type": "mention", "offset": 5, "length": 10}]
    assert inbound(update(text=text, entities=entities)).mentions_bot


def test_mention_of_another_bot_is_not_a_mention() -> None:
    text = "hey @EchoBot"
    entities = [{"type": "mention", "offset": 4, "length": 8}]
    assert not inbound(update(text=text, entities=entities)).mentions_bot


def test_text_mention_by_user_id() -> None:
    entities = [{"type": "text_mention", "offset": 0, "length": 6, "user": SELF}]
    assert inbound(update(text="Parrot, hi", entities=entities)).mentions_bot


def test_plain_at_text_without_entity_is_not_a_mention() -> None:
    assert not inbound(update(text="mail me at x@parrotbot")).mentions_bot


def test_command_addressed_to_this_bot_is_rewritten_and_a_mention() -> None:
    text = "/loop@ParrotBot reset"
    entities = [{"type": "bot_command", "offset": 0, "length": 15}]
    message = inbound(update(text=text, entities=entities))
    assert message.text == "/loop reset"
    assert message.mentions_bot


def test_command_without_target_is_kept_and_not_a_mention() -> None:
    entities = [{"type": "bot_command", "offset": 0, "length": 5}]
    message = inbound(update(text="/loop status", entities=entities))
    assert message.text == "/loop status"
    assert not message.mentions_bot


def test_command_addressed_to_another_bot_is_dropped() -> None:
    entities = [{"type": "bot_command", "offset": 0, "length": 13}]
    payload = update(text="/loop@EchoBot reset", entities=entities)
    assert translate_update(payload, bot=BOT) is Skip.OTHER_BOT


def test_reply_to_this_bot() -> None:
    quoted = {"message_id": 41, "from": SELF, "chat": SUPERGROUP, "date": 1, "text": "echo"}
    assert inbound(update(reply_to_message=quoted)).reply_to_bot


def test_reply_to_someone_else() -> None:
    quoted = {"message_id": 41, "from": OTHER_BOT, "chat": SUPERGROUP, "date": 1, "text": "x"}
    assert not inbound(update(reply_to_message=quoted)).reply_to_bot


def test_caption_is_text() -> None:
    photo = [{"file_id": "AgAD", "file_unique_id": "u1", "width": 90, "height": 90}]
    caption_entities = [{"type": "mention", "offset": 0, "length": 10}]
    payload = update(
        text=None, photo=photo, caption="@ParrotBot look", **{"caption_entities": caption_entities}
    )
    message = inbound(payload)
    assert message.text == "@ParrotBot look"
    assert message.mentions_bot


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        pytest.param(
            update(
                text=None,
                photo=[{"file_id": "A", "file_unique_id": "u", "width": 1, "height": 1}],
            ),
            Skip.NO_TEXT,
            id="photo-only",
        ),
        pytest.param(
            update(text=None, new_chat_members=[HUMAN]), Skip.NO_TEXT, id="service-message"
        ),
        pytest.param(update(text="   \n"), Skip.NO_TEXT, id="blank-text"),
        pytest.param(update(**{"from": None}), Skip.NO_SENDER, id="no-sender"),
        pytest.param(
            {"update_id": 9, "edited_message": GROUP_MESSAGE["message"]},
            Skip.UNSUPPORTED,
            id="edited",
        ),
        pytest.param(
            {
                "update_id": 9,
                "channel_post": {
                    "message_id": 1,
                    "chat": {"id": -100555, "type": "channel", "title": "News"},
                    "date": 1,
                    "text": "post",
                },
            },
            Skip.UNSUPPORTED,
            id="channel-post",
        ),
        pytest.param(
            {"update_id": 9, "future_kind": {"x": 1}}, Skip.UNSUPPORTED, id="unknown-type"
        ),
        pytest.param({"message": GROUP_MESSAGE["message"]}, Skip.MALFORMED, id="no-update-id"),
        pytest.param({"update_id": 9, "message": "text"}, Skip.MALFORMED, id="message-not-object"),
        pytest.param({"update_id": 9, "message": {"message_id": 1}}, Skip.MALFORMED, id="no-date"),
        pytest.param(["not", "an", "object"], Skip.MALFORMED, id="list"),
        pytest.param(None, Skip.MALFORMED, id="none"),
    ],
)
def test_dropped_updates(payload: object, reason: Skip) -> None:
    assert translate_update(payload, bot=BOT) is reason


def test_sender_chat_is_a_bot_keyed_by_chat() -> None:
    anonymous_admin = {
        "id": 1087968824,
        "is_bot": True,
        "first_name": "Group",
        "username": "GroupAnonymousBot",
    }
    payload = update(**{"from": anonymous_admin}, sender_chat=SUPERGROUP)
    message = inbound(payload)
    assert message.sender_is_bot
    assert message.sender_id == "-1001234567890"
    assert message.sender_name == "Bots lounge"


def test_automatic_forward_from_linked_channel_fails_closed() -> None:
    telegram_service = {"id": 777000, "is_bot": False, "first_name": "Telegram"}
    channel = {"id": -100777, "title": "News", "type": "channel"}
    payload = update(**{"from": telegram_service}, sender_chat=channel, is_automatic_forward=True)
    message = inbound(payload)
    assert message.sender_is_bot
    assert message.sender_id == "-100777"


def test_parse_update_gives_typed_update() -> None:
    parsed = parse_update(GROUP_MESSAGE)
    assert not isinstance(parsed, Skip)
    assert parsed.update_id == 812345678
    assert parsed.message is not None
    assert is_group(parsed.message)


def peer_message(text: str, **extra: Any) -> Message:
    data: dict[str, Any] = {
        "message_id": 77,
        "from": OTHER_BOT,
        "chat": SUPERGROUP,
        "date": 1718000001,
        "text": text,
        **extra,
    }
    return Message.de_json(data, None)


def test_peer_message_is_a_bot_message_with_peer_event_id() -> None:
    result = translate_peer(peer_message("echo: hi"), bot=BOT, received_at=3.0)
    assert isinstance(result, InboundMessage)
    assert result.sender_is_bot
    assert result.sender_id == "7002"
    assert result.message_id == "77"
    assert result.event_id == "peer:-1001234567890:7002:77"
    assert result.bot_user_id == "7001"
    assert result.received_at == 3.0


def test_peer_message_of_this_bot_itself_is_dropped() -> None:
    message = Message.de_json(
        {"message_id": 1, "from": SELF, "chat": SUPERGROUP, "date": 1, "text": "x"}, None
    )
    assert translate_peer(message, bot=BOT) is Skip.OWN


def test_peer_message_in_privacy_mode_only_when_addressed() -> None:
    assert translate_peer(peer_message("chatter"), bot=PRIVACY_BOT) is Skip.NOT_VISIBLE
    mention = [{"type": "mention", "offset": 0, "length": 9}]
    addressed = translate_peer(peer_message("@QuietBot hi", entities=mention), bot=PRIVACY_BOT)
    assert isinstance(addressed, InboundMessage)
    assert addressed.mentions_bot
    command = translate_peer(peer_message("/help"), bot=PRIVACY_BOT)
    assert isinstance(command, InboundMessage)
    quoted = {"message_id": 5, "from": {**OTHER_BOT, "id": 7003}, "chat": SUPERGROUP, "date": 1}
    reply = translate_peer(peer_message("ok", reply_to_message=quoted), bot=PRIVACY_BOT)
    assert isinstance(reply, InboundMessage)
    assert reply.reply_to_bot


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        pytest.param({**GROUP_MESSAGE, "update_id": True}, "update.update_id", id="update-id-bool"),
        pytest.param({**GROUP_MESSAGE, "update_id": "1"}, "update.update_id", id="update-id-text"),
        pytest.param(
            update(chat={**SUPERGROUP, "id": "-1001234567890"}),
            "update.message.chat.id",
            id="chat-id-text",
        ),
        pytest.param(
            update(chat={**SUPERGROUP, "id": 2**70}), "update.message.chat.id", id="chat-id-huge"
        ),
        pytest.param(
            update(chat={**SUPERGROUP, "type": 1}), "update.message.chat.type", id="chat-type"
        ),
        pytest.param(
            update(**{"from": {**HUMAN, "is_bot": "no"}}),
            "update.message.from.is_bot",
            id="is-bot-text",
        ),
        pytest.param(
            update(**{"from": {**HUMAN, "id": 5678.0}}),
            "update.message.from.id",
            id="user-id-float",
        ),
        pytest.param(
            update(**{"from": {**HUMAN, "username": ["alice"]}}),
            "update.message.from.username",
            id="username-list",
        ),
        pytest.param(update(message_id="42"), "update.message.message_id", id="message-id-text"),
        pytest.param(update(date=1.5e9), "update.message.date", id="date-float"),
        pytest.param(update(text=["hello"]), "update.message.text", id="text-list"),
        pytest.param(update(text=None, caption=7), "update.message.caption", id="caption-number"),
        pytest.param(
            update(entities={"type": "mention"}), "update.message.entities", id="entities-object"
        ),
        pytest.param(
            update(entities=[{"type": "mention", "offset": "0", "length": 5}]),
            "update.message.entities[0].offset",
            id="entity-offset-text",
        ),
        pytest.param(
            update(message_thread_id="17", is_topic_message=True),
            "update.message.message_thread_id",
            id="thread-id-text",
        ),
        pytest.param(
            update(is_topic_message="yes"), "update.message.is_topic_message", id="topic-flag-text"
        ),
        pytest.param(
            update(
                reply_to_message={
                    "message_id": 5,
                    "from": {**SELF, "id": "7001"},
                    "chat": SUPERGROUP,
                    "date": 1,
                }
            ),
            "update.message.reply_to_message.from.id",
            id="quoted-sender-id-text",
        ),
        pytest.param(
            update(sender_chat={**SUPERGROUP, "title": 5}),
            "update.message.sender_chat.title",
            id="sender-chat-title",
        ),
        pytest.param({"update_id": 9, "message": "text"}, "update.message", id="message-text"),
    ],
)
def test_issue9_an_update_with_fields_of_the_wrong_type_is_malformed(
    payload: dict[str, Any], field: str
) -> None:
    assert misfit(payload) == field
    assert translate_update(payload, bot=BOT) is Skip.MALFORMED


def test_issue9_a_well_typed_update_fits() -> None:
    assert misfit(GROUP_MESSAGE) is None
    assert misfit(update(entities=[{"type": "mention", "offset": 0, "length": 5}])) is None
    assert misfit({"update_id": 9, "future_kind": {"id": "any shape"}}) is None


def test_issue9_peer_event_ids_of_one_message_id_in_two_chats_differ() -> None:
    other_chat = {**SUPERGROUP, "id": -1002}
    here = translate_peer(peer_message("echo: hi"), bot=BOT)
    there = translate_peer(peer_message("echo: hi", chat=other_chat), bot=BOT)
    assert isinstance(here, InboundMessage)
    assert isinstance(there, InboundMessage)
    assert here.message_id == there.message_id
    assert here.delivery_key != there.delivery_key
    assert there.event_id == "peer:-1002:7002:77"
