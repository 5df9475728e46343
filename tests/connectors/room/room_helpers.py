"""Helpers for the room tests: read websocket events with a bound, join a room."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections.abc import AsyncIterator, Callable

import aiohttp

from gateway.app.runtime import Gateway
from gateway.config import Config
from gateway.demo.room import demo_config

Event = dict[str, object]

WAIT_SECONDS = 10.0
"""A bound on every wait, so a broken test fails instead of hanging; never a pass condition."""


async def next_event(
    ws: aiohttp.ClientWebSocketResponse,
    kind: str,
    where: Callable[[Event], bool] = lambda event: True,
) -> Event:
    """The next event of type `kind` that satisfies `where`, skipping the rest."""
    async with asyncio.timeout(WAIT_SECONDS):
        while True:
            frame = await ws.receive()
            if frame.type is not aiohttp.WSMsgType.TEXT:
                raise AssertionError(f"websocket ended while waiting for {kind}: {frame.type}")
            event = json.loads(frame.data)
            assert isinstance(event, dict)
            if event.get("type") == kind and where(event):
                return event


async def join(ws: aiohttp.ClientWebSocketResponse, name: str, room: str = "lobby") -> Event:
    """Join a room and return its history event."""
    await ws.send_json({"type": "join", "name": name, "room": room})
    await next_event(ws, "joined")
    return await next_event(ws, "history")


async def say(ws: aiohttp.ClientWebSocketResponse, text: str) -> None:
    """Post a message as the joined user."""
    await ws.send_json({"type": "say", "text": text})


def from_sender(name: str, text: str | None = None) -> Callable[[Event], bool]:
    """Matches a message event by sender name (and exact text, when given)."""
    return lambda event: (
        event.get("sender_name") == name and (text is None or event.get("text") == text)
    )


NOW = 1000.0
"""The start of the gateways' time under test: budgets never expire by themselves."""


def ticking(start: float) -> Callable[[], float]:
    """A clock a microsecond later at each reading: frozen in effect, yet no two cooldowns
    of a pair end at the same instant (each has its own notice)."""
    readings = itertools.count()
    return lambda: start + next(readings) * 1e-6


@contextlib.asynccontextmanager
async def demo_gateway(config: Config | None = None) -> AsyncIterator[Gateway]:
    """A started gateway with the demo's bots on a free loopback port, no reply delay."""
    gateway = Gateway(config or demo_config(port=0, delay=0), clock=ticking(NOW))
    await gateway.start()
    try:
        yield gateway
    finally:
        await gateway.stop(5.0)
