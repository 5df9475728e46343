"""Pure translation of a Reply into Bot API call arguments, and of failed calls back.

`to_send_message` makes one chunk a `sendMessage` (into the reply's forum topic, quoting
`reply_to`); `to_edit_message_text` the `editMessageText` that gives a posted message a
streamed reply's new text; `to_chat_action` the "typing…" of a chat or topic.
`retry_after_seconds`, `nothing_sent` and `not_modified` read a failed call. Nothing here
does I/O.

Decisions where DESIGN.md is silent:
- A reply quotes `reply_to` with `allow_sending_without_reply`, so a deleted message
  does not fail the reply.
- A chat id of ASCII digits (with a minus for groups) is sent as a number, anything else
  (`@channelname`) as text; a topic or message id that is not a 64-bit number is a
  non-retryable `DeliveryError` naming the field (`connectors.ids`).
- A `retry_after` that is not a finite number of seconds counts as `DEFAULT_RETRY_AFTER`.
- The text is sent as written: no `parse_mode`, so an agent's `*` or `<` is never read
  as markup (a stray one would make Telegram refuse the whole message).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from datetime import timedelta

import httpx
from telegram import ReplyParameters
from telegram.constants import ChatAction
from telegram.error import BadRequest, NetworkError, RetryAfter
from telegram.warnings import PTBDeprecationWarning

from connectors.ids import numeric_id
from connectors.telegram.inbound import PLATFORM
from gateway.app.types import Reply

DEFAULT_RETRY_AFTER = 1.0
_NOTHING_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


@dataclass(frozen=True, slots=True)
class SendMessage:
    """The arguments of one `Bot.send_message`."""

    chat_id: int | str
    text: str
    message_thread_id: int | None
    reply_parameters: ReplyParameters | None


@dataclass(frozen=True, slots=True)
class EditMessageText:
    """The arguments of one `Bot.edit_message_text`."""

    chat_id: int | str
    message_id: int
    text: str


@dataclass(frozen=True, slots=True)
class SendChatAction:
    """The arguments of one `Bot.send_chat_action` showing "typing…"."""

    chat_id: int | str
    message_thread_id: int | None
    action: ChatAction = ChatAction.TYPING


def to_send_message(channel_id: str, reply: Reply) -> SendMessage:
    """The `sendMessage` that posts one chunk of `reply` into `channel_id`."""
    quoted = (
        ReplyParameters(
            message_id=_id(reply.reply_to, "reply_to"), allow_sending_without_reply=True
        )
        if reply.reply_to
        else None
    )
    return SendMessage(chat_ref(channel_id), reply.text, _topic(reply.thread_id), quoted)


def to_edit_message_text(channel_id: str, message_id: str, reply: Reply) -> EditMessageText:
    """The `editMessageText` that makes message `message_id` of `channel_id` read the reply."""
    return EditMessageText(chat_ref(channel_id), _id(message_id, "message_id"), reply.text)


def to_chat_action(channel_id: str, thread_id: str | None) -> SendChatAction:
    """The `sendChatAction` that shows "typing…" in a chat or forum topic."""
    return SendChatAction(chat_ref(channel_id), _topic(thread_id))


def chat_ref(channel_id: str) -> int | str:
    """Numeric chat ids as int; `@channelname` references stay text."""
    digits = channel_id.removeprefix("-")
    if digits.isascii() and digits.isdigit():
        return _id(channel_id, "channel_id")
    return channel_id


def nothing_sent(exc: NetworkError) -> bool:
    """True when the request never reached Telegram (so a retry cannot post twice)."""
    return isinstance(exc.__cause__, _NOTHING_SENT)


def not_modified(exc: BadRequest) -> bool:
    """True when an edit was refused because the message reads so already."""
    return "message is not modified" in exc.message.lower()


def retry_after_seconds(exc: RetryAfter) -> float:
    """Telegram's `retry_after` in seconds (PTB warns about the int form; ask quietly)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PTBDeprecationWarning)
        value = exc.retry_after
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    return max(0.0, seconds) if math.isfinite(seconds) else DEFAULT_RETRY_AFTER


def _topic(thread_id: str | None) -> int | None:
    return _id(thread_id, "thread_id") if thread_id else None


def _id(value: str, field: str) -> int:
    return numeric_id(value, platform=PLATFORM, field=field)
