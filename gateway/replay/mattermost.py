"""A Mattermost bulk export (`mmctl export create`): JSONL, one object per line.

Lines are `{"type": "version", "version": 1}` first, then teams, channels, users and
bots, then `{"type": "post", "post": {"team", "channel", "user", "type", "message",
"props", "create_at" (milliseconds), "replies": [...]}}` and `{"type": "direct_post",
"direct_post": {"channel_members", "user", "message", "props", "create_at",
"replies"}}`; a reply is `{"user", "type", "message", "props", "create_at"}`. The file
is read a line at a time (each at most `MAX_LINE_BYTES`, through
`gateway.app.jsonbody`'s checks), so a large export never sits in memory.

Decisions where DESIGN.md is silent:
- The export holds names, not ids: a channel's room is `team/channel` (its names), a
  direct or group message's the sorted members joined by `,` (direct with two members).
  A post's replies are in its thread, whose id (and the post's) is its line number; a
  reply's id is `LINE.N`. Replies are handed on in time order with the posts after
  them (up to `MAX_PENDING` replies waiting; past that the earliest goes first).
- Posts of type `system_*` (joins, leaves, header changes) are skipped as `service`,
  any other non-empty type as `unknown_type`; empty text is `no_text`, no `user`
  `no_sender`. A line of a type this reader does not know is one `unknown_type`
  record; version, team, channel, user, bot, direct channel, role, scheme and emoji
  lines are not records.
- A sender is a bot when the post's `props.from_bot` or `props.from_webhook` is true
  (`"true"`, as Mattermost writes it), when a `bot` line of the export names its
  username, or when `--bot` names it. The sender's id and name are the username.
- `@name` in the text mentions that username (lower-cased).
"""

from __future__ import annotations

import heapq
import io
import itertools
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from gateway.app.jsonbody import JsonBodyError, parse_json
from gateway.replay.inputs import ReadContext, Source, numbered_lines
from gateway.replay.records import ChatMessage, ReplayInputError, Skipped, parse_millis

PLATFORM = "mattermost"
MAX_PENDING = 100_000
NOT_RECORDS = frozenset(
    {"version", "team", "channel", "user", "bot", "direct_channel", "role", "scheme", "emoji"}
)
_MENTION = re.compile(r"(?<![\w@])@([a-z0-9][a-z0-9._-]*)", re.IGNORECASE)
_TRUE = ("true", True)


def looks_like(head: bytes) -> bool:
    """Whether a file's first line is a bulk export's version line."""
    line = head.split(b"\n", 1)[0].strip()
    if not line.startswith(b"{") or b'"version"' not in line:
        return False
    try:
        first = parse_json(line)
    except JsonBodyError:
        return False
    return isinstance(first, Mapping) and first.get("type") == "version"


@dataclass(frozen=True, slots=True)
class _Room:
    """Where a post's messages go: the room, a name to show, whether a direct message."""

    channel: str
    name: str
    is_direct: bool


@dataclass(frozen=True, slots=True)
class _Place:
    """Where a post or reply is in the file (for errors) and its message id."""

    file: str
    where: str
    message_id: str


@dataclass(order=True)
class _Pending:
    """A reply waiting for the posts before it: ordered by time, then file order."""

    at: float
    order: int
    message: ChatMessage = field(compare=False)


def read(source: Source, context: ReadContext) -> Iterator[ChatMessage]:
    """The posts and replies of the export, in time order as far as `MAX_PENDING` allows."""
    bots: set[str] = set()
    pending: list[_Pending] = []
    order = itertools.count()
    with source.open(context.limits, json=False, progress=context.progress) as raw:
        for number, line in numbered_lines(io.BufferedReader(raw), source.name):
            if not line.strip():
                continue
            post, replies = _line(line, number, source.name, bots, context.skipped)
            if post is not None:
                while pending and pending[0].at <= post.at:
                    yield heapq.heappop(pending).message
                yield post
            for reply in replies:
                heapq.heappush(pending, _Pending(reply.at, next(order), reply))
                if len(pending) > MAX_PENDING:
                    yield heapq.heappop(pending).message
    while pending:
        yield heapq.heappop(pending).message


def _line(
    line: bytes, number: int, file: str, bots: set[str], skipped: Skipped
) -> tuple[ChatMessage | None, list[ChatMessage]]:
    """One line's post (None when skipped or not a post) and its replies."""
    where = f"line {number}"
    try:
        data = parse_json(line)
    except JsonBodyError as exc:
        raise ReplayInputError(file, where, str(exc)) from None
    if not isinstance(data, Mapping):
        raise ReplayInputError(file, where, "is not a JSON object")
    kind = _text(data.get("type"))
    if kind == "bot":
        bot = data.get("bot")
        username = _text(bot.get("username")) if isinstance(bot, Mapping) else None
        if username is not None:
            bots.add(username)
        return None, []
    if kind in NOT_RECORDS:
        return None, []
    if kind not in ("post", "direct_post"):
        skipped.add("unknown_type")
        return None, []
    post = data.get(str(kind))
    if not isinstance(post, Mapping):
        raise ReplayInputError(file, where, f"{kind} is not a JSON object")
    room = _room(post, str(kind))
    thread = str(number)
    first = _message(
        post, _Place(file, where, thread), room, thread=None, bots=bots, skipped=skipped
    )
    replies = post.get("replies")
    if replies is None:
        return first, []
    if not isinstance(replies, list):
        raise ReplayInputError(file, where, "replies is not a list")
    found = []
    for index, reply in enumerate(replies, start=1):
        place = _Place(file, f"{where} reply {index}", f"{thread}.{index}")
        message = _message(reply, place, room, thread=thread, bots=bots, skipped=skipped)
        if message is not None:
            found.append(message)
    return first, found


def _room(post: Mapping[str, object], kind: str) -> _Room:
    """A post's room."""
    if kind == "direct_post":
        members = post.get("channel_members")
        names = sorted(
            {member for member in members if isinstance(member, str) and member}
            if isinstance(members, list)
            else ()
        )
        room = ",".join(names) or "unknown"
        return _Room(room, "@" + ", @".join(names) if names else room, len(names) == 2)
    team, channel = _text(post.get("team")) or "", _text(post.get("channel")) or "unknown"
    return _Room(f"{team}/{channel}", f"~{channel}", False)


def _message(
    item: object,
    place: _Place,
    room: _Room,
    *,
    thread: str | None,
    bots: set[str],
    skipped: Skipped,
) -> ChatMessage | None:
    """One post or reply as the gateway would have seen it; None when skipped."""
    if not isinstance(item, Mapping):
        raise ReplayInputError(place.file, place.where, "is not a JSON object")
    try:
        at = parse_millis(item.get("create_at"), "create_at")
    except ValueError as exc:
        raise ReplayInputError(place.file, place.where, str(exc)) from None
    kind = item.get("type")
    if kind:
        is_service = isinstance(kind, str) and kind.startswith("system_")
        skipped.add("service" if is_service else "unknown_type")
        return None
    sender = _text(item.get("user"))
    if sender is None:
        skipped.add("no_sender")
        return None
    text = item.get("message")
    if not isinstance(text, str) or not text.strip():
        skipped.add("no_text")
        return None
    props = item.get("props")
    props = props if isinstance(props, Mapping) else {}
    return ChatMessage(
        platform=PLATFORM,
        channel=room.channel,
        thread=thread,
        message_id=place.message_id,
        at=at,
        sender_id=sender,
        sender_name=sender,
        is_bot=sender in bots
        or props.get("from_bot") in _TRUE
        or props.get("from_webhook") in _TRUE,
        mentions=frozenset(found.casefold() for found in _MENTION.findall(text)),
        is_direct=room.is_direct,
        channel_name=room.name,
    )


def _text(value: object) -> str | None:
    """A non-empty name, else None."""
    return value if isinstance(value, str) and value else None
