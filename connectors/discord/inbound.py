"""Pure translation of Discord MESSAGE_CREATE payloads into InboundMessages (no I/O).

`translate_message` turns the `d` of one MESSAGE_CREATE gateway dispatch (the JSON object
Discord sends) into an `InboundMessage`, or a `Skip` saying why it was dropped;
`to_inbound` is the same returning None for a drop. What the payload cannot say (whether
its channel is a thread, and of which channel) the connector looks up in discord.py's
cache and passes in as `thread_parent`.

Decisions where DESIGN.md is silent:
- Rooms: `channel_id` is the channel a message belongs to; for a message in a thread it is
  the thread's parent channel and `thread_id` is the thread (Discord threads are channels
  of their own). Budgets, pauses and policies are therefore kept per parent channel, so a
  loop cannot dodge its budget by moving into a new thread; a channel rule can still
  single out threads with `match.thread`. In a DM, `channel_id` is the DM channel.
- With `reply_in_thread`, a message in a guild channel (not a thread, not a DM) gets
  `thread_id` = its own id: Discord gives a thread started from a message that message's
  id, and the connector opens that thread when the first reply is posted into it.
- Only conversation is handled: default messages, replies and the messages of slash or
  context-menu commands. System messages (joins, pins, boosts, thread notices, …) and
  messages from Discord's `system` user are dropped (`Skip.SERVICE`); a message with no
  text (attachments, stickers or embeds alone, a forward) is dropped (`Skip.NO_TEXT`).
- Bot-ness is `author.bot`, which Discord leaves out for people; a webhook's message, or an
  author whose `bot` is not a boolean, counts as a bot (fail closed). A message without an
  author id is dropped (`Skip.NO_SENDER`). The bot's own messages (Discord echoes them) are
  dropped here already (`Skip.OWN`): the author id makes that certain.
- `mentions_bot` is a real mention only: `<@id>` or `<@!id>` of this bot in the text, or
  the bot in `mentions` when that is not explained by a reply to one of its messages (the
  reply ping Discord adds). `reply_to_bot` is a reply whose referenced message is by this
  bot; when Discord did not include the referenced message (deleted), a reply that pings
  this bot without a mention in the text is taken as a reply to it.
- A leading mention of this bot is removed from the text (`<@bot> /loop status` reaches
  the admin commands as `/loop status`, and agents see what was said to them); other
  mentions stay as written, and a message that is nothing but the mention keeps it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from connectors.skips import Skip
from gateway.app.types import InboundMessage

PLATFORM = "discord"
CONVERSATION_TYPES = frozenset({0, 19, 20, 23})  # default, reply, slash and context commands
FORWARD = 1  # message_reference.type of a forwarded message
_MENTION = re.compile(r"<@!?(\d+)>")


@dataclass(frozen=True, slots=True)
class BotIdentity:
    """Who a hosted bot is on Discord: config id, user id, and whether it answers in threads."""

    bot_id: str
    user_id: str
    reply_in_thread: bool = False


def to_inbound(
    raw: object,
    *,
    bot: BotIdentity,
    thread_parent: str | None = None,
    received_at: float = 0.0,
) -> InboundMessage | None:
    """The InboundMessage of a MESSAGE_CREATE payload, or None when it is dropped."""
    result = translate_message(raw, bot=bot, thread_parent=thread_parent, received_at=received_at)
    return None if isinstance(result, Skip) else result


def translate_message(
    raw: object,
    *,
    bot: BotIdentity,
    thread_parent: str | None = None,
    received_at: float = 0.0,
) -> InboundMessage | Skip:
    """Translate one MESSAGE_CREATE payload; `thread_parent` is set when its channel is a thread."""
    if not isinstance(raw, Mapping):
        return Skip.MALFORMED
    message_id = _snowflake(raw.get("id"))
    channel = _snowflake(raw.get("channel_id"))
    kind = raw.get("type", 0)
    content = raw.get("content", "")
    if message_id is None or channel is None or not isinstance(content, str):
        return Skip.MALFORMED
    if not isinstance(kind, int) or isinstance(kind, bool) or kind not in CONVERSATION_TYPES:
        return Skip.SERVICE
    author = raw.get("author")
    if not isinstance(author, Mapping):
        return Skip.NO_SENDER
    sender = _snowflake(author.get("id"))
    if sender is None:
        return Skip.NO_SENDER
    if author.get("system") is True:
        return Skip.SERVICE
    if sender == bot.user_id:
        return Skip.OWN
    explicit = any(found == bot.user_id for found in _MENTION.findall(content))
    text = _without_leading_mention(content, bot.user_id).strip() or content.strip()
    if not text:
        return Skip.NO_TEXT
    mentioned = any(
        isinstance(user, Mapping) and _snowflake(user.get("id")) == bot.user_id
        for user in _list(raw.get("mentions"))
    )
    reply_to_bot, reply_ping = _reply(raw, bot, explicit=explicit, mentioned=mentioned)
    guild = _snowflake(raw.get("guild_id"))
    is_direct = guild is None
    if thread_parent is not None and not is_direct:
        channel_id, thread_id = thread_parent, channel
    elif bot.reply_in_thread and not is_direct:
        channel_id, thread_id = channel, message_id
    else:
        channel_id, thread_id = channel, None
    webhook = raw.get("webhook_id") is not None
    is_bot = author.get("bot", False)
    return InboundMessage(
        platform=PLATFORM,
        bot_id=bot.bot_id,
        channel_id=channel_id,
        thread_id=thread_id,
        message_id=message_id,
        sender_id=sender,
        sender_name=_display_name(raw, author, sender),
        sender_is_bot=webhook or is_bot is not False,
        text=text,
        mentions_bot=explicit or (mentioned and not reply_ping),
        reply_to_bot=reply_to_bot,
        is_direct=is_direct,
        received_at=received_at,
        raw=raw,
        bot_user_id=bot.user_id,
        event_id=message_id,
    )


def thread_name(text: str, limit: int = 80) -> str:
    """A thread title from the message it is opened on: its first line, shortened."""
    line = next((part.strip() for part in text.splitlines() if part.strip()), "")
    if len(line) > limit:
        line = line[: limit - 1].rstrip() + "…"
    return line or "reply"


def _reply(
    raw: Mapping[str, object], bot: BotIdentity, *, explicit: bool, mentioned: bool
) -> tuple[bool, bool]:
    """(reply_to_bot, the bot's presence in `mentions` is the reply ping)."""
    reference = raw.get("message_reference")
    if not isinstance(reference, Mapping) or reference.get("type", 0) == FORWARD:
        return False, False
    referenced = raw.get("referenced_message")
    if isinstance(referenced, Mapping):
        author = referenced.get("author")
        by_bot = isinstance(author, Mapping) and _snowflake(author.get("id")) == bot.user_id
        return by_bot, by_bot and not explicit
    # Discord leaves the referenced message out when it was deleted: a ping of this bot
    # that the text does not explain can only be the reply ping.
    guess = mentioned and not explicit
    return guess, guess


def _display_name(raw: Mapping[str, object], author: Mapping[str, object], sender: str) -> str:
    """The guild nickname, else the global display name, else the username, else the id."""
    member = raw.get("member")
    candidates = (
        member.get("nick") if isinstance(member, Mapping) else None,
        author.get("global_name"),
        author.get("username"),
    )
    return next((c for c in candidates if isinstance(c, str) and c), sender)


def _without_leading_mention(content: str, user_id: str) -> str:
    stripped = content.lstrip()
    match = _MENTION.match(stripped)
    if match is not None and match.group(1) == user_id:
        return stripped[match.end() :]
    return content


def _snowflake(value: object) -> str | None:
    """A Discord id as text (ids are strings on the wire; ints are accepted too)."""
    if isinstance(value, str) and value.isdigit():
        return value
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return str(value)
    return None


def _list(value: object) -> list[object]:
    return list(value) if isinstance(value, list) else []
