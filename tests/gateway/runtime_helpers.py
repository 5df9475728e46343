"""A scriptable in-memory connector and configs for the runtime, HTTP and CLI tests."""

from __future__ import annotations

import asyncio
import itertools
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import pytest

from gateway.app.connector import Capabilities, ConnectorServices, Sink
from gateway.app.errors import ConnectorError
from gateway.app.runtime import Gateway
from gateway.app.types import InboundMessage, Reply
from gateway.config import BotConfig, Config, parse_config

CONFIG = """
http: {host: 127.0.0.1, port: 0, admin_token: '${ADMIN:-}'}
agents: {parrot: {kind: scripted, default: 'echo: {text}'}}
bots:
  - {id: bot-a, platform: room, agent: parrot}
admins: {room: [alice]}
"""

_ids = itertools.count(1)


def make_config(admin_token: str = "", text: str = CONFIG) -> Config:
    """The test config, with an admin token when given."""
    return parse_config(text, env={"ADMIN": admin_token})


def human(text: str, *, bot_id: str = "bot-a", channel: str = "lobby") -> InboundMessage:
    """A fresh human message to a hosted bot."""
    return InboundMessage(
        platform="room",
        bot_id=bot_id,
        channel_id=channel,
        thread_id=None,
        message_id=str(next(_ids)),
        sender_id="u-human",
        sender_name="Human",
        sender_is_bot=False,
        text=text,
        mentions_bot=True,
        bot_user_id=bot_id,
    )


@dataclass
class FakeConnector:
    """A connector driven by the test: failing or stalling starts, blocking sends."""

    bot_id: str
    name: str = "room"
    capabilities: Capabilities = Capabilities(max_message_length=2000)
    failures_left: int = 0
    hold_start: asyncio.Event | None = None
    hold_send: asyncio.Event | None = None
    sink: Sink | None = None
    is_connected: bool = False
    closed: bool = False
    start_calls: int = 0
    sent: list[tuple[str, Reply]] = field(default_factory=list)
    start_called: asyncio.Event = field(default_factory=asyncio.Event)
    up: asyncio.Event = field(default_factory=asyncio.Event)
    sending: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def connected(self) -> bool:
        """What /readyz reports."""
        return self.is_connected

    @property
    def bot_user_id(self) -> str:
        """The platform id: the config id."""
        return self.bot_id

    async def start(self, sink: Sink) -> None:
        """Fail `failures_left` times, wait for `hold_start` if set, then connect."""
        self.start_calls += 1
        self.start_called.set()
        if self.failures_left:
            self.failures_left -= 1
            raise ConnectorError(self.name, "platform unreachable")
        if self.hold_start is not None:
            await self.hold_start.wait()
        self.sink = sink
        self.is_connected = True
        self.up.set()

    async def send(self, channel_id: str, reply: Reply) -> str | None:
        """Record the reply (after `hold_send`, when set)."""
        self.sending.set()
        if self.hold_send is not None:
            await self.hold_send.wait()
        self.sent.append((channel_id, reply))
        return str(len(self.sent))

    async def typing(self, channel_id: str, thread_id: str | None) -> None:
        """No indicator."""

    async def aclose(self) -> None:
        """Disconnect."""
        self.closed = True
        self.is_connected = False

    async def push(self, message: InboundMessage) -> object:
        """Hand a message to the gateway as the platform would."""
        assert self.sink is not None, "connector not started"
        return await self.sink(message)


@dataclass
class FakePlatform:
    """A connector factory that remembers the connectors it made and how to make them."""

    failures: int = 0
    hold_start: asyncio.Event | None = None
    hold_send: asyncio.Event | None = None
    made: dict[str, FakeConnector] = field(default_factory=dict)

    def __call__(self, bot: BotConfig, services: ConnectorServices) -> FakeConnector:
        connector = FakeConnector(
            bot.id,
            failures_left=self.failures,
            hold_start=self.hold_start,
            hold_send=self.hold_send,
        )
        self.made[bot.id] = connector
        return connector


def gateway_for(config: Config, platform: FakePlatform) -> Gateway:
    """A Gateway on the fake platform with fast retries and a short connect timeout."""
    return Gateway(
        config, connector_factory=platform, connect_timeout=5.0, start_backoff=(0.01, 0.05)
    )


def shadow_package(
    parent: ModuleType, name: str, body: str, tmp_path: Path, mp: pytest.MonkeyPatch
) -> None:
    """Make `parent.name` resolve to a stand-in module with `body` (for this test only)."""
    stand_in = tmp_path / "shadow"
    stand_in.mkdir(exist_ok=True)
    (stand_in / f"{name}.py").write_text(body, encoding="utf-8")
    mp.setattr(parent, "__path__", [str(stand_in), *parent.__path__])
    full = f"{parent.__name__}.{name}"
    # Set, then delete: monkeypatch then also removes what the import leaves behind.
    for module in {full, *(m for m in sys.modules if m.startswith(f"{full}."))}:
        mp.setitem(sys.modules, module, None)
        mp.delitem(sys.modules, module)
    mp.setattr(parent, name, None, raising=False)
    mp.delattr(parent, name)
