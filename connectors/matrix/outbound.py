"""Pure translation of a Reply into Matrix event content, transaction ids and retry waits.

`to_content` makes one chunk an `m.room.message` content (the configured msgtype, in the
reply's thread, quoting the event it answers); `to_edit` makes the `m.replace` content
that gives a posted message a streamed reply's new text; `transaction_id` names a send so
the homeserver can refuse a duplicate; `retry_after` reads `retry_after_ms` and `errcode`
an error answer's errcode. No I/O.

Decisions where DESIGN.md is silent:
- Every reply carries an empty `m.mentions`: a bot's answer pings nobody, whatever its
  text says (a hosted bot quoting another's id must not wake it).
- The first chunk of an answer quotes the event it answers (`m.in_reply_to`); in a thread
  that is the thread's reply fallback too, so clients without threads show the context.
- A send's transaction id is a hash of the bot, the event it answers, the chunk's place
  in that answer and its text: after a restart the same answer gets the same ids and the
  homeserver gives back the event it already has instead of posting it again. An edit's
  id is a hash of the bot, the edited event and the new text.
- A `retry_after_ms` that is not a finite, non-negative number (absent, a word, huge)
  counts as `DEFAULT_RETRY_AFTER` seconds; the wait is capped at `MAX_RETRY_AFTER`.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

from nio import ErrorResponse

from gateway.app.types import Reply

LIMIT_EXCEEDED = "M_LIMIT_EXCEEDED"
DEFAULT_RETRY_AFTER = 1.0
MAX_RETRY_AFTER = 3600.0

Content = dict[str, Any]


def to_content(reply: Reply, *, msgtype: str) -> Content:
    """The content of the `m.room.message` that posts `reply`."""
    content: Content = {"msgtype": msgtype, "body": reply.text, "m.mentions": {}}
    if reply.thread_id:
        content["m.relates_to"] = {
            "rel_type": "m.thread",
            "event_id": reply.thread_id,
            "is_falling_back": reply.reply_to is None,
            "m.in_reply_to": {"event_id": reply.reply_to or reply.thread_id},
        }
    elif reply.reply_to:
        content["m.relates_to"] = {"m.in_reply_to": {"event_id": reply.reply_to}}
    return content


def to_edit(message_id: str, reply: Reply, *, msgtype: str) -> Content:
    """The content of the `m.replace` event that makes `message_id` read `reply.text`."""
    return {
        "msgtype": msgtype,
        "body": f"* {reply.text}",
        "m.mentions": {},
        "m.new_content": {"msgtype": msgtype, "body": reply.text, "m.mentions": {}},
        "m.relates_to": {"rel_type": "m.replace", "event_id": message_id},
    }


def transaction_id(bot_id: str, *parts: str | int) -> str:
    """A transaction id derived from what a send is (the same send gets the same id)."""
    digest = hashlib.sha256("\x1f".join(map(str, (bot_id, *parts))).encode())
    return f"lw{digest.hexdigest()[:40]}"


def retry_after(retry_after_ms: object) -> float:
    """The seconds a rate-limited call asked to wait, else `DEFAULT_RETRY_AFTER`."""
    if not isinstance(retry_after_ms, int | float) or isinstance(retry_after_ms, bool):
        return DEFAULT_RETRY_AFTER
    seconds = float(retry_after_ms) / 1000.0
    if not math.isfinite(seconds) or seconds < 0:
        return DEFAULT_RETRY_AFTER
    return min(seconds, MAX_RETRY_AFTER)


def errcode(answer: object) -> str:
    """A Matrix error answer's errcode (never the token or the request), else its type."""
    if isinstance(answer, ErrorResponse):
        return str(answer.status_code or answer.message or "unknown error")[:100]
    return type(answer).__name__
