"""RoomClient: one websocket connection to the room, its outbound queue bounded in bytes.

Decisions where DESIGN.md is silent:
- Frames are JSON with ASCII escapes (`json.dumps`' default), so a frame's length is its
  size in bytes. Frames not yet handed to the socket may hold at most `QUEUE_BYTES`.
- A client whose next frame would pass that bound is not reading (or reads too slowly to
  keep up): it is dropped, its queue discarded and its connection reset. A close frame
  would wait behind the very bytes it does not read, and a polite close would keep the
  queue alive for the close timeout.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque

from aiohttp import web

log = logging.getLogger("loopwarden.room")

QUEUE_BYTES = 1024 * 1024
FINISH_SECONDS = 5.0


class RoomClient:
    """One websocket connection with its own ordered outbound queue and writer task."""

    def __init__(
        self, ws: web.WebSocketResponse, transport: asyncio.Transport | None, address: str
    ) -> None:
        self.ws = ws
        self.address = address
        self.name: str | None = None
        self.room: str | None = None
        self.joins = 0
        self._transport = transport
        self._frames: deque[str] = deque()
        self._queued_bytes = 0
        self._wakeup = asyncio.Event()
        self._finishing = False
        self._dropped = False
        self._writer = asyncio.create_task(self._write())

    @property
    def queued_bytes(self) -> int:
        """Bytes queued for this client and not yet handed to its socket."""
        return self._queued_bytes

    @property
    def dropped(self) -> bool:
        """True once the client was disconnected for not reading."""
        return self._dropped

    def push(self, frame: str) -> None:
        """Queue one frame; a client that would pass `QUEUE_BYTES` is dropped instead."""
        if self._dropped or self._finishing:
            return
        if self._queued_bytes + len(frame) > QUEUE_BYTES:
            self._drop()
            return
        self._frames.append(frame)
        self._queued_bytes += len(frame)
        self._wakeup.set()

    def push_event(self, event: dict[str, object]) -> None:
        """Queue one JSON event."""
        self.push(json.dumps(event))

    def _drop(self) -> None:
        log.warning(
            "room client %s stopped reading (%d bytes unsent); disconnecting it",
            self.name or "?",
            self._queued_bytes,
        )
        self._dropped = True
        self._frames.clear()
        self._queued_bytes = 0
        self._writer.cancel()
        if self._transport is not None:
            self._transport.abort()

    async def _write(self) -> None:
        while True:
            while not self._frames:
                if self._finishing:
                    return
                self._wakeup.clear()
                await self._wakeup.wait()
            frame = self._frames[0]
            try:
                await self.ws.send_str(frame)
            except ConnectionError:
                return
            self._frames.popleft()
            self._queued_bytes -= len(frame)

    async def finish(self) -> None:
        """Stop the writer once what is queued has been sent (bounded: the peer may be gone)."""
        self._finishing = True
        self._wakeup.set()
        await asyncio.wait({self._writer}, timeout=FINISH_SECONDS)
        self._writer.cancel()
