"""A Slack workspace export (a folder or its zip): `channels.json`, `users.json`, and one
`<channel>/<YYYY-MM-DD>.json` list of messages per channel and day.

Conversations are listed in `channels.json` (public), `groups.json` (private),
`mpims.json` (group DMs) and `dms.json` (direct messages, whose folder is named by id);
a folder none of them lists is replayed under its folder name. Each day file is a small
document (read whole, through `gateway.app.jsonbody`'s checks); channels are replayed one
after the other, each day in date order, messages in the order the file holds them.

Decisions where DESIGN.md is silent, as the gateway's Slack connector decides them:
- A message is `ts`, `user` or `bot_id`, `text`, `subtype`, `thread_ts`. Subtypes
  `bot_message`, `file_share`, `thread_broadcast` and `me_message` are conversation;
  the known system subtypes (joins, leaves, topics, purposes, renames, pins, bot
  additions, edits and deletions, …) are skipped as `service`, any other subtype as
  `unknown_type`. Empty text is `no_text`; neither `user` nor `bot_id` is `no_sender`.
- A sender is a bot when the message has `bot_id`, `bot_profile` or subtype
  `bot_message`, or `users.json` says `is_bot`; its id is `user` when present, else
  `bot_id`. Its name is the message's profile display or real name, the users.json
  name, the bot profile's name or `username`, else the id.
- A reply in a thread (`thread_ts` other than its own `ts`) is in that thread of its
  channel's room. `<@U…>` in the text is a mention of that user.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath

from gateway.replay.inputs import ReadContext, Source
from gateway.replay.records import ChatMessage, ReplayInputError, Skipped, parse_time

PLATFORM = "slack"
TEXT_SUBTYPES = frozenset({"bot_message", "file_share", "thread_broadcast", "me_message"})
SERVICE_SUBTYPES = frozenset(
    {
        "channel_join",
        "channel_leave",
        "channel_topic",
        "channel_purpose",
        "channel_name",
        "channel_archive",
        "channel_unarchive",
        "channel_convert_to_private",
        "channel_convert_to_public",
        "channel_posting_permissions",
        "group_join",
        "group_leave",
        "group_topic",
        "group_purpose",
        "group_name",
        "group_archive",
        "group_unarchive",
        "pinned_item",
        "unpinned_item",
        "bot_add",
        "bot_remove",
        "bot_enable",
        "bot_disable",
        "reminder_add",
        "message_changed",
        "message_deleted",
        "message_replied",
        "tombstone",
        "sh_room_created",
        "huddle_thread",
        "joiner_notification",
        "slackbot_response",
    }
)
CONVERSATION_LISTS = ("channels.json", "groups.json", "mpims.json", "dms.json")
_DAY = re.compile(r"\d{4}-\d{2}-\d{2}\.json")
_MENTION = re.compile(r"<@([A-Z0-9]+)(?:\|[^>]*)?>")


@dataclass(frozen=True, slots=True)
class _Conversation:
    """A conversation of the export: the gateway's channel id, a name, whether a DM."""

    channel: str
    name: str
    is_direct: bool


@dataclass(frozen=True, slots=True)
class _User:
    name: str
    is_bot: bool


def looks_like(files: Mapping[str, Source]) -> bool:
    """Whether a folder's (or zip's) files are a Slack export."""
    return _base(files) is not None


def _base(files: Mapping[str, Source]) -> str | None:
    """The folder inside the tree holding `channels.json` or `users.json` ('' for the top)."""
    for path in files:
        pure = PurePosixPath(path)
        if pure.name in ("channels.json", "users.json") and len(pure.parts) <= 2:
            return "" if len(pure.parts) == 1 else pure.parts[0] + "/"
    return None


def read(files: Mapping[str, Source], context: ReadContext) -> Iterator[ChatMessage]:
    """Every message of every conversation, channel by channel, day by day."""
    base = _base(files) or ""
    users = _users(files.get(base + "users.json"), context)
    conversations = _conversations(files, base, context)
    days: dict[str, list[str]] = {}
    for path in files:
        if not path.startswith(base):
            continue
        parts = PurePosixPath(path[len(base) :]).parts
        if len(parts) == 2 and _DAY.fullmatch(parts[1]):
            days.setdefault(parts[0], []).append(path)
    for folder in sorted(days):
        where = conversations.get(folder) or _Conversation(folder, f"#{folder}", False)
        for path in sorted(days[folder]):
            source = files[path]
            document = source.read_document(context.limits, context.progress)
            if not isinstance(document, list):
                raise ReplayInputError(source.name, "", "is not a list of messages")
            for index, item in enumerate(document):
                message = _message(
                    item, index, file=source.name, where=where, users=users, skipped=context.skipped
                )
                if message is not None:
                    yield message


def _users(source: Source | None, context: ReadContext) -> dict[str, _User]:
    """users.json: each member's (and bot user's) name and whether it is a bot."""
    if source is None:
        return {}
    document = source.read_document(context.limits, context.progress)
    users: dict[str, _User] = {}
    for item in document if isinstance(document, list) else ():
        if not isinstance(item, Mapping) or not isinstance(item.get("id"), str):
            continue
        profile = item.get("profile")
        profile = profile if isinstance(profile, Mapping) else {}
        name = (
            _text(profile, "display_name")
            or _text(profile, "real_name")
            or _text(item, "real_name")
            or _text(item, "name")
            or str(item["id"])
        )
        users[str(item["id"])] = _User(name, item.get("is_bot") is True)
    return users


def _conversations(
    files: Mapping[str, Source], base: str, context: ReadContext
) -> dict[str, _Conversation]:
    """The export's conversations by folder name."""
    found: dict[str, _Conversation] = {}
    for listing in CONVERSATION_LISTS:
        source = files.get(base + listing)
        if source is None:
            continue
        document = source.read_document(context.limits, context.progress)
        for item in document if isinstance(document, list) else ():
            if not isinstance(item, Mapping) or not isinstance(item.get("id"), str):
                continue
            channel = str(item["id"])
            direct = listing == "dms.json"
            folder = channel if direct else (_text(item, "name") or channel)
            found[folder] = _Conversation(channel, f"#{folder}", direct)
    return found


def _message(
    item: object,
    index: int,
    *,
    file: str,
    where: _Conversation,
    users: Mapping[str, _User],
    skipped: Skipped,
) -> ChatMessage | None:
    """One exported message as the gateway would have seen it; None when skipped."""
    if not isinstance(item, Mapping):
        raise ReplayInputError(file, f"message {index}", "is not a JSON object")
    ts = item.get("ts")
    try:
        at = parse_time(ts, "ts")
    except ValueError as exc:
        raise ReplayInputError(file, f"message {index}", str(exc)) from None
    subtype = _text(item, "subtype")
    if item.get("type", "message") != "message":
        skipped.add("unknown_type")
        return None
    if subtype is not None and subtype not in TEXT_SUBTYPES:
        skipped.add("service" if subtype in SERVICE_SUBTYPES else "unknown_type")
        return None
    user, app_bot = _text(item, "user"), _text(item, "bot_id")
    sender = user or app_bot
    if sender is None:
        skipped.add("no_sender")
        return None
    text = _text(item, "text")
    if text is None or not text.strip():
        skipped.add("no_text")
        return None
    known = users.get(sender)
    ts_text = str(ts)
    thread_ts = _text(item, "thread_ts")
    return ChatMessage(
        platform=PLATFORM,
        channel=where.channel,
        thread=thread_ts if thread_ts and thread_ts != ts_text else None,
        message_id=ts_text,
        at=at,
        sender_id=sender,
        sender_name=_name(item, known, sender),
        is_bot=bool(app_bot)
        or "bot_profile" in item
        or subtype == "bot_message"
        or (known is not None and known.is_bot),
        mentions=frozenset(_MENTION.findall(text)),
        is_direct=where.is_direct,
        channel_name=where.name,
    )


def _name(item: Mapping[str, object], known: _User | None, sender: str) -> str:
    """The sender's name as the export shows it."""
    profile = item.get("user_profile")
    if isinstance(profile, Mapping):
        shown = _text(profile, "display_name") or _text(profile, "real_name")
        if shown:
            return shown
    if known is not None:
        return known.name
    bot = item.get("bot_profile")
    if isinstance(bot, Mapping) and _text(bot, "name"):
        return str(bot["name"])
    return _text(item, "username") or sender


def _text(item: Mapping[str, object], key: str) -> str | None:
    """A non-empty text field, else None."""
    value = item.get(key)
    return value if isinstance(value, str) and value else None
