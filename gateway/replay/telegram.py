"""A Telegram Desktop export's `result.json`: one chat, or the whole account's chats.

One chat is `{"name", "type", "id", "messages": [...]}`; the whole-account form holds
the chats under `chats.list[]` (and `left_chats.list[]`). The document is streamed
event by event (ijson), each message built on its own, so a large export never sits in
memory. A message is `{"id", "type", "date", "date_unixtime", "from", "from_id",
"text"}`, where `text` is a string or a list of strings and entities (`{"type": "bold",
"text": "…"}`).

Decisions where DESIGN.md is silent:
- The room is the chat's id as the Bot API (and so the gateway's Telegram connector)
  writes it: `-100<id>` for supergroups and channels, `-<id>` for basic groups, the id
  itself for private chats, so channel rules written for the gateway match.
- The time is `date_unixtime` when present (UTC), else `date`, which Telegram Desktop
  writes in the exporting computer's local time without an offset: taken as UTC.
- `from_id` `user123` is the user 123, as the gateway's sender id (`--bot` takes either
  form); other senders (`channel123`) keep the exported id. Older exports (and the
  chat-analytics samples) write `from_id` as a number, the user id itself: `19` is the
  user 19.
- Service messages (`type: service`: joins, pins, title changes) are skipped as
  `service`, other types as `unknown_type`; no text (a photo without caption) is
  `no_text`, no `from_id` is `no_sender`.
- The export does not say who is a bot: a sender is one when `--bot` names it or its
  name ends in "bot" (as every bot username does), case-insensitively.
- A `mention` entity (`@name`) and a `mention_name` entity (its `user_id`) address that
  user. Forum topics are not told apart: every message is in its chat's room.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import ijson

from gateway.replay.inputs import ItemBuilder, ReadContext, Source, json_error, stream_events
from gateway.replay.records import ChatMessage, ReplayInputError, Skipped, parse_time

PLATFORM = "telegram"
_CHAT_ROOTS = ("", "chats.list.item", "left_chats.list.item")
_MESSAGES = {f"{root}.messages.item" if root else "messages.item": root for root in _CHAT_ROOTS}
_CHAT_FIELDS = {
    (f"{root}.{field}" if root else field): field
    for root in _CHAT_ROOTS
    for field in ("name", "type", "id")
}
_SCALARS = frozenset({"string", "number"})
_SUPERGROUPS = frozenset(
    {"private_supergroup", "public_supergroup", "private_channel", "public_channel"}
)
_DIRECT = frozenset({"personal_chat", "bot_chat", "saved_messages"})


def looks_like(head: Mapping[str, object]) -> bool:
    """Whether a document's first top-level keys are a Telegram Desktop export's."""
    return (
        "chats" in head
        or "personal_information" in head
        or ("messages" in head and "type" in head and "id" in head and "guild" not in head)
    )


def read(source: Source, context: ReadContext) -> Iterator[ChatMessage]:
    """The messages of every chat in the file, chat by chat, in the file's order."""
    chat: dict[str, object] = {}
    item = ItemBuilder()
    index = 0
    with source.open(context.limits, progress=context.progress) as stream:
        try:
            for prefix, event, value in stream_events(stream):
                if item.building:
                    if item.feed(event, value):
                        message = _message(item.take(), index, source.name, chat, context)
                        index += 1
                        if message is not None:
                            yield message
                elif event == "start_map" and prefix in _MESSAGES:
                    item.start(event, value)
                elif prefix in _CHAT_FIELDS and event in _SCALARS:
                    chat[_CHAT_FIELDS[prefix]] = value
                elif event == "start_map" and prefix in _CHAT_ROOTS and prefix:
                    chat = {}
        except ijson.JSONError as exc:
            raise json_error(source.name, f"message {index}", exc) from None
        except ReplayInputError as exc:
            if exc.where:
                raise
            # The stream's own refusal (too deep, too large) while reading this message.
            raise ReplayInputError(source.name, f"message {index}", exc.why) from None


def chat_id(chat: Mapping[str, object]) -> str:
    """The chat's id as the Bot API writes it."""
    raw = chat.get("id")
    if isinstance(raw, bool) or not isinstance(raw, int | str) or raw == "":
        return "unknown"
    number = str(raw)
    kind = chat.get("type")
    if kind in _SUPERGROUPS:
        return f"-100{number}"
    if kind == "private_group":
        return f"-{number}"
    return number


def sender_id(from_id: str) -> str:
    """The gateway's sender id of an exported `from_id` (`user123` is 123)."""
    rest = from_id.removeprefix("user")
    return rest if rest != from_id and rest.isascii() and rest.isdigit() else from_id


def _message(
    item: object, index: int, file: str, chat: Mapping[str, object], context: ReadContext
) -> ChatMessage | None:
    """One exported message as the gateway would have seen it; None when skipped."""
    skipped: Skipped = context.skipped
    if not isinstance(item, Mapping):
        raise ReplayInputError(file, f"message {index}", "is not a JSON object")
    field = "date" if item.get("date_unixtime") is None else "date_unixtime"
    try:
        at = parse_time(item.get(field), field)
    except ValueError as exc:
        raise ReplayInputError(
            file, f"message {index} (id {_id(item.get('id'))})", str(exc)
        ) from None
    kind = item.get("type", "message")
    if kind != "message":
        skipped.add("service" if kind == "service" else "unknown_type")
        return None
    sender = _sender(item.get("from_id"))
    if sender is None:
        skipped.add("no_sender")
        return None
    text, mentions = _text(item.get("text"))
    if not text.strip():
        skipped.add("no_text")
        return None
    name = item.get("from")
    shown = name if isinstance(name, str) and name else sender
    room = chat_id(chat)
    title = chat.get("name")
    return ChatMessage(
        platform=PLATFORM,
        channel=room,
        thread=None,
        message_id=_id(item.get("id")),
        at=at,
        sender_id=sender,
        sender_name=shown,
        is_bot=shown.casefold().rstrip().endswith("bot"),
        mentions=mentions,
        is_direct=chat.get("type") in _DIRECT,
        channel_name=title if isinstance(title, str) and title else room,
    )


def _sender(from_id: object) -> str | None:
    """The sender id of a `from_id` (`user123`, or the number 123); None when there is none."""
    if isinstance(from_id, str):
        return sender_id(from_id) if from_id else None
    if isinstance(from_id, int) and not isinstance(from_id, bool):
        return str(from_id)
    return None


def _text(value: object) -> tuple[str, frozenset[str]]:
    """A message's plain text and who it mentions, from a string or an entity list."""
    if isinstance(value, str):
        return value, frozenset()
    if not isinstance(value, list):
        return "", frozenset()
    parts: list[str] = []
    mentions: set[str] = set()
    for part in value:
        if isinstance(part, str):
            parts.append(part)
        elif isinstance(part, Mapping) and isinstance(part.get("text"), str):
            text = str(part["text"])
            parts.append(text)
            if part.get("type") == "mention":
                mentions.add(text.removeprefix("@").casefold())
            elif part.get("type") == "mention_name" and part.get("user_id") is not None:
                mentions.add(_id(part.get("user_id")))
    return "".join(parts), frozenset(mentions)


def _id(value: object) -> str:
    """A message or user id as text (exports write numbers)."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)
