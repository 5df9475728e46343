"""Pure translation of Slack payloads into InboundMessages (no I/O, no SDK).

`translate_payload` turns one payload (an Events API `event_callback` body, as received
over HTTP or inside a Socket Mode envelope, or a slash-command payload) into an
`InboundMessage`, or a `Skip` saying why it was dropped; `to_inbound` is the same returning
None for a drop. `unroutable` says which payloads bolt cannot even route.

Decisions where DESIGN.md is silent:
- An `event_callback` whose `event` is not an object with a string `type` is malformed:
  bolt would fail on it (an HTTP 500 Slack retries), so it is dropped before bolt sees it.
- `message` and `app_mention` events are translated; every other event type is dropped
  (`Skip.UNSUPPORTED`). Message subtypes other than `bot_message`, `file_share`,
  `thread_broadcast` and `me_message` (edits, deletions, joins, topic changes…) are service
  messages (`Skip.SERVICE`); a message whose text is empty (a file alone) is `Skip.NO_TEXT`.
- A message that mentions the bot reaches an app subscribed to both `message.channels` and
  `app_mention` twice, under two event ids. Both translate to the same message, and
  `event_id` is left None so the pipeline's dedupe goes by the message key (channel + ts):
  the message is answered once, whichever copy comes first, and a redelivery of either (same
  channel and ts) is a duplicate too. `mentions_bot` is the same for both copies because it
  is read from the text (`<@BOT_USER_ID>`), not from the event type.
- A sender is a bot when the event carries `bot_id`, `bot_profile` or subtype `bot_message`;
  its id is `user` when present (a bot user, the id the pair budget and the self filter use)
  else `bot_id`. A message with neither `user` nor `bot_id` is `Skip.NO_SENDER`. The bot's
  own messages (its user id or its bot id) are `Skip.OWN`.
- A leading mention of this bot is removed from the text, so `@bot !loop status` reaches the
  admin commands and the agent sees what was said to it; a bare mention keeps its text.
- `thread_id` is `thread_ts` for a reply in a thread (a thread's parent, where `thread_ts`
  equals `ts`, is not in a thread); `reply_to_bot` is a thread reply under a message of this
  bot (`parent_user_id`). `is_direct` is `channel_type: im` (or a `D…` channel without one).
- Slack sends no display names with events: `sender_name` is the profile's display or real
  name, the bot profile's name or `username` when the event has them, else the user id.
- A slash command (`/loop`, when registered for the app) becomes the text `/loop <text>`
  from a human that addresses the bot; its `trigger_id` is the message id. Other commands
  are `Skip.UNSUPPORTED`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from connectors.skips import Skip
from gateway.app.types import InboundMessage

PLATFORM = "slack"
COMMAND = "/loop"
TEXT_SUBTYPES = frozenset({"bot_message", "file_share", "thread_broadcast", "me_message"})
_MESSAGE_EVENTS = frozenset({"message", "app_mention"})


@dataclass(frozen=True, slots=True)
class BotIdentity:
    """Who a hosted bot is on Slack: config id, bot user id and bot id (from `auth.test`)."""

    bot_id: str
    user_id: str
    app_bot_id: str = ""
    team_id: str = ""

    def mention_pattern(self) -> re.Pattern[str]:
        """`<@U…>` or `<@U…|name>` naming this bot's user."""
        return re.compile(rf"<@{re.escape(self.user_id)}(?:\|[^>]*)?>")


def translate_payload(
    raw: object, *, bot: BotIdentity, received_at: float = 0.0
) -> InboundMessage | Skip:
    """One raw payload as seen by `bot`, or why it is dropped."""
    if not isinstance(raw, Mapping):
        return Skip.MALFORMED
    if "command" in raw:
        return translate_command(raw, bot=bot, received_at=received_at)
    if raw.get("type") != "event_callback":
        return Skip.UNSUPPORTED
    event = raw.get("event")
    if not isinstance(event, Mapping):
        return Skip.MALFORMED
    return translate_event(event, bot=bot, received_at=received_at)


def unroutable(payload: Mapping[str, object]) -> Skip | None:
    """Why bolt could not route a payload (an event_callback's odd `event`), else None."""
    if payload.get("type") != "event_callback":
        return None
    event = payload.get("event")
    if isinstance(event, Mapping) and isinstance(event.get("type"), str):
        return None
    return Skip.MALFORMED


def to_inbound(raw: object, *, bot: BotIdentity, received_at: float = 0.0) -> InboundMessage | None:
    """One raw payload as an InboundMessage for `bot`, or None when it is dropped."""
    result = translate_payload(raw, bot=bot, received_at=received_at)
    return None if isinstance(result, Skip) else result


def translate_event(
    event: Mapping[str, object], *, bot: BotIdentity, received_at: float = 0.0
) -> InboundMessage | Skip:
    """The `event` of an event_callback as an InboundMessage for `bot`, or why it is dropped."""
    if _text(event, "type") not in _MESSAGE_EVENTS:
        return Skip.UNSUPPORTED
    subtype = _text(event, "subtype")
    if subtype is not None and subtype not in TEXT_SUBTYPES:
        return Skip.SERVICE
    channel, ts = _text(event, "channel"), _text(event, "ts")
    if not channel or not ts:
        return Skip.MALFORMED
    user, app_bot = _text(event, "user"), _text(event, "bot_id")
    sender_id = user or app_bot
    if not sender_id:
        return Skip.NO_SENDER
    if user == bot.user_id or (app_bot and app_bot == bot.app_bot_id):
        return Skip.OWN
    text = _text(event, "text") or ""
    if not text.strip():
        return Skip.NO_TEXT
    mention = bot.mention_pattern()
    thread_ts = _text(event, "thread_ts")
    thread_id = thread_ts if thread_ts and thread_ts != ts else None
    return InboundMessage(
        platform=PLATFORM,
        bot_id=bot.bot_id,
        channel_id=channel,
        thread_id=thread_id,
        message_id=ts,
        sender_id=sender_id,
        sender_name=_sender_name(event, sender_id),
        sender_is_bot=bool(app_bot) or "bot_profile" in event or subtype == "bot_message",
        text=_without_leading_mention(text, mention),
        mentions_bot=mention.search(text) is not None,
        reply_to_bot=thread_id is not None and _text(event, "parent_user_id") == bot.user_id,
        is_direct=_is_direct(event, channel),
        received_at=received_at,
        raw=event,
        bot_user_id=bot.user_id,
        event_id=None,
    )


def translate_command(
    payload: Mapping[str, object], *, bot: BotIdentity, received_at: float = 0.0
) -> InboundMessage | Skip:
    """A slash-command payload as the chat text `/loop …`, or why it is dropped."""
    if _text(payload, "command") != COMMAND:
        return Skip.UNSUPPORTED
    channel, user = _text(payload, "channel_id"), _text(payload, "user_id")
    trigger = _text(payload, "trigger_id")
    if not channel or not trigger:
        return Skip.MALFORMED
    if not user:
        return Skip.NO_SENDER
    words = (_text(payload, "text") or "").strip()
    return InboundMessage(
        platform=PLATFORM,
        bot_id=bot.bot_id,
        channel_id=channel,
        thread_id=None,
        message_id=trigger,
        sender_id=user,
        sender_name=_text(payload, "user_name") or user,
        sender_is_bot=False,
        text=f"{COMMAND} {words}".rstrip(),
        mentions_bot=True,
        is_direct=_text(payload, "channel_name") == "directmessage" or channel.startswith("D"),
        received_at=received_at,
        raw=payload,
        bot_user_id=bot.user_id,
        event_id=None,
    )


def _text(mapping: Mapping[str, object], key: str) -> str | None:
    """A string field of untrusted JSON (None when absent or not a string)."""
    value = mapping.get(key)
    return value if isinstance(value, str) else None


def _sender_name(event: Mapping[str, object], sender_id: str) -> str:
    for holder, keys in (
        (event.get("user_profile"), ("display_name", "real_name", "name")),
        (event.get("bot_profile"), ("name",)),
        (event, ("username",)),
    ):
        if isinstance(holder, Mapping):
            for key in keys:
                name = _text(holder, key)
                if name:
                    return name
    return sender_id


def _without_leading_mention(text: str, mention: re.Pattern[str]) -> str:
    """The text after a leading mention of the bot (and the spaces or `:` after it)."""
    stripped = text.lstrip()
    found = mention.match(stripped)
    if found is None:
        return text
    rest = stripped[found.end() :].lstrip(" \t\n,:")
    return rest or text


def _is_direct(event: Mapping[str, object], channel: str) -> bool:
    channel_type = _text(event, "channel_type")
    if channel_type is not None:
        return channel_type == "im"
    return channel.startswith("D")
