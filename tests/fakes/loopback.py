"""Serving a fake's aiohttp app on loopback, shared so every fake binds the same way."""

from __future__ import annotations

from aiohttp import web

LOOPBACK_HOST = "127.0.0.1"


async def serve_loopback(runner: web.AppRunner, port: int = 0) -> int:
    """Set up `runner`, serve it on 127.0.0.1 and return the bound port (0 picks a free one)."""
    await runner.setup()
    await web.TCPSite(runner, LOOPBACK_HOST, port).start()
    return int(runner.addresses[0][1])
