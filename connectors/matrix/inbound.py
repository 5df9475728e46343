"""Pure translation of Matrix sync JSON into InboundMessages (no I/O, no SDK).

`translate_event` turns one timeline event of a joined room, as `/sync` gives it, into an
`InboundMessage` or a `Skip` saying why it was dropped; `to_inbound` is the same returning
None for a drop. `encryption_seen` says whether a room's events turn encryption on, and
`member_names` reads the display names its member events set.

Decisions where DESIGN.md is silent:
- Only `m.room.message` events with a text msgtype (`m.text`, `m.notice`, `m.emote`) and
  a non-empty `body` are messages; other msgtypes (images, files) are `Skip.NO_TEXT`, an
  `m.room.encrypted` event or any message in a room known to be encrypted is
  `Skip.ENCRYPTED`, an edit (`m.replace`) is `Skip.UNSUPPORTED` (the original was
  answered), and every other event type (state, reactions, redactions) is
  `Skip.UNSUPPORTED`.
- An event whose `origin_server_ts` is older than the connector's first sync is
  `Skip.HISTORY`: a room joined later shows its past in the timeline, and none of it is
  answered. An event without a timestamp counts as history too (fail closed).
- Who is a bot: a sender the bot's `bot_users` names (an id or a glob, case-sensitive as
  Matrix ids are), and every sender of `m.notice` (bots send notices and do not answer them).
- The bot is mentioned when `m.mentions.user_ids` names it, when the formatted body holds a
  pill (a `https://matrix.to/#/@bot:server` link, `@` written as is or as `%40`), or,
  for a client that sends no `m.mentions`, when the body holds its user id. A leading
  mention (the id or its localpart, then `:` or `,`) is removed from the
  text, so `helper: /loop status` reaches the admin commands.
- `thread_id` is the thread root of an `m.thread` relation; `message_id` is the event id
  and `event_id` is left None, so the pipeline's dedupe goes by the message key (room +
  event id), the same for every hosted bot and every redelivery of the sync batch.
- `sender_name` is the sender's display name from the room's member events when the
  connector has seen one, else the localpart of the id.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase

from connectors.skips import Skip
from gateway.app.types import InboundMessage

PLATFORM = "matrix"
MESSAGE = "m.room.message"
ENCRYPTED = "m.room.encrypted"
ENCRYPTION = "m.room.encryption"
MEMBER = "m.room.member"
TEXT_MSGTYPES = frozenset({"m.text", "m.notice", "m.emote"})
NOTICE = "m.notice"


@dataclass(frozen=True, slots=True)
class BotIdentity:
    """Who a hosted bot is on Matrix: config id, user id, and which senders are bots."""

    bot_id: str
    user_id: str
    bot_users: tuple[str, ...] = ()

    @property
    def localpart(self) -> str:
        """`helper` of `@helper:example.org`."""
        return self.user_id[1:].split(":", 1)[0]

    def names_bot(self, sender: str) -> bool:
        """True when `bot_users` names `sender` (an id or a glob)."""
        return any(fnmatchcase(sender, pattern) for pattern in self.bot_users)

    def pill_pattern(self) -> re.Pattern[str]:
        """A matrix.to link to this bot's user, `@` as is or percent-encoded."""
        user = re.escape(self.user_id[1:])
        return re.compile(rf"https://matrix\.to/#/(?:@|%40){user}(?=[\"'?/])", re.IGNORECASE)

    def leading_mention(self) -> re.Pattern[str]:
        """The bot named at the start of a body (id or localpart), then `:` or `,`."""
        names = "|".join(re.escape(name) for name in (self.user_id, self.localpart))
        return re.compile(rf"^\s*@?(?:{names})\s*[:,]\s*")


def encryption_seen(events: list[object]) -> bool:
    """True when one of these events is the room's `m.room.encryption` state."""
    return any(isinstance(e, Mapping) and e.get("type") == ENCRYPTION for e in events)


def member_names(events: list[object]) -> dict[str, str]:
    """Display names set by the `m.room.member` events among these, by user id."""
    names: dict[str, str] = {}
    for event in events:
        if not isinstance(event, Mapping) or event.get("type") != MEMBER:
            continue
        user, content = event.get("state_key"), event.get("content")
        if isinstance(user, str) and isinstance(content, Mapping):
            name = content.get("displayname")
            if isinstance(name, str) and name.strip():
                names[user] = name
    return names


def translate_event(
    event: object,
    *,
    room_id: str,
    bot: BotIdentity,
    since_ms: int,
    encrypted: bool = False,
    names: Mapping[str, str] | None = None,
    received_at: float = 0.0,
) -> InboundMessage | Skip:
    """One timeline event of `room_id` as seen by `bot`, or why it is dropped."""
    if not isinstance(event, Mapping):
        return Skip.MALFORMED
    kind = _text(event, "type")
    if kind == ENCRYPTED:
        return Skip.ENCRYPTED
    if kind != MESSAGE or "state_key" in event:
        return Skip.UNSUPPORTED
    event_id, sender = _text(event, "event_id"), _text(event, "sender")
    content = event.get("content")
    if not event_id or not isinstance(content, Mapping):
        return Skip.MALFORMED
    if not sender:
        return Skip.NO_SENDER
    if sender == bot.user_id:
        return Skip.OWN
    sent_at = event.get("origin_server_ts")
    if not isinstance(sent_at, int) or isinstance(sent_at, bool) or sent_at < since_ms:
        return Skip.HISTORY
    if encrypted:
        return Skip.ENCRYPTED
    relation = content.get("m.relates_to")
    relation = relation if isinstance(relation, Mapping) else {}
    if relation.get("rel_type") == "m.replace":
        return Skip.UNSUPPORTED
    msgtype, body = _text(content, "msgtype"), _text(content, "body") or ""
    if msgtype not in TEXT_MSGTYPES or not body.strip():
        return Skip.NO_TEXT
    thread_root = _text(relation, "event_id") if relation.get("rel_type") == "m.thread" else None
    mentioned = _mentions(content, body, bot)
    return InboundMessage(
        platform=PLATFORM,
        bot_id=bot.bot_id,
        channel_id=room_id,
        thread_id=thread_root or None,
        message_id=event_id,
        sender_id=sender,
        sender_name=(names or {}).get(sender) or sender[1:].split(":", 1)[0] or sender,
        sender_is_bot=msgtype == NOTICE or bot.names_bot(sender),
        text=_without_leading_mention(body, bot) if mentioned else body,
        mentions_bot=mentioned,
        received_at=received_at,
        raw=event,
        bot_user_id=bot.user_id,
        event_id=None,
    )


def to_inbound(
    event: object, *, room_id: str, bot: BotIdentity, since_ms: int, received_at: float = 0.0
) -> InboundMessage | None:
    """One timeline event as an InboundMessage for `bot`, or None when it is dropped."""
    result = translate_event(
        event, room_id=room_id, bot=bot, since_ms=since_ms, received_at=received_at
    )
    return None if isinstance(result, Skip) else result


def _text(mapping: Mapping[str, object], key: str) -> str | None:
    """A string field of untrusted JSON (None when absent or not a string)."""
    value = mapping.get(key)
    return value if isinstance(value, str) else None


def _mentions(content: Mapping[str, object], body: str, bot: BotIdentity) -> bool:
    mentions = content.get("m.mentions")
    if isinstance(mentions, Mapping):
        users = mentions.get("user_ids")
        if isinstance(users, list) and bot.user_id in users:
            return True
    formatted = _text(content, "formatted_body")
    if formatted and bot.pill_pattern().search(formatted):
        return True
    return not isinstance(mentions, Mapping) and bot.user_id in body


def _without_leading_mention(body: str, bot: BotIdentity) -> str:
    """The body after a leading mention of the bot; a bare mention keeps its text."""
    found = bot.leading_mention().match(body)
    if found is None:
        return body
    return body[found.end() :] or body
