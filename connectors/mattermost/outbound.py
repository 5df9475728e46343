"""Pure translation of a Reply into Mattermost REST v4 calls, and of the server's answers.

`to_post` makes one chunk the body of `POST /api/v4/posts` (in the reply's thread, by
`root_id`, when it has one); `to_patch` is the body of `PUT /api/v4/posts/{id}/patch` that
gives a posted message a streamed reply's new text; `posted_id` reads the new post's id,
`error_id` an AppError's id and `retry_after` how long a 429 asks to wait. Nothing here
does I/O.

Decisions where DESIGN.md is silent:
- `reply_to` is not used: outside threads Mattermost has no reply reference.
- `ephemeral_to` is not honoured: an ephemeral post (`POST /posts/ephemeral`) needs a
  permission bot accounts do not have by default, so the reply is posted to the channel.
- A 429's wait is its `Retry-After`, else its `X-RateLimit-Reset` (Mattermost's throttle
  gives both in seconds), else `DEFAULT_RETRY_AFTER`; a value that is not a finite,
  non-negative number of seconds (absent, `inf`, `nan`, a word) is skipped.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from gateway.app.types import Reply

DEFAULT_RETRY_AFTER = 1.0
_WAIT_HEADERS = ("Retry-After", "X-RateLimit-Reset")


@dataclass(frozen=True, slots=True)
class Post:
    """One chunk as a `POST /posts` body: the channel, the text and the thread's root post."""

    channel_id: str
    message: str
    root_id: str = ""

    def body(self) -> dict[str, str]:
        """The JSON body of the request."""
        return {"channel_id": self.channel_id, "message": self.message, "root_id": self.root_id}


def to_post(channel_id: str, reply: Reply) -> Post:
    """The call that posts `reply` into `channel_id` (into its thread when it has one)."""
    return Post(channel_id, reply.text, reply.thread_id or "")


def to_patch(reply: Reply) -> dict[str, str]:
    """The `PUT /posts/{id}/patch` body that makes a posted message read `reply`."""
    return {"message": reply.text}


def posted_id(answer: object) -> str | None:
    """The id of the post the server created, if its answer has one."""
    value = answer.get("id") if isinstance(answer, Mapping) else None
    return value if isinstance(value, str) and value else None


def error_id(status: int, answer: object) -> str:
    """The AppError's id (`api.context.session_expired.app_error`…), else `HTTP <status>`.

    Never the message or the request: an AppError's `detailed_error` may echo input.
    """
    value = answer.get("id") if isinstance(answer, Mapping) else None
    if isinstance(value, str) and value.isascii() and 0 < len(value) <= 100:
        return value
    return f"HTTP {status}"


def retry_after(headers: Mapping[str, str]) -> float:
    """The seconds a 429 asks to wait: `Retry-After`, else `X-RateLimit-Reset`, else 1."""
    for name in _WAIT_HEADERS:
        try:
            seconds = float(headers.get(name, "nan"))
        except ValueError:
            continue
        if math.isfinite(seconds) and seconds >= 0:
            return seconds
    return DEFAULT_RETRY_AFTER
