"""A streamed reply: one message posted, then edited as the agent writes (DESIGN.md §3).

The agent writes its reply piece by piece (`write`). Each piece passes the turn's stream
filter first: the silence stage sets `SilenceStreamFilter`, so nothing is posted while the
reply may still be a silence token (a silent turn posts nothing, a reply starting "NO"
never shows "NO") and reasoning blocks never are; without that stage reasoning is still
held back (guards.reasoning). What the filter lets through is laid out in chunks within
the platform limit (gateway.delivery.chunking): the first is posted, then edited as it grows, and
text past the limit goes on in new messages. The room is updated at most once per
`edit_seconds` (the agent's `stream_edit_seconds`), on the delivery's clock.

When the turn is over the delivery stage calls `finish` with the reply as the pipeline
made it (silence applied, or a notice in its place): the messages are edited and posted
until they read exactly its chunks, as if it had been sent whole.

- A rate limit (429) on a post or an edit while streaming: nothing more is tried before
  its retry-after has passed (the text waits); at the end, the remaining wait is slept and
  the retries of gateway.delivery.sender take the next 429s.
- An edit that fails otherwise (the message was deleted, the platform refuses): no more
  edits; at the end the rest of the reply, what that message does not show, is sent as
  new messages.
- A post that fails for good ends the stream: nothing more is posted (a reply never has a
  hole in it); the failure is logged and counted at the end, like any undelivered reply.
- `restart()` (the agent's next model round after tool calls, or a retried request): the
  text so far was not the reply; the messages already posted are edited to the new text.

Decisions where DESIGN.md is silent:
- The first post is made as soon as the filter lets text through; the pace applies to
  what follows, the final edit included (it waits for its turn).
- Nothing is deleted: messages a restart left beyond what the final reply needs, or
  posted before a final round that was silence, stay as they were written.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from enum import Enum
from functools import partial
from typing import Protocol, TypeVar

from gateway.app.connector import Connector, MessageEditor
from gateway.app.errors import DeliveryError, LoopwardenError
from gateway.app.types import Reply
from gateway.delivery.chunking import chunk_text
from gateway.delivery.sender import Delivery
from guards.reasoning import ReasoningFilter

log = logging.getLogger("loopwarden.streaming")

_T = TypeVar("_T")


class StreamFilter(Protocol):
    """Takes a reply piece by piece and returns what may be shown now (guards.silence)."""

    def feed(self, chunk: str) -> str: ...


class StreamingConnector(Connector, MessageEditor, Protocol):
    """A connector that posts and edits messages (`Capabilities.edits`)."""


@dataclass(slots=True)
class _Posted:
    """One message of the stream: its id (None: the platform gave none) and what it shows."""

    message_id: str | None
    text: str


class _Outcome(Enum):
    """How one post or edit went."""

    DONE = "done"
    LATER = "later"  # rate limited: tried again once the retry-after has passed
    FAILED = "failed"


class ReplyStream:
    """One reply to one message, posted once and edited as the agent writes it."""

    def __init__(
        self,
        delivery: Delivery,
        connector: StreamingConnector,
        channel_id: str,
        *,
        thread_id: str | None,
        reply_to: str | None,
    ) -> None:
        self._delivery = delivery
        self._connector = connector
        self._channel_id = channel_id
        self._reply = Reply("", thread_id=thread_id, reply_to=reply_to)
        self._make_filter: Callable[[], StreamFilter] = ReasoningFilter
        self._filter: StreamFilter | None = None
        self._text = ""  # what the filter let through since the last restart
        self._messages: list[_Posted] = []
        self._edit_seconds = 1.0
        self._due = -math.inf  # no update of the room before this time
        self._editable = True
        self._failure: Exception | None = None  # the post that failed for good

    def hold_back(self, make_filter: Callable[[], StreamFilter]) -> None:
        """Pass the reply through `make_filter()` (a fresh one per restart) before showing it."""
        self._make_filter = make_filter

    def begin(self, edit_seconds: float) -> None:
        """The agent streams its reply: update the room at most once per `edit_seconds`."""
        self._edit_seconds = edit_seconds

    def restart(self) -> None:
        """Forget the text written so far: it was not the reply (a tool round, a retry)."""
        self._filter = None
        self._text = ""

    async def write(self, piece: str) -> None:
        """Take the next piece of the reply; post or edit when the filter and the pace allow."""
        if self._filter is None:
            self._filter = self._make_filter()
        shown = self._filter.feed(piece)
        if not shown:
            return
        self._text += shown
        now = self._delivery.clock()
        if now < self._due or not self._editable or self._failure is not None:
            return
        await self._update(self._chunks(self._text), final=False)
        self._due = max(self._due, now + self._edit_seconds)

    async def finish(self, reply: Reply | None) -> bool:
        """Make the room show `reply` (None: nothing more); True when all of it was delivered."""
        if not self._messages and self._failure is None:
            if reply is None:
                return True
            return await self._delivery.deliver(self._connector, self._channel_id, reply)
        platform = self._connector.name
        if reply is None:
            log.info(
                "%s:%s streamed reply ended in silence; %d posted message(s) stay",
                platform,
                self._channel_id,
                len(self._messages),
            )
            return True
        if self._failure is None:
            wait = self._due - self._delivery.clock()
            if wait > 0:
                await self._delivery.sleep(wait)
            await self._update(self._chunks(reply.text), final=True)
        if self._failure is not None:
            where = f"{platform}:{self._channel_id}"
            self._delivery.failed(platform, where, reply, "streamed", self._failure)
            return False
        self._delivery.metrics.reply_out(platform)
        return True

    def _chunks(self, text: str) -> list[str]:
        """`text` cut as an unstreamed reply is (gateway.delivery.chunking)."""
        capabilities = self._connector.capabilities
        return chunk_text(text, capabilities.max_message_length, units=capabilities.length_unit)

    async def _update(self, chunks: list[str], *, final: bool) -> None:
        """Edit and post until the messages read `chunks` (or a failure or 429 stops it)."""
        for index, text in enumerate(chunks):
            if index == len(self._messages):
                outcome = await self._post(text, final=final)
            else:
                message = self._messages[index]
                if message.text == text:
                    continue
                outcome = (
                    await self._edit(message, text, final=final)
                    if self._editable
                    else _Outcome.FAILED
                )
                if outcome is _Outcome.FAILED:
                    self._editable = False
                    if final:
                        await self._send_rest(chunks, index)
                    return
            if outcome is not _Outcome.DONE:
                return

    async def _send_rest(self, chunks: list[str], index: int) -> None:
        """After a failed edit of message `index`: what it does not show, as new messages."""
        shown = self._messages[index].text
        first = chunks[index]
        rest = first[len(shown) :].strip() if first.startswith(shown) else first
        for text in [rest, *chunks[index + 1 :]] if rest else chunks[index + 1 :]:
            if await self._post(text, final=True) is not _Outcome.DONE:
                return

    async def _post(self, text: str, *, final: bool) -> _Outcome:
        """Post one chunk as a new message (only the first replies to the message answered)."""
        first = not self._messages
        part = replace(self._reply, text=text, reply_to=self._reply.reply_to if first else None)
        send = partial(self._connector.send, self._channel_id, part)
        try:
            message_id = await (self._attempt(send) if final else send())
        except DeliveryError as exc:
            if not final and exc.retryable and self._wait(exc):
                return _Outcome.LATER
            self._failure = exc
            return _Outcome.FAILED
        except Exception as exc:  # a connector bug must not escape into the pipeline
            self._failure = exc
            return _Outcome.FAILED
        self._messages.append(_Posted(message_id, text))
        return _Outcome.DONE

    async def _edit(self, message: _Posted, text: str, *, final: bool) -> _Outcome:
        """Make one posted message read `text`."""
        if message.message_id is None:
            return _Outcome.FAILED
        part = replace(self._reply, text=text, reply_to=None)
        edit = partial(self._connector.edit, self._channel_id, message.message_id, part)
        try:
            await (self._attempt(edit) if final else edit())
        except DeliveryError as exc:
            if not final and exc.retryable and self._wait(exc):
                return _Outcome.LATER
            self._edit_failed(exc)
            return _Outcome.FAILED
        except Exception as exc:  # as for a post: contained, and the rest goes in new messages
            self._edit_failed(exc)
            return _Outcome.FAILED
        message.text = text
        return _Outcome.DONE

    async def _attempt(self, call: Callable[[], Awaitable[_T]]) -> _T:
        """`call()` with the delivery's retries (the last post or edit of a reply)."""
        return await self._delivery.attempt(self._connector.name, call)

    def _wait(self, exc: DeliveryError) -> bool:
        """Hold every update until the wait `exc` asks for; False when it is too long."""
        try:
            delay = self._delivery.retry_delay(exc)
        except LoopwardenError:
            return False
        self._due = max(self._due, self._delivery.clock() + delay)
        return True

    def _edit_failed(self, exc: Exception) -> None:
        log.info(
            "%s:%s edit of a streamed reply failed (%s: %s); the rest goes in new messages",
            self._connector.name,
            self._channel_id,
            type(exc).__name__,
            exc,
        )
