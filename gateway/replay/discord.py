"""DiscordChatExporter JSON: one channel per file, its messages streamed one at a time.

The file is `{"guild": {...}, "channel": {"id", "type", "categoryId", ...}, "messages":
[{"id", "type", "timestamp", "author": {"id", "name", "nickname", "isBot"}, "content",
"mentions": [{"id", ...}]}]}`. The guild and channel are read first (they come before
the messages), then the messages are streamed (ijson), so a 400 MB export never sits in
memory.

Decisions where DESIGN.md is silent:
- A thread's file (`channel.type` GuildPublicThread, GuildPrivateThread or
  GuildNewsThread) belongs to its parent's room (`categoryId` is the parent channel),
  with the thread's id as the thread, as the gateway's Discord connector files it.
- Message types Default, Reply, ApplicationCommand and ContextMenuCommand are
  conversation (as the connector's); the exporter's system kinds (joins, pins, calls,
  renames, thread creations, boosts) are skipped as `service`; any other type as
  `unknown_type`. A message with no text (an attachment alone) is `no_text`, one
  without an author id `no_sender`, one without an id `no_id`.
- A sender is a bot when `author.isBot` is true (the exporter marks webhooks so too).
  Its name is the nickname when there is one, else the name.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import ijson

from gateway.replay.inputs import ReadContext, Source, json_error, leading_values, stream_items
from gateway.replay.records import ChatMessage, ReplayInputError, Skipped, parse_time

PLATFORM = "discord"
CONVERSATION = frozenset({"Default", "Reply", "ApplicationCommand", "ContextMenuCommand"})
# Discord's message type numbers for the same kinds, for exports that write numbers.
CONVERSATION_NUMBERS = frozenset({0, 19, 20, 23})
SERVICE = frozenset(
    {
        "RecipientAdd",
        "RecipientRemove",
        "Call",
        "ChannelNameChange",
        "ChannelIconChange",
        "ChannelPinnedMessage",
        "GuildMemberJoin",
        "UserPremiumGuildSubscription",
        "UserPremiumGuildSubscriptionTier1",
        "UserPremiumGuildSubscriptionTier2",
        "UserPremiumGuildSubscriptionTier3",
        "ChannelFollowAdd",
        "GuildDiscoveryDisqualified",
        "GuildDiscoveryRequalified",
        "ThreadCreated",
        "GuildInviteReminder",
        "AutoModerationAction",
    }
)
THREAD_TYPES = frozenset({"GuildPublicThread", "GuildPrivateThread", "GuildNewsThread"})
_HEAD = frozenset({"guild", "channel"})


def looks_like(head: Mapping[str, object]) -> bool:
    """Whether a document's first top-level keys are an exporter's."""
    return "guild" in head and "channel" in head


def read(source: Source, context: ReadContext) -> Iterator[ChatMessage]:
    """The messages of one exported channel, in the file's order."""
    head = leading_values(source, context.limits, _HEAD, "messages")
    channel = head.get("channel")
    if not isinstance(channel, Mapping) or not _text(channel.get("id")):
        raise ReplayInputError(
            source.name, "channel", "has no channel id: not a DiscordChatExporter JSON export"
        )
    where = _room(channel)
    index = -1
    with source.open(context.limits, progress=context.progress) as stream:
        try:
            for index, item in enumerate(stream_items(stream, "messages.item")):
                message = _message(item, index, source.name, context.skipped, where)
                if message is not None:
                    yield message
        except ijson.JSONError as exc:
            raise json_error(source.name, f"message {index + 1}", exc) from None
        except ReplayInputError as exc:
            if exc.where:
                raise
            # The stream's own refusal (too deep, too large) while reading this message.
            raise ReplayInputError(source.name, f"message {index + 1}", exc.why) from None


@dataclass(frozen=True, slots=True)
class _Room:
    """Where the exported channel's messages go: the room, the thread, a name to show."""

    channel: str
    thread: str | None
    name: str
    is_direct: bool


def _room(channel: Mapping[str, object]) -> _Room:
    """The room of the exported channel (a thread's is its parent's)."""
    own = _text(channel.get("id")) or ""
    name = _text(channel.get("name")) or own
    parent = _text(channel.get("categoryId"))
    kind = channel.get("type")
    direct = kind == "DirectTextChat"
    if isinstance(kind, str) and kind in THREAD_TYPES and parent:
        shown = f"#{_text(channel.get('category')) or parent} › {name}"
        return _Room(parent, own, shown, direct)
    return _Room(own, None, f"#{name}", direct)


def _message(
    item: object, index: int, file: str, skipped: Skipped, room: _Room
) -> ChatMessage | None:
    """One exported message as the gateway would have seen it; None when skipped."""
    if not isinstance(item, Mapping):
        raise ReplayInputError(file, f"message {index}", "is not a JSON object")
    message_id = _text(item.get("id"))
    try:
        at = parse_time(item.get("timestamp"), "timestamp")
    except ValueError as exc:
        raise ReplayInputError(file, f"message {index} (id {message_id})", str(exc)) from None
    kind = item.get("type", "Default")
    if not isinstance(kind, str | int) or isinstance(kind, bool):
        skipped.add("unknown_type")
        return None
    if kind not in CONVERSATION and kind not in CONVERSATION_NUMBERS:
        skipped.add("service" if kind in SERVICE or isinstance(kind, int) else "unknown_type")
        return None
    author = item.get("author")
    sender = _text(author.get("id")) if isinstance(author, Mapping) else None
    if sender is None or not isinstance(author, Mapping):
        skipped.add("no_sender")
        return None
    if message_id is None:
        skipped.add("no_id")
        return None
    content = item.get("content")
    if not isinstance(content, str) or not content.strip():
        skipped.add("no_text")
        return None
    return ChatMessage(
        platform=PLATFORM,
        channel=room.channel,
        thread=room.thread,
        message_id=message_id,
        at=at,
        sender_id=sender,
        sender_name=_text(author.get("nickname")) or _text(author.get("name")) or sender,
        is_bot=author.get("isBot") is True,
        mentions=_mentions(item.get("mentions")),
        is_direct=room.is_direct,
        channel_name=room.name,
    )


def _mentions(value: object) -> frozenset[str]:
    """The user ids a message mentions."""
    if not isinstance(value, list) or not value:
        return frozenset()
    return frozenset(
        found
        for user in value
        if isinstance(user, Mapping) and (found := _text(user.get("id"))) is not None
    )


def _text(value: object) -> str | None:
    """A non-empty id or name (ids may be written as numbers), else None."""
    if isinstance(value, str):
        return value or None
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return None
