"""Element's "Export chat" JSON (Matrix): one room per file, its events streamed one at a time.

The file is `{"room_name", "room_creator", "topic", "export_date", "exported_by",
"messages": [...]}`, each message a raw Matrix event: `{"type", "sender",
"origin_server_ts" (milliseconds), "event_id", "room_id", "content": {"msgtype",
"body", "formatted_body", "m.mentions", "m.relates_to"}, "unsigned"}`. The document is
streamed event by event (ijson), each message built on its own, so a large export never
sits in memory; the room's name comes before the messages.

Decisions where DESIGN.md is silent, as the gateway's Matrix connector decides them:
- The room is the event's `room_id` (the export's name when an event has none); a reply
  in a thread (`m.relates_to.rel_type` `m.thread`) is in that thread of the room.
- `m.room.message` events of msgtype `m.text`, `m.notice` and `m.emote` are
  conversation; attachments (`m.image`, `m.file`, `m.audio`, `m.video`, `m.location`)
  and redacted events (no body) are `no_text`, other msgtypes `unknown_type`. Edits
  (`m.replace`) are `service`, as are state events (a `state_key`), reactions,
  redactions and calls; any other event type is `unknown_type`. No `sender` is
  `no_sender`, no `event_id` `no_id`.
- Matrix has no bot flag: every sender of `m.notice` is a bot (the Matrix convention),
  and `--bot` marks others (ids such as `@helper:example.org`). The export holds no
  display names: a sender is shown by its id.
- A message mentions the ids in its `m.mentions.user_ids` and its pills
  (`https://matrix.to/#/@user:server` links in `formatted_body`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from urllib.parse import unquote

import ijson

from gateway.replay.inputs import (
    STARTS,
    ItemBuilder,
    ReadContext,
    Source,
    json_error,
    stream_events,
)
from gateway.replay.records import ChatMessage, ReplayInputError, Skipped, parse_millis

PLATFORM = "matrix"
MESSAGE = "m.room.message"
TEXT_MSGTYPES = frozenset({"m.text", "m.notice", "m.emote"})
BOT_MSGTYPE = "m.notice"
ATTACHMENT_MSGTYPES = frozenset({"m.image", "m.file", "m.audio", "m.video", "m.location"})
SERVICE_TYPES = frozenset(
    {
        "m.reaction",
        "m.room.redaction",
        "m.call.invite",
        "m.call.answer",
        "m.call.hangup",
        "m.call.candidates",
        "m.call.reject",
        "m.call.negotiate",
        "m.call.select_answer",
    }
)
_PILL = re.compile(r"https://matrix\.to/#/(@[^\"'<>?/\s]+)")


def looks_like(head: Mapping[str, object]) -> bool:
    """Whether a document's first top-level keys are an Element chat export's."""
    return "room_name" in head and ("room_creator" in head or "exported_by" in head)


def read(source: Source, context: ReadContext) -> Iterator[ChatMessage]:
    """The messages of one exported room, in the file's order (one streamed pass)."""
    room_name = ""
    item = ItemBuilder()
    index = 0
    with source.open(context.limits, progress=context.progress) as stream:
        try:
            for prefix, event, value in stream_events(stream):
                if item.building:
                    if item.feed(event, value):
                        message = _message(
                            item.take(), index, source.name, context.skipped, room_name
                        )
                        index += 1
                        if message is not None:
                            yield message
                elif prefix == "messages.item" and event in STARTS:
                    item.start(event, value)
                elif prefix == "messages.item":  # a scalar where an event should be
                    _message(value, index, source.name, context.skipped, room_name)
                elif prefix == "room_name" and event == "string":
                    room_name = str(value)
        except ijson.JSONError as exc:
            raise json_error(source.name, f"message {index}", exc) from None
        except ReplayInputError as exc:
            if exc.where:
                raise
            # The stream's own refusal (too deep, too large) while reading this message.
            raise ReplayInputError(source.name, f"message {index}", exc.why) from None


def _message(
    item: object, index: int, file: str, skipped: Skipped, room_name: str
) -> ChatMessage | None:
    """One exported event as the gateway would have seen it; None when skipped."""
    if not isinstance(item, Mapping):
        raise ReplayInputError(file, f"message {index}", "is not a JSON object")
    event_id = _text(item.get("event_id"))
    try:
        at = parse_millis(item.get("origin_server_ts"), "origin_server_ts")
    except ValueError as exc:
        raise ReplayInputError(file, f"message {index} (id {event_id})", str(exc)) from None
    kind = _text(item.get("type"))
    if kind != MESSAGE:
        is_service = "state_key" in item or kind in SERVICE_TYPES
        skipped.add("service" if is_service else "unknown_type")
        return None
    content = item.get("content")
    content = content if isinstance(content, Mapping) else {}
    relation = content.get("m.relates_to")
    relation = relation if isinstance(relation, Mapping) else {}
    if relation.get("rel_type") == "m.replace":
        skipped.add("service")
        return None
    msgtype = _text(content.get("msgtype"))
    body = content.get("body")
    if msgtype not in TEXT_MSGTYPES:
        no_text = msgtype is None or msgtype in ATTACHMENT_MSGTYPES
        skipped.add("no_text" if no_text else "unknown_type")
        return None
    if not isinstance(body, str) or not body.strip():
        skipped.add("no_text")
        return None
    sender = _text(item.get("sender"))
    if sender is None:
        skipped.add("no_sender")
        return None
    if event_id is None:
        skipped.add("no_id")
        return None
    room = _text(item.get("room_id")) or room_name or "unknown"
    thread = _text(relation.get("event_id")) if relation.get("rel_type") == "m.thread" else None
    return ChatMessage(
        platform=PLATFORM,
        channel=room,
        thread=thread,
        message_id=event_id,
        at=at,
        sender_id=sender,
        sender_name=sender,
        is_bot=msgtype == BOT_MSGTYPE,
        mentions=_mentions(content),
        channel_name=room_name or room,
    )


def _mentions(content: Mapping[str, object]) -> frozenset[str]:
    """The user ids a message mentions: `m.mentions.user_ids` and pills."""
    found: set[str] = set()
    mentions = content.get("m.mentions")
    user_ids = mentions.get("user_ids") if isinstance(mentions, Mapping) else None
    if isinstance(user_ids, list):
        found.update(user for user in user_ids if isinstance(user, str) and user)
    formatted = content.get("formatted_body")
    if isinstance(formatted, str):
        found.update(unquote(pill) for pill in _PILL.findall(formatted))
    return frozenset(found)


def _text(value: object) -> str | None:
    """A non-empty id, else None."""
    return value if isinstance(value, str) and value else None
