"""Pure translation of a Reply into a Slack Web API call, and of Slack's answers back.

`to_post` makes one chunk a `chat.postMessage` (in the reply's thread, if any) or, when
the reply is `ephemeral_to` someone, a `chat.postEphemeral` to that user; `posted_id`
reads the id of what was posted from the answer; `to_update` is the `chat.update` that
gives a posted message (by its `ts`) a streamed reply's new text. `error_code`, `status`
and `retry_after` read a failed call. Nothing here does I/O.

Decisions where DESIGN.md is silent:
- `reply_to` is not used: Slack has no reply reference outside threads.
- The text is sent as written (Slack renders its own mrkdwn); no blocks are built.
- A `Retry-After` that is not a finite number of seconds (absent, `inf`, `nan`, a word)
  counts as `DEFAULT_RETRY_AFTER`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from slack_sdk.errors import SlackApiError

from gateway.app.types import Reply

DEFAULT_RETRY_AFTER = 1.0


@dataclass(frozen=True, slots=True)
class Post:
    """One chunk as a Web API call; `user` is set for an ephemeral message only."""

    method: Literal["chat.postMessage", "chat.postEphemeral"]
    channel: str
    text: str
    thread_ts: str | None
    user: str | None = None


def to_post(channel_id: str, reply: Reply) -> Post:
    """The call that posts `reply` into `channel_id`."""
    if reply.ephemeral_to:
        return Post(
            "chat.postEphemeral", channel_id, reply.text, reply.thread_id, reply.ephemeral_to
        )
    return Post("chat.postMessage", channel_id, reply.text, reply.thread_id)


@dataclass(frozen=True, slots=True)
class Update:
    """One `chat.update`: the channel, the message's `ts` and its new text."""

    channel: str
    ts: str
    text: str


def to_update(channel_id: str, message_id: str, reply: Reply) -> Update:
    """The call that makes the message `message_id` (its `ts`) of `channel_id` read the reply."""
    return Update(channel_id, message_id, reply.text)


def posted_id(post: Post, answer: Mapping[str, object]) -> str | None:
    """The `ts` of the message posted (`message_ts` for an ephemeral one), if Slack gave it."""
    value = answer.get("message_ts" if post.user else "ts")
    return value if isinstance(value, str) else None


def status(exc: SlackApiError) -> int:
    """The HTTP status of a failed call (0 when unknown)."""
    code = getattr(exc.response, "status_code", 0)
    return code if isinstance(code, int) else 0


def error_code(exc: SlackApiError) -> str:
    """Slack's error code (`invalid_auth`, `ratelimited`…): never the token or the request."""
    data = getattr(exc.response, "data", None)
    code = data.get("error") if isinstance(data, Mapping) else None
    return code if isinstance(code, str) else f"HTTP {status(exc)}"


def rate_limited(exc: SlackApiError) -> bool:
    """True for a 429 or Slack's `ratelimited` error."""
    return status(exc) == 429 or error_code(exc) == "ratelimited"


def retry_after(exc: SlackApiError) -> float:
    """The seconds Slack asked to wait (`Retry-After`), else `DEFAULT_RETRY_AFTER`."""
    headers = getattr(exc.response, "headers", None) or {}
    try:
        seconds = float(headers.get("Retry-After", DEFAULT_RETRY_AFTER))
    except (TypeError, ValueError):
        return DEFAULT_RETRY_AFTER
    return max(0.0, seconds) if math.isfinite(seconds) else DEFAULT_RETRY_AFTER
