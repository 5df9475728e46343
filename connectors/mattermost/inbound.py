"""Pure translation of Mattermost websocket events into InboundMessages (no I/O).

`parse_frame` reads one websocket text frame (an event or the answer to an action);
`translate_event` turns a `posted` event into an `InboundMessage`, or a `Skip` saying why
it was dropped; `to_inbound` is the same returning None for a drop. `is_bot_flagged` says
whether a post declares itself a bot's.

Decisions where DESIGN.md is silent:
- Only `posted` events are messages. `post_edited` is well formed but not answered
  (`Skip.UNSUPPORTED`, as edits are on Slack); the connector ignores every other event
  kind (typing, status changes, channel views…) without counting it: they are not
  messages anyone could have meant for a bot.
- A post with a `type` (`system_join_channel`, `system_header_change`…) is a service
  message; an empty message (a file alone) is `Skip.NO_TEXT`; one without `user_id` is
  `Skip.NO_SENDER`; the bot's own posts (its user id) are `Skip.OWN`.
- A sender is a bot when the post says so: `props.from_bot` (set by the server on every
  post of a bot account) or `props.from_webhook` (an incoming webhook, which speaks for a
  script, not a person). The connector then asks the server about every other sender
  (`GET /users/{id}`, `is_bot`) before handing the message over, so a bot that posts
  without the flag is still a bot; `sender_is_bot` here is only what the post declares.
- `mentions_bot`: the event's `mentions` (a JSON string of user ids) names the bot, or
  the message has `@username` of the bot (not inside a longer name). A leading mention is
  removed from the text, so `@bot !loop status` reaches the admin commands.
- `thread_id` is the post's `root_id` (Mattermost threads hang off a root post; a root
  post is in no thread). `reply_to_bot` is not known from the event (the root's author
  is not in it) and stays False: a thread reply to the bot is addressed only by mention.
- `is_direct` is `channel_type: D` (a direct message); group messages (`G`) are rooms.
- `sender_name` is the event's `sender_name` without its `@` (a webhook's
  `override_username` as the server gives it), else the user id.
- `event_id` is None: `seq` counts per websocket connection and starts again after a
  reconnect, so the pipeline's dedupe goes by the message key (channel + post id).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from connectors.skips import Skip
from gateway.app.jsonbody import parse_json
from gateway.app.types import InboundMessage

PLATFORM = "mattermost"
MAX_FRAME_BYTES = 1024 * 1024
"""A websocket frame larger than this is dropped unread (a post is at most 16,383 runes)."""
MATTERMOST_ID = re.compile(r"^[a-z0-9]{26}$")
"""Mattermost ids (users, posts, channels): 26 characters of its base-32 alphabet."""
_MESSAGE_EVENTS = frozenset({"posted", "post_edited"})


@dataclass(frozen=True, slots=True)
class BotIdentity:
    """Who a hosted bot is on Mattermost: config id, user id and username (`/users/me`)."""

    bot_id: str
    user_id: str
    username: str

    def mention_pattern(self) -> re.Pattern[str]:
        """`@username` of this bot, not part of a longer name (`@helper2`, `a@helper`)."""
        return re.compile(rf"(?<![\w.@-])@{re.escape(self.username)}(?![\w.-]*\w)", re.IGNORECASE)


def parse_frame(text: str) -> Mapping[str, object] | None:
    """One websocket frame as a JSON object, or None when it is not one (or too large)."""
    value = _json_in(text)
    return value if isinstance(value, Mapping) else None


def event_name(frame: Mapping[str, object]) -> str | None:
    """The `event` of a frame; None for an answer to an action (`seq_reply`)."""
    return _text(frame, "event")


def is_message_event(frame: Mapping[str, object]) -> bool:
    """True for the events that carry a post (`posted`, `post_edited`)."""
    return event_name(frame) in _MESSAGE_EVENTS


def translate_event(
    frame: Mapping[str, object], *, bot: BotIdentity, received_at: float = 0.0
) -> InboundMessage | Skip:
    """A `posted` event as an InboundMessage for `bot`, or why it is dropped."""
    name = event_name(frame)
    if name not in _MESSAGE_EVENTS:
        return Skip.UNSUPPORTED
    data = frame.get("data")
    if not isinstance(data, Mapping):
        return Skip.MALFORMED
    post = _post(data)
    if post is None:
        return Skip.MALFORMED
    if name != "posted":
        return Skip.UNSUPPORTED
    post_id, channel_id = _text(post, "id"), _text(post, "channel_id")
    if not post_id or not channel_id:
        return Skip.MALFORMED
    if _text(post, "type"):
        return Skip.SERVICE
    sender_id = _text(post, "user_id")
    if not sender_id:
        return Skip.NO_SENDER
    if sender_id == bot.user_id:
        return Skip.OWN
    text = _text(post, "message") or ""
    if not text.strip():
        return Skip.NO_TEXT
    mention = bot.mention_pattern()
    root_id = _text(post, "root_id")
    return InboundMessage(
        platform=PLATFORM,
        bot_id=bot.bot_id,
        channel_id=channel_id,
        thread_id=root_id or None,
        message_id=post_id,
        sender_id=sender_id,
        sender_name=(_text(data, "sender_name") or "").removeprefix("@") or sender_id,
        sender_is_bot=is_bot_flagged(post),
        text=_without_leading_mention(text, mention),
        mentions_bot=bot.user_id in _mentioned(data) or mention.search(text) is not None,
        is_direct=_text(data, "channel_type") == "D",
        received_at=received_at,
        raw=post,
        bot_user_id=bot.user_id,
        event_id=None,
    )


def posted_post(frame: Mapping[str, object]) -> Mapping[str, object] | None:
    """The post of a `posted` event, None for other events or one without a post object."""
    data = frame.get("data")
    if event_name(frame) != "posted" or not isinstance(data, Mapping):
        return None
    return _post(data)


def to_inbound(
    frame: Mapping[str, object], *, bot: BotIdentity, received_at: float = 0.0
) -> InboundMessage | None:
    """A `posted` event as an InboundMessage for `bot`, or None when it is dropped."""
    result = translate_event(frame, bot=bot, received_at=received_at)
    return None if isinstance(result, Skip) else result


def is_bot_flagged(post: Mapping[str, object]) -> bool:
    """True when a post declares a bot or a webhook wrote it (`props.from_bot`/`from_webhook`)."""
    props = post.get("props")
    if not isinstance(props, Mapping):
        return False
    return any(_truthy(props.get(key)) for key in ("from_bot", "from_webhook"))


def _truthy(value: object) -> bool:
    """Mattermost writes these props as the string "true"; a JSON true counts too."""
    return value is True or (isinstance(value, str) and value.lower() == "true")


def _post(data: Mapping[str, object]) -> Mapping[str, object] | None:
    """The event's post: a JSON string holding an object (an object is taken as well)."""
    raw = data.get("post")
    if isinstance(raw, str):
        raw = parse_frame(raw)
    return raw if isinstance(raw, Mapping) else None


def _mentioned(data: Mapping[str, object]) -> frozenset[str]:
    """The user ids of the event's `mentions` (a JSON string of a list), if any."""
    raw = data.get("mentions")
    value = _json_in(raw) if isinstance(raw, str) else raw
    if not isinstance(value, list):
        return frozenset()
    return frozenset(item for item in value if isinstance(item, str))


def _json_in(text: str) -> object:
    """The JSON document a frame or a string field holds; None when unreadable or too large."""
    if len(text) > MAX_FRAME_BYTES:
        return None
    try:
        return parse_json(text)
    except ValueError:
        return None


def _text(mapping: Mapping[str, object], key: str) -> str | None:
    """A string field of untrusted JSON (None when absent or not a string)."""
    value = mapping.get(key)
    return value if isinstance(value, str) else None


def _without_leading_mention(text: str, mention: re.Pattern[str]) -> str:
    """The text after a leading mention of the bot (and the spaces or `:`/`,` after it)."""
    stripped = text.lstrip()
    found = mention.match(stripped)
    if found is None:
        return text
    rest = stripped[found.end() :].lstrip(" \t\n,:")
    return rest or text
