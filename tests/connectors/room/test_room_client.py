"""A room client's outbound queue: bounded in bytes, and a client that doesn't read is dropped."""

from __future__ import annotations

import asyncio
import json

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from connectors.room.client import QUEUE_BYTES
from connectors.room.hub import JOIN_HISTORY, JOIN_HISTORY_BYTES, MAX_TEXT, RoomHub
from tests.connectors.room.room_helpers import WAIT_SECONDS, join, next_event, say

# Each "é" is escaped to six bytes on the wire: one message is about 24 KB.
BULKY = "é" * MAX_TEXT
MAX_POSTS = 10_000
"""A bound on the flood (about 240 MB sent), so a broken test fails instead of running on."""


async def _read_texts(ws: aiohttp.ClientWebSocketResponse, texts: asyncio.Queue[str]) -> None:
    """Keep reading, as a browser does, and pass on the text of every message and notice."""
    async for frame in ws:
        event = json.loads(frame.data)
        if event["type"] in {"message", "notice"}:
            texts.put_nowait(event["text"])


async def test_issue9_a_client_that_does_not_read_is_dropped_and_its_queue_stays_bounded() -> None:
    app = web.Application()
    hub = RoomHub.for_app(app)
    async with (
        TestClient(TestServer(app)) as http,
        http.ws_connect("/room/ws") as idle,
        http.ws_connect("/room/ws") as reader,
    ):
        await join(idle, "idle")
        await join(reader, "reader")
        texts: asyncio.Queue[str] = asyncio.Queue()
        reading = asyncio.create_task(_read_texts(reader, texts))
        [stuck] = [client for client in hub.clients if client.name == "idle"]
        # `idle` is never read from again: aiohttp stops reading its socket once its own
        # buffer is full, then the kernel's buffers fill, and the server's queue grows.
        most = 0
        for _ in range(MAX_POSTS):
            hub.say("lobby", "carol", BULKY)
            most = max(most, stuck.queued_bytes)
            if stuck.dropped:
                break
            # The reader gets each message before the next is posted, however slow the host.
            async with asyncio.timeout(WAIT_SECONDS):
                while await texts.get() != BULKY:  # skip the join notice
                    pass
        assert stuck.dropped, f"still connected after {MAX_POSTS} posts"
        assert most <= QUEUE_BYTES
        assert stuck.queued_bytes == 0
        # The dropped client's connection is reset and it leaves; the reader stays.
        async with asyncio.timeout(WAIT_SECONDS):
            while await texts.get() != "idle left":
                pass
        assert {client.name for client in hub.clients} == {"reader"}
        await say(reader, "still here")
        async with asyncio.timeout(WAIT_SECONDS):
            while await texts.get() != "still here":
                pass
        reading.cancel()
        async with asyncio.timeout(WAIT_SECONDS):
            async for _ in idle:  # what reached its socket before the reset, then the end
                pass
        assert idle.closed


async def test_issue9_the_history_a_joiner_gets_is_bounded_in_bytes() -> None:
    app = web.Application()
    hub = RoomHub.for_app(app)
    for n in range(JOIN_HISTORY):
        hub.say("lobby", "carol", f"{n} {BULKY}")
    async with TestClient(TestServer(app)) as http, http.ws_connect("/room/ws") as ws:
        await ws.send_json({"type": "join", "name": "alice"})
        await next_event(ws, "joined")
        frame = await ws.receive_str()
    assert len(frame) <= JOIN_HISTORY_BYTES + 1000
    messages = json.loads(frame)["messages"]
    assert 0 < len(messages) < JOIN_HISTORY
    assert messages[-1]["text"].startswith(f"{JOIN_HISTORY - 1} ")
    assert [m["id"] for m in messages] == list(range(messages[0]["id"], JOIN_HISTORY + 1))
