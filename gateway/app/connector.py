"""The Connector protocol: what the gateway needs from a platform, and nothing more."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from aiohttp import web

from gateway.app.types import InboundMessage, Reply
from gateway.delivery.chunking import LengthUnit
from gateway.observability.metrics import Metrics
from gateway.state.base import CursorStore

Sink = Callable[[InboundMessage], Awaitable[object]]
"""Where a connector hands each inbound message: the pipeline's entry point."""


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a platform allows: message length limit, threads, and bot detection.

    `command_prefix` is how the gateway's notices write the admin command there (`/loop`;
    Slack's messages cannot start with `/`, so `!loop`): the stages know no platform names.
    `edits` says the connector is a `MessageEditor` too: a streamed reply is posted once
    and edited as it grows (gateway.delivery.streaming); without it a reply is sent whole.
    """

    max_message_length: int
    threads: bool = True
    knows_bots: bool = True
    typing: bool = False
    ephemeral: bool = False
    length_unit: LengthUnit = "chars"
    command_prefix: str = "/loop"
    edits: bool = False


class Connector(Protocol):
    """A running connection of one hosted bot to one platform.

    `start(sink)` connects and begins handing inbound messages to `sink`; it returns once
    the connection is up (connectors keep their own background tasks). `send` posts one
    chunk (already within `capabilities.max_message_length`), returns the posted
    message's id (None when the platform gave none) and raises
    `DeliveryError(retryable=True, retry_after=…)` on a rate limit. `connected` feeds
    `/readyz`. `typing(channel_id)` shows the platform's typing indicator, if any.
    """

    name: str
    bot_id: str
    capabilities: Capabilities

    @property
    def connected(self) -> bool: ...

    @property
    def bot_user_id(self) -> str: ...

    async def start(self, sink: Sink) -> None: ...

    async def send(self, channel_id: str, reply: Reply) -> str | None: ...

    async def typing(self, channel_id: str, thread_id: str | None) -> None: ...

    async def aclose(self) -> None: ...


@runtime_checkable
class MessageEditor(Protocol):
    """A connector that can change the text of a message it posted (`Capabilities.edits`).

    `edit(channel_id, message_id, reply)` makes the message `send` returned `message_id`
    for (sent with the same `reply.thread_id`) read `reply.text`, within the platform
    limit; it raises like `send` (`DeliveryError(retryable=True, retry_after=…)` on a rate
    limit, a non-retryable one when the message cannot be edited).
    """

    async def edit(self, channel_id: str, message_id: str, reply: Reply) -> None: ...


class Peer(Protocol):
    """A connector that takes what the other hosted bots of its platform posted."""

    def receive_peer(self, event: object) -> None: ...


class PeerBus:
    """Hosted bots of one platform in one process offering each other what they posted.

    Telegram never delivers one bot's messages to another bot, so each Telegram connector
    subscribes while it runs and publishes every message it posts into a group; the others
    take it as a message from a bot. `publish` hands the event to every other subscriber of
    that platform, in the order they subscribed; a peer checks the event's type itself.
    """

    def __init__(self) -> None:
        self._subscribers: dict[str, list[Peer]] = {}

    def subscribe(self, platform: str, peer: Peer) -> None:
        """Let `peer` receive what the other connectors of `platform` publish (once)."""
        peers = self._subscribers.setdefault(platform, [])
        if peer not in peers:
            peers.append(peer)

    def unsubscribe(self, platform: str, peer: Peer) -> None:
        """Stop offering `peer` anything (a no-op when it was not subscribed)."""
        peers = self._subscribers.get(platform, [])
        if peer in peers:
            peers.remove(peer)

    def publish(self, platform: str, sender: Peer, event: object) -> int:
        """Offer `event` to every subscriber of `platform` but `sender`; how many were offered."""
        offered = 0
        for peer in tuple(self._subscribers.get(platform, ())):
            if peer is not sender:
                peer.receive_peer(event)
                offered += 1
        return offered

    def subscribers(self, platform: str) -> tuple[Peer, ...]:
        """The connectors of `platform` subscribed now, in subscription order."""
        return tuple(self._subscribers.get(platform, ()))


@dataclass(frozen=True, slots=True)
class ConnectorServices:
    """What the runtime lends a connector when it is created.

    `http` is the gateway's aiohttp application, not yet started: a connector that receives
    webhooks (Slack Events API, Telegram webhook) adds its routes in its factory.
    `peers` lets connectors of one platform in one process feed each other (Telegram).
    `metrics` is where connectors count the events they drop (`events_dropped_total`).
    `http_host` is the address that server binds (`http.host`): the web room accepts it as
    a Host besides loopback. `forget_room` empties the gateway's memory (the transcript) of
    a room, given its room key (`room:lobby`): the web room calls it for a room it reclaims.
    `cursors` is the state backend's place for where a connector resumes reading (Matrix
    keeps its sync token there); None keeps it in the connector's memory only.
    """

    http: web.Application
    peers: PeerBus = field(default_factory=PeerBus)
    metrics: Metrics = field(default_factory=Metrics)
    http_host: str = "127.0.0.1"
    forget_room: Callable[[str], Awaitable[object]] | None = None
    cursors: CursorStore | None = None
