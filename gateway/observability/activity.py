"""The Activity feed: what the gateway decides, as it happens, kept in the state backend.

The stages record into an `ActivityFeed` through the decision log (gateway/app/refusals.py):
a message reaching a hosted bot (`in`), a refusal, a shadow verdict (would have refused), a
notice posted or command run; the delivery stage records each reply delivered. Recording
only appends to a bounded buffer in this process; a background task flushes the buffer to
the state store (`StateStore.activity_append`, one transaction or script call per batch)
every `flush_interval` seconds, so the console reads the backend and every replica on one
Redis shows the same feed and counters. Readers wait on `changed` to hear of a flush at once.

Decisions where DESIGN.md is silent:
- A refusal logged at DEBUG (a bot's own message coming back: routine, on every
  platform) is not in the feed, as it is not in the INFO log. Admitted guard verdicts are
  not recorded: the feed lists what changed a turn.
- A message counts as `in` once it has passed dedupe and the self filter: a redelivery
  and a bot's own echo are not new messages. Admin commands are messages in too.
- The excerpt is the message text's first `EXCERPT_CHARS` characters, whitespace folded
  onto one line, `…` when cut; for a reply it is the reply's text, and its sender is the
  hosted bot. A message in names no bot: it is the room's, whichever bot saw it first.
  The console shows it as text; nothing here escapes it. Sender names and details are
  cut at `FIELD_CHARS`.
- The buffer holds at most `max_buffer` events and is flushed early when half full: while
  the backend is slower than the traffic (or down) the oldest are dropped and counted
  (`dropped`), never the gateway slowed. A batch the backend refuses (Redis down) is
  logged and lost.
- Each event is stamped with its own clock reading when recorded, not one per batch: a
  batch's time would put an event recorded just before a minute ends into the next
  minute's bar, and the reading is a small part of the feed's cost (bench/console_bench.py).
- `aclose` flushes what is left, then ends every reader's wait and gives the readers
  (`reading`) up to `reader_grace` seconds to send that last batch and finish, so the live
  streams end before the state store closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator

from gateway.app.errors import StateError
from gateway.app.types import InboundMessage
from gateway.state.activity import ActivityEvent, Kind
from gateway.state.base import ActivityStore

log = logging.getLogger("loopwarden.activity")

EXCERPT_CHARS = 120
FIELD_CHARS = 200

_Pending = tuple[float, Kind, InboundMessage, str, str, str, str]
"""What recording keeps until the flush: at, kind, message, stage, code, detail, text."""


def excerpt(text: str) -> str:
    """The start of `text` on one line: at most EXCERPT_CHARS characters, `…` when cut."""
    if len(text) <= EXCERPT_CHARS and text.isprintable() and "  " not in text:
        return text.strip()  # most messages: short, one line, nothing to fold
    head = text[: EXCERPT_CHARS * 2]
    flat = " ".join(head.split())
    if len(flat) <= EXCERPT_CHARS and len(head) == len(text):
        return flat
    return flat[: EXCERPT_CHARS - 1].rstrip() + "…"


class ActivityFeed:
    """Buffers the gateway's events and flushes them to the state store in batches."""

    def __init__(
        self,
        state: ActivityStore,
        *,
        clock: Callable[[], float] = time.time,
        flush_interval: float = 0.25,
        max_buffer: int = 10_000,
        reader_grace: float = 1.0,
    ) -> None:
        self.state = state
        self.clock = clock
        """Wall time: when events happen, and the charts' now."""
        self._interval = flush_interval
        self._pending: deque[_Pending] = deque(maxlen=max_buffer)
        self._half = max(1, max_buffer // 2)
        self._due = asyncio.Event()
        self._lock = asyncio.Lock()
        self._flushed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._reader_grace = reader_grace
        self._readers = 0
        self._no_readers = asyncio.Event()
        self._no_readers.set()
        self.dropped = 0
        """Events dropped because the buffer was full."""

    @property
    def closed(self) -> bool:
        """True once `aclose` has begun: readers stop."""
        return self._closed

    def message_in(self, message: InboundMessage) -> None:
        """Record a message reaching a hosted bot (counted once per message key)."""
        self._record((self.clock(), "in", message, "", "", "", message.text))

    def reply(self, message: InboundMessage, text: str) -> None:
        """Record a reply delivered in answer to `message`."""
        self._record((self.clock(), "reply", message, "delivery", "sent", "", text))

    def decision(
        self, kind: Kind, message: InboundMessage, stage: str, code: str, detail: str
    ) -> None:
        """Record a refusal, a shadow verdict or a notice about `message`."""
        self._record((self.clock(), kind, message, stage, code, detail, message.text))

    def _record(self, pending: _Pending) -> None:
        """Keep one recording for the next flush; the oldest goes when the buffer is full."""
        buffer = self._pending
        held = len(buffer)
        if held == buffer.maxlen:
            self.dropped += 1
        elif held == self._half:
            self._due.set()
        buffer.append(pending)

    def start(self) -> None:
        """Start flushing in the background (once)."""
        if self._task is None and not self._closed:
            self._task = asyncio.create_task(self._keep_flushing(), name="lw-activity")

    async def _keep_flushing(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._interval):
                    await self._due.wait()
            self._due.clear()
            await self.flush()

    async def flush(self) -> None:
        """Append what was recorded to the state store as one batch, then wake the readers."""
        async with self._lock:
            if not self._pending:
                return
            batch = _events(self._pending)
            self._pending.clear()
            try:
                await self.state.activity_append(batch)
            except StateError as exc:
                log.debug("activity batch of %d event(s) lost: %s", len(batch), exc)
            except Exception as exc:  # a broken backend must not end the flushing
                log.warning(
                    "activity batch of %d event(s) lost: %s: %s",
                    len(batch),
                    type(exc).__name__,
                    exc,
                )
            self._wake()

    def _wake(self) -> None:
        flushed, self._flushed = self._flushed, asyncio.Event()
        flushed.set()

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        """Mark a reader (a live stream) that `aclose` waits for, briefly."""
        self._readers += 1
        self._no_readers.clear()
        try:
            yield
        finally:
            self._readers -= 1
            if not self._readers:
                self._no_readers.set()

    async def changed(self) -> None:
        """Wait for the next flush, or for `aclose` (at once when closed already)."""
        if not self._closed:
            await self._flushed.wait()

    async def aclose(self) -> None:
        """Stop flushing, flush what is left, and end every reader's wait."""
        self._closed = True
        task, self._task = self._task, None
        if task is not None:
            async with self._lock:  # a batch being appended is appended, not cancelled
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.flush()
        self._wake()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._reader_grace):
                await self._no_readers.wait()


def _events(recorded: Iterable[_Pending]) -> list[ActivityEvent]:
    """The feed events of the recordings (excerpts are made here, off the hot path)."""
    make = ActivityEvent._make  # a NamedTuple's own constructor takes twice as long
    events: list[ActivityEvent] = []
    last: InboundMessage | None = None
    room = key = human = said = cut = ""
    for at, kind, message, stage, code, detail, text in recorded:
        if message is not last:  # a message's events are mostly recorded one after another
            last, room, key = message, message.room, message.message_key
            human = (message.sender_name or message.sender_id)[:FIELD_CHARS]
        if text is not said:
            said, cut = text, excerpt(text)
        # A message in is the room's, not one hosted bot's; a reply is the bot's own words.
        if kind == "in":
            bot, sender = "", human
        elif kind == "reply":
            bot = message.bot_id
            sender = bot[:FIELD_CHARS]
        else:
            bot, sender = message.bot_id, human
        events.append(
            make((0, at, room, bot, sender, kind, stage, code, detail[:FIELD_CHARS], cut, key))
        )
    return events
