"""Pure translation of a Reply into Mattermost REST v4 calls, and of the server's answers.

`to_post` makes one chunk the body of `POST /api/v4/posts` (in the reply's thread, by
`root_id`, when it has one, with the id `pending_post_id` derives); `to_patch` is the body
of `PUT /api/v4/posts/{id}/patch` that gives a posted message a streamed reply's new text;
`posted_id` reads the new post's id, `error_id` an AppError's id and `retry_after` how long
a 429 asks to wait. Nothing here does I/O.

Decisions where DESIGN.md is silent:
- `reply_to` is not shown: outside threads Mattermost has no reply reference. It names
  the chunk instead: `pending_post_id` is derived from the bot, the channel, the message
  answered, the chunk's index and its text, and the server keeps one post for the same
  `pending_post_id` within 30 seconds (`deduplicateCreatePost`), so a chunk sent again by a
  restart soon after a SIGKILL (sent, not yet confirmed) is not posted twice.
- `ephemeral_to` is not honoured: an ephemeral post (`POST /posts/ephemeral`) needs a
  permission bot accounts do not have by default, so the reply is posted to the channel.
- A 429's wait is its `Retry-After`, else its `X-RateLimit-Reset` (Mattermost's throttle
  gives both in seconds), else `DEFAULT_RETRY_AFTER`; a value that is not a finite,
  non-negative number of seconds (absent, `inf`, `nan`, a word) is skipped.
"""

from __future__ import annotations

import hashlib
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
    pending_post_id: str = ""

    def body(self) -> dict[str, str]:
        """The JSON body of the request (`pending_post_id` only when there is one)."""
        body = {"channel_id": self.channel_id, "message": self.message, "root_id": self.root_id}
        if self.pending_post_id:
            body["pending_post_id"] = self.pending_post_id
        return body


def to_post(channel_id: str, reply: Reply, *, pending_post_id: str = "") -> Post:
    """The call that posts `reply` into `channel_id` (into its thread when it has one)."""
    return Post(channel_id, reply.text, reply.thread_id or "", pending_post_id)


def pending_post_id(bot_id: str, *parts: str | int) -> str:
    """The `pending_post_id` of a chunk, derived from what it is (the same chunk, the same id)."""
    digest = hashlib.sha256("\x1f".join(map(str, (bot_id, *parts))).encode())
    return f"lw{digest.hexdigest()[:40]}"


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
