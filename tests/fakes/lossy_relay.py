"""A TCP relay on loopback that can lose answers: a command reaches the server and runs,
its answer never reaches the client.

Between a client and a real server (redis-server here): bytes pass both ways unchanged
until `lose_answers_to(marker)`; from then on, a chunk the client sends that holds
`marker` is forwarded, the server's answer to it is read and thrown away and the client's
connection is closed, as when a network drops between a write and its acknowledgement.
The client sees a dropped connection and cannot tell whether its command ran. `deliver()`
lets answers through again (`times` does so by itself after that many commands);
`lost` counts the answers thrown away. With `run=False` such a command is not forwarded
at all (the connection drops before it reaches the server): the client cannot tell
that case from the other.
"""

from __future__ import annotations

import asyncio
import contextlib

from tests.fakes.redis_server import HOST

_CHUNK = 65_536


class LossyRelay:
    """One listening relay to `HOST:target`; every client gets its own server connection."""

    def __init__(self, target: int) -> None:
        self._target = target
        self._marker: bytes | None = None
        self._times: int | None = None
        self._run = True
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.lost = 0

    @property
    def port(self) -> int:
        assert self._server is not None
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    @property
    def url(self) -> str:
        """A redis:// URL of the server, through the relay."""
        return f"redis://{HOST}:{self.port}/0"

    def lose_answers_to(self, marker: bytes, times: int | None = None, *, run: bool = True) -> None:
        """Throw away the answers to the commands that hold `marker`, closing their client:
        every such command until `deliver`, or only the next `times` of them; with `run`
        False the commands themselves are thrown away (counted in `lost` too)."""
        self._marker = marker
        self._times = times
        self._run = run

    def deliver(self) -> None:
        """Let every answer through again."""
        self._marker = None
        self._times = None
        self._run = True

    async def __aenter__(self) -> LossyRelay:
        self._server = await asyncio.start_server(self._serve, HOST, 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(HOST, self._target)
        except OSError:
            writer.close()
            self._tasks.discard(task)
            return
        losing = asyncio.Event()  # the command just sent holds the marker

        async def up() -> None:
            while data := await reader.read(_CHUNK):
                if self._marker is not None and self._marker in data:
                    losing.set()
                    run = self._run
                    if self._times is not None:
                        self._times -= 1
                        if not self._times:
                            self.deliver()
                    if not run:
                        self.lost += 1
                        return
                upstream_writer.write(data)
                await upstream_writer.drain()

        async def down() -> None:
            while data := await upstream_reader.read(_CHUNK):
                if losing.is_set():
                    self.lost += 1
                    return
                writer.write(data)
                await writer.drain()

        pumps = [asyncio.create_task(up()), asyncio.create_task(down())]
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pump in pumps:
                pump.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            for side in (writer, upstream_writer):
                side.close()
                with contextlib.suppress(OSError):
                    await side.wait_closed()
            self._tasks.discard(task)
