"""RoomConnector: one hosted bot seated in the local web room, and its pure translation.

Decisions where DESIGN.md is silent:
- A message mentions a bot when it contains `@<bot id>` or `@<display name>` as a whole
  word, case-insensitively (`@ping` matches "@Ping," but not "@pingpong" or "@ping-bot").
- Each bot handles the room's messages one at a time, in room order, from a bounded queue
  (`INBOX_LIMIT`); a message that finds the queue full is dropped with a warning rather
  than letting a flood grow memory without bound.
- The bot counts the messages it queued and handled, so the hub can forget a reclaimed
  room once the bot has handled what it held (`after_handled`); a closed bot holds none.
- `Reply.ephemeral_to` is not supported: refusals and acks are posted to the whole room,
  where the demo's watcher can see them.
- A `Reply.system` (the answer to a `/loop` command) is posted by the room's system
  sender, `loopwarden` (`RoomHub.post_system`), not by this bot: the room is the one
  platform where the gateway may speak as someone other than a hosted bot.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from connectors.room.hub import RoomHub, RoomMessage
from gateway.app.connector import Capabilities, Sink
from gateway.app.errors import DeliveryError, GatewayStopping
from gateway.app.types import InboundMessage, Reply
from gateway.config import RoomBotConfig

log = logging.getLogger("loopwarden.room")

PLATFORM = "room"
RUN = f"{time.time_ns() // 1_000_000:x}"
"""This process's run prefix for message ids (its start time in milliseconds, hex)."""
MAX_MESSAGE_LENGTH = 4000
INBOX_LIMIT = 1000


@dataclass(frozen=True, slots=True)
class RoomIdentity:
    """Who a hosted bot is in the room: config id, user id and the name people mention."""

    bot_id: str
    user_id: str
    display_name: str

    def mentioned_in(self, text: str) -> bool:
        """True when the text holds `@<user id>` or `@<display name>` as a whole word."""
        names = "|".join(re.escape(n) for n in {self.user_id, self.display_name})
        return re.search(rf"(?<![\w@])@(?:{names})(?![\w-])", text, re.IGNORECASE) is not None


def platform_message_id(message: RoomMessage) -> str:
    """The message's id as the gateway sees it: `<run>.<id>`.

    The hub numbers messages from 1 in every process; the run prefix (this process's start
    time) keeps a restarted gateway with persistent state (sqlite, redis) from taking its
    first messages for duplicates of the previous run's, which receipts still remember.
    """
    return f"{RUN}.{message.id}"


def to_inbound(message: RoomMessage, me: RoomIdentity) -> InboundMessage | None:
    """Translate a room message for one hosted bot; None for the bot's own messages."""
    if message.sender_id == me.user_id:
        return None
    return InboundMessage(
        platform=PLATFORM,
        bot_id=me.bot_id,
        channel_id=message.room,
        thread_id=None,
        message_id=platform_message_id(message),
        sender_id=message.sender_id,
        sender_name=message.sender_name,
        sender_is_bot=message.is_bot,
        text=message.text,
        mentions_bot=me.mentioned_in(message.text),
        reply_to_bot=False,
        is_direct=False,
        received_at=message.ts,
        raw=message,
        bot_user_id=me.user_id,
    )


class RoomConnector:
    """A hosted bot in the room: posts replies into the hub and hands it what others say."""

    name = PLATFORM
    capabilities = Capabilities(
        max_message_length=MAX_MESSAGE_LENGTH, threads=False, knows_bots=True, typing=True
    )

    def __init__(self, bot: RoomBotConfig, hub: RoomHub) -> None:
        self.bot_id = bot.id
        self.identity = RoomIdentity(bot_id=bot.id, user_id=bot.id, display_name=bot.name or bot.id)
        self._hub = hub
        self._inbox: asyncio.Queue[InboundMessage] = asyncio.Queue(maxsize=INBOX_LIMIT)
        self._worker: asyncio.Task[None] | None = None
        self._closed = False
        self._queued = 0
        self._handled = 0
        # (messages queued when asked, callback), in the order asked.
        self._waiters: deque[tuple[int, Callable[[], None]]] = deque()
        hub.attach(self)

    @property
    def user_id(self) -> str:
        """The bot's user id in the room (its config id)."""
        return self.identity.user_id

    @property
    def bot_user_id(self) -> str:
        """The platform user id the self filter and the pair key go by."""
        return self.identity.user_id

    @property
    def display_name(self) -> str:
        """The name shown in the room and accepted in mentions."""
        return self.identity.display_name

    @property
    def connected(self) -> bool:
        """True from `start` until `aclose`."""
        return self._worker is not None and not self._closed

    async def start(self, sink: Sink) -> None:
        """Begin handing the room's messages to `sink`, one at a time, in order."""
        if self._closed:
            raise DeliveryError("room connector is closed")
        self._worker = asyncio.create_task(self._drain_inbox(sink), name=f"room:{self.bot_id}")

    def deliver(self, message: RoomMessage) -> None:
        """Queue a message someone else posted (called by the hub, never blocks)."""
        if not self.connected:
            return
        inbound = to_inbound(message, self.identity)
        if inbound is None:
            return
        try:
            self._inbox.put_nowait(inbound)
        except asyncio.QueueFull:
            log.warning("room bot %s is %d messages behind; dropped one", self.bot_id, INBOX_LIMIT)
            return
        self._queued += 1

    def after_handled(self, done: Callable[[], None]) -> None:
        """Call `done` once every message queued so far is handled (at once when none is)."""
        if self._closed or self._handled == self._queued:
            done()
        else:
            self._waiters.append((self._queued, done))

    async def _drain_inbox(self, sink: Sink) -> None:
        while True:
            inbound = await self._inbox.get()
            try:
                await sink(inbound)
            except GatewayStopping:
                return
            except Exception:  # the pipeline logs its own errors; this keeps the bot alive
                log.exception(
                    "room bot %s: handling message %s failed", self.bot_id, inbound.message_id
                )
            finally:
                self._handled += 1
                self._wake(self._handled)

    def _wake(self, handled: int) -> None:
        """Call back whoever waited for `handled` messages or fewer, in order."""
        while self._waiters and self._waiters[0][0] <= handled:
            self._waiters.popleft()[1]()

    async def send(self, channel_id: str, reply: Reply) -> str | None:
        """Post a reply into the room; returns its message id."""
        if self._closed:
            raise DeliveryError("room connector is closed")
        if reply.system:
            return platform_message_id(self._hub.post_system(channel_id, reply.text))
        message = self._hub.post(
            channel_id,
            sender_id=self.user_id,
            sender_name=self.display_name,
            is_bot=True,
            text=reply.text,
        )
        return platform_message_id(message)

    async def typing(self, channel_id: str, thread_id: str | None) -> None:
        """Show "<bot> is typing…" to the room's clients."""
        self._hub.typing(channel_id, self.user_id, self.display_name)

    async def aclose(self) -> None:
        """Leave the room and stop handling messages."""
        self._closed = True
        self._hub.detach(self)
        if self._worker is not None:
            self._worker.cancel()
            await asyncio.wait({self._worker})
        self._wake(self._queued)  # nothing more will be handled
