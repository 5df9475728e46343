"""The Connector protocol: what the gateway needs from a platform, and nothing more."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from aiohttp import web

from gateway.chunking import LengthUnit
from gateway.types import InboundMessage, Reply

Sink = Callable[[InboundMessage], Awaitable[object]]
"""Where a connector hands each inbound message: the pipeline's entry point."""


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a platform allows: message length limit, threads, and bot detection."""

    max_message_length: int
    threads: bool = True
    knows_bots: bool = True
    typing: bool = False
    ephemeral: bool = False
    length_unit: LengthUnit = "chars"


class Connector(Protocol):
    """A running connection of one hosted bot to one platform.

    `start(sink)` connects and begins handing inbound messages to `sink`; it returns once
    the connection is up (connectors keep their own background tasks). `send` posts one
    chunk (already within `capabilities.max_message_length`) and raises
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


@dataclass(frozen=True, slots=True)
class ConnectorServices:
    """What the runtime lends a connector when it is created.

    `http` is the gateway's aiohttp application, not yet started: a connector that receives
    webhooks (Slack Events API, Telegram webhook) adds its routes in its factory.
    `peers` lets connectors of one platform in one process see each other (Telegram does not
    deliver one bot's messages to another bot, so hosted bots feed each other).
    `http_host` is the address that server binds (`http.host`): the web room accepts it as
    a Host besides loopback.
    """

    http: web.Application
    peers: dict[str, list[Connector]]
    http_host: str = "127.0.0.1"
