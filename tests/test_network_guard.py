"""The suite's own guard: no test can reach beyond loopback (issue 10)."""

from __future__ import annotations

import asyncio
import socket

import pytest
from aiohttp import ClientSession, web

from tests.fakes.loopback import serve_loopback
from tests.network_guard import NetworkForbidden


@pytest.mark.parametrize("host", ["192.0.2.1", "10.0.0.1", "2001:db8::1"])
def test_issue10_a_connection_beyond_loopback_is_refused_at_once(host: str) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as sock, pytest.raises(NetworkForbidden, match=host):
        sock.connect((host, 9))


async def test_issue10_asyncio_clients_are_held_to_loopback_too() -> None:
    with pytest.raises(NetworkForbidden):
        await asyncio.open_connection("192.0.2.1", 9)


async def test_loopback_stays_open() -> None:
    async def here(_request: web.Request) -> web.Response:
        return web.Response(text="here")

    app = web.Application()
    app.router.add_get("/", here)
    runner = web.AppRunner(app)
    port = await serve_loopback(runner)
    try:
        async with ClientSession() as client, client.get(f"http://localhost:{port}/") as answer:
            assert await answer.text() == "here"
    finally:
        await runner.cleanup()
