"""Pure translation of Telegram Bot API updates into InboundMessages (no I/O).

`translate_update` turns one raw update (the JSON object of getUpdates or a webhook body)
into an `InboundMessage`, or a `Skip` saying why it was dropped; `to_inbound` is the same
returning None for a drop. `translate_peer` does the same for a message another hosted bot
of this process sent (Telegram never delivers bots' messages to bots).

Decisions where DESIGN.md is silent:
- An update that is not an object, has no integer `update_id`, or has a field this module
  reads of the wrong JSON type (`chat.id` a string, `from.is_bot` a string, `text` a list,
  an id beyond 64 bits…) is malformed (`Skip.MALFORMED`): PTB does not check types, and
  a string `is_bot` would make a bot a human. Fields this module does not read are not
  checked.
- Only `message` updates are handled. Edits, channel posts and every other update type are
  dropped (`Skip.UNSUPPORTED`): the gateway answers conversation, not edits or broadcasts.
- Text is `text`, else the `caption` of a media message; a message with neither (a photo
  alone, a sticker, a service message such as new_chat_members) is dropped (`Skip.NO_TEXT`).
- A message sent on behalf of a chat (`sender_chat`: an anonymous group admin, a channel, a
  linked channel's automatic forward) is from a sender whose bot-ness is unknown: it is a
  bot (fail closed), and its sender id is the chat's id. A message with neither `from` nor
  `sender_chat` is dropped (`Skip.NO_SENDER`): there is no id to answer or budget by.
- `thread_id` is the forum topic (`message_thread_id` of a topic message only): in a plain
  supergroup `message_thread_id` names a reply chain, and posting into it is not a thread.
- `/cmd@thisbot …` is rewritten to `/cmd …` and counts as a mention, so `/loop@bot reset`
  reaches the admin commands as `/loop reset`; `/cmd@otherbot …` is addressed to another
  bot and dropped (`Skip.OTHER_BOT`).
- `reply_to_bot` ignores the topic-creation message that Telegram makes every message of
  a forum topic a reply to.
- A peer message is offered to a bot that cannot read all group messages (privacy mode)
  only when Telegram would have shown it: a mention of it, a reply to it, or a command.
  Its event id is `peer:<chat id>:<sender id>:<message id>`: a message id is only unique
  within its chat.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeAlias

from telegram import Message, MessageEntity, Update
from telegram.constants import ChatType, MessageEntityType

from connectors.skips import Skip
from gateway.app.types import InboundMessage

PLATFORM = "telegram"
_GROUPS = frozenset({ChatType.GROUP, ChatType.SUPERGROUP})
_INT64 = 2**63

_Shape: TypeAlias = "type | Mapping[str, _Shape] | tuple[_Shape]"
"""A JSON type, an object's fields (each optional) with their shapes, or a list of one shape."""

_USER: _Shape = {
    "id": int,
    "is_bot": bool,
    "first_name": str,
    "last_name": str,
    "username": str,
}
_CHAT: _Shape = {"id": int, "type": str, "title": str, "username": str, "is_forum": bool}
_ENTITY: _Shape = {"type": str, "offset": int, "length": int, "user": _USER}
_QUOTED: _Shape = {"message_id": int, "from": _USER, "forum_topic_created": dict}
_MESSAGE: _Shape = {
    "message_id": int,
    "date": int,
    "chat": _CHAT,
    "from": _USER,
    "sender_chat": _CHAT,
    "text": str,
    "caption": str,
    "entities": (_ENTITY,),
    "caption_entities": (_ENTITY,),
    "message_thread_id": int,
    "is_topic_message": bool,
    "reply_to_message": _QUOTED,
    "left_chat_member": _USER,
}
_UPDATE: _Shape = {"update_id": int, "message": _MESSAGE}


@dataclass(frozen=True, slots=True)
class BotIdentity:
    """Who a hosted bot is on Telegram: config id, user id, @username, privacy mode."""

    bot_id: str
    user_id: int
    username: str
    reads_all_group_messages: bool = True

    @property
    def handle(self) -> str:
        """The lower-cased @username, as mentions are compared."""
        return f"@{self.username.lower()}"


def parse_update(raw: object) -> Update | Skip:
    """A raw update as PTB's typed Update, or `Skip.MALFORMED` if it is not one."""
    if not isinstance(raw, Mapping) or "update_id" not in raw or misfit(raw) is not None:
        return Skip.MALFORMED
    try:
        return Update.de_json(dict(raw), None)
    except Exception:  # noqa: BLE001 - any shape error in untrusted JSON is a malformed update
        return Skip.MALFORMED


def misfit(raw: object) -> str | None:
    """The path of the first field of a raw update that has the wrong JSON type, or None."""
    return _misfit(raw, _UPDATE, "update")


def _misfit(value: object, shape: _Shape, where: str) -> str | None:
    """`misfit` of one value at path `where`: a walk of the shape, never deeper than it."""
    if isinstance(shape, Mapping):
        if not isinstance(value, Mapping):
            return where
        found = (
            _misfit(value[k], inner, f"{where}.{k}") for k, inner in shape.items() if k in value
        )
        return next((path for path in found if path), None)
    if isinstance(shape, tuple):
        if not isinstance(value, list):
            return where
        found = (_misfit(item, shape[0], f"{where}[{i}]") for i, item in enumerate(value))
        return next((path for path in found if path), None)
    if shape is int:
        # bool is an int to Python, not to JSON; no Bot API integer needs more than 64 bits.
        fits = type(value) is int and -_INT64 <= value < _INT64
        return None if fits else where
    return None if isinstance(value, shape) else where


def translate_update(
    raw: object, *, bot: BotIdentity, received_at: float = 0.0
) -> InboundMessage | Skip:
    """One raw update as seen by `bot`, or why it is dropped."""
    update = parse_update(raw)
    if isinstance(update, Skip):
        return update
    if update.message is None:
        return Skip.UNSUPPORTED
    return translate_message(
        update.message, bot=bot, event_id=str(update.update_id), received_at=received_at
    )


def to_inbound(raw: object, *, bot: BotIdentity, received_at: float = 0.0) -> InboundMessage | None:
    """One raw update as an InboundMessage for `bot`, or None when it is dropped."""
    result = translate_update(raw, bot=bot, received_at=received_at)
    return None if isinstance(result, Skip) else result


def translate_peer(
    message: Message, *, bot: BotIdentity, received_at: float = 0.0
) -> InboundMessage | Skip:
    """A message another hosted bot sent into a group, as `bot` would see it."""
    sender = message.from_user
    if sender is None:
        return Skip.NO_SENDER
    if sender.id == bot.user_id:
        return Skip.OWN
    if not bot.reads_all_group_messages and not _visible_in_privacy_mode(message, bot):
        return Skip.NOT_VISIBLE
    return translate_message(
        message,
        bot=bot,
        event_id=f"peer:{message.chat.id}:{sender.id}:{message.message_id}",
        received_at=received_at,
    )


def translate_message(
    message: Message, *, bot: BotIdentity, event_id: str, received_at: float = 0.0
) -> InboundMessage | Skip:
    """A typed Message as an InboundMessage for `bot`, or why it is dropped."""
    text = message.text if message.text is not None else message.caption
    if not text or not text.strip():
        return Skip.NO_TEXT
    sender = _sender(message)
    if sender is None:
        return Skip.NO_SENDER
    sender_id, sender_name, sender_is_bot = sender
    entities = (
        message.parse_entities() if message.text is not None else message.parse_caption_entities()
    )
    text, command_mentions, for_other = _address_command(text, entities, bot)
    if for_other:
        return Skip.OTHER_BOT
    return InboundMessage(
        platform=PLATFORM,
        bot_id=bot.bot_id,
        channel_id=str(message.chat.id),
        thread_id=str(message.message_thread_id)
        if message.is_topic_message and message.message_thread_id is not None
        else None,
        message_id=str(message.message_id),
        sender_id=sender_id,
        sender_name=sender_name,
        sender_is_bot=sender_is_bot,
        text=text,
        mentions_bot=command_mentions or _mentions(entities, bot),
        reply_to_bot=_replies_to(message, bot),
        is_direct=message.chat.type == ChatType.PRIVATE,
        received_at=received_at,
        raw=message,
        bot_user_id=str(bot.user_id),
        event_id=event_id,
    )


def is_group(message: Message) -> bool:
    """True for a group or supergroup chat (where hosted bots may share a room)."""
    return message.chat.type in _GROUPS


def _sender(message: Message) -> tuple[str, str, bool] | None:
    """(id, display name, is_bot) of who sent the message; a chat sender is a bot."""
    if message.sender_chat is not None:
        chat = message.sender_chat
        name = chat.title or chat.username or str(chat.id)
        return str(chat.id), name, True
    user = message.from_user
    if user is None:
        return None
    return str(user.id), user.username or user.full_name, user.is_bot


def _address_command(
    text: str, entities: Mapping[MessageEntity, str], bot: BotIdentity
) -> tuple[str, bool, bool]:
    """(text, addressed to this bot, addressed to another bot) for a leading `/cmd@bot`."""
    for entity, value in entities.items():
        if entity.type != MessageEntityType.BOT_COMMAND or entity.offset != 0:
            continue
        command, at, target = value.partition("@")
        if not at:
            return text, False, False
        if f"@{target.lower()}" != bot.handle:
            return text, False, True
        # Offsets are UTF-16 units but a leading command is ASCII: len(value) is exact.
        return command + text[len(value) :], True, False
    return text, False, False


def _mentions(entities: Mapping[MessageEntity, str], bot: BotIdentity) -> bool:
    """True when an @mention or a text mention names this bot."""
    for entity, value in entities.items():
        if entity.type == MessageEntityType.MENTION and value.lower() == bot.handle:
            return True
        if (
            entity.type == MessageEntityType.TEXT_MENTION
            and entity.user is not None
            and entity.user.id == bot.user_id
        ):
            return True
    return False


def _replies_to(message: Message, bot: BotIdentity) -> bool:
    """True when the message replies to one of this bot's messages (not a topic's root)."""
    quoted = message.reply_to_message
    if quoted is None or quoted.forum_topic_created is not None:
        return False
    return quoted.from_user is not None and quoted.from_user.id == bot.user_id


def _visible_in_privacy_mode(message: Message, bot: BotIdentity) -> bool:
    """What a bot in privacy mode is shown: mentions of it, replies to it, commands."""
    text = message.text or message.caption or ""
    entities = message.parse_entities() if message.text else message.parse_caption_entities()
    return _mentions(entities, bot) or _replies_to(message, bot) or text.startswith("/")
