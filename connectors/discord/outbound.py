"""Pure translation of a Reply into discord.py's send arguments, and of a failed send back.

`to_post` says where one chunk goes (the channel, or a thread) and which message it
replies to; `Post.send_options` adds what every post carries (the nonce, the mention
rules). `to_edit` says which posted message a streamed reply's new text goes into (a
message edit, `PATCH /channels/{id}/messages/{id}`). `may_have_posted` and `retry_after`
read a failed send or edit. Nothing here does I/O; the connector decides, with what it
remembers, which thread a reply goes into.

Decisions where DESIGN.md is silent:
- A reply is a Discord reply to `reply_to` that does not ping its author
  (`replied_user: false`); `@everyone`, `@here` and role mentions written by an agent never
  ping, user mentions do.
- A chunk posted into the thread opened on the message it answers carries no reply
  reference: the thread hangs off that message already.
- A channel, thread or message id that is not a 64-bit number is a non-retryable
  `DeliveryError` naming the field (`connectors.ids`).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any

import aiohttp

from connectors.discord.inbound import PLATFORM
from connectors.ids import numeric_id
from gateway.app.types import Reply

with warnings.catch_warnings():
    # discord.py imports the stdlib `audioop` (for voice), deprecated since Python 3.11.
    warnings.filterwarnings("ignore", "'audioop' is deprecated", DeprecationWarning)
    import discord

ALLOWED_MENTIONS = discord.AllowedMentions(
    everyone=False, roles=False, users=True, replied_user=False
)


@dataclass(frozen=True, slots=True)
class Post:
    """One chunk as `Messageable.send` takes it: the channel or thread, text, reference."""

    target: int
    content: str
    reference: discord.MessageReference | None

    def send_options(self, nonce: int) -> dict[str, Any]:
        """The keyword arguments of `send` besides the content (no `reference` when None)."""
        options: dict[str, Any] = {"nonce": nonce, "allowed_mentions": ALLOWED_MENTIONS}
        if self.reference is not None:
            options["reference"] = self.reference
        return options


def to_post(channel_id: str, reply: Reply, *, thread: str | None, on_starter: bool) -> Post:
    """Where one chunk goes (`thread`, else the channel) and the message it replies to.

    `on_starter` is true when `thread` was opened on the very message the reply answers.
    """
    field = "thread_id" if thread else "channel_id"
    target = numeric_id(thread or channel_id, platform=PLATFORM, field=field)
    reference = None
    if reply.reply_to and not on_starter:
        message = numeric_id(reply.reply_to, platform=PLATFORM, field="reply_to")
        reference = discord.MessageReference(
            message_id=message, channel_id=target, fail_if_not_exists=False
        )
    return Post(target, reply.text, reference)


@dataclass(frozen=True, slots=True)
class Edit:
    """One message edit: the channel or thread the message is in, its id, the new text."""

    target: int
    message_id: int
    content: str


def to_edit(channel_id: str, message_id: str, reply: Reply, *, thread: str | None) -> Edit:
    """The edit making message `message_id` (in `thread`, else the channel) read `reply.text`."""
    field = "thread_id" if thread else "channel_id"
    target = numeric_id(thread or channel_id, platform=PLATFORM, field=field)
    message = numeric_id(message_id, platform=PLATFORM, field="message_id")
    return Edit(target, message, reply.text)


def may_have_posted(exc: Exception) -> bool:
    """True when a failed send may still have created the message (retry with its nonce)."""
    if isinstance(exc, discord.DiscordServerError):
        return True
    if isinstance(exc, aiohttp.ClientConnectorError):
        return False
    return isinstance(exc, aiohttp.ClientError | TimeoutError | ConnectionError)


def retry_after(exc: discord.HTTPException) -> float | None:
    """The wait Discord asked for, from the 429 the SDK gave up on."""
    headers = getattr(exc.response, "headers", None)
    if headers is None:
        return None
    for name in ("X-RateLimit-Reset-After", "Retry-After"):
        value = headers.get(name)
        if value is None:
            continue
        try:
            seconds = float(value)
        except ValueError:
            continue
        if math.isfinite(seconds) and seconds >= 0:
            return seconds
    return None
