"""Who may reach the room: Host and Origin checks on a real server, through the gateway too."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from connectors.room.access import HOST_REFUSED, ORIGIN_REFUSED, name_key
from connectors.room.hub import RoomHub
from gateway.app.runtime import Gateway
from gateway.demo.room import demo_config
from tests.connectors.room.room_helpers import NOW, join

Client = TestClient[web.Request, web.Application]


@contextlib.asynccontextmanager
async def served(app: web.Application) -> AsyncIterator[Client]:
    """The app on a free loopback port, with a client for it."""
    async with TestClient(TestServer(app)) as client:
        yield client


def _hub_app(http_host: str = "127.0.0.1") -> web.Application:
    app = web.Application()
    RoomHub.for_app(app, http_host=http_host)
    return app


async def _history_status(client: Client, headers: dict[str, str]) -> tuple[int, str]:
    async with client.get("/room/history", headers=headers) as response:
        return response.status, await response.text()


async def _ws_status(client: Client, headers: dict[str, str]) -> int:
    try:
        async with client.ws_connect("/room/ws", headers=headers) as ws:
            await join(ws, "alice")
    except aiohttp.WSServerHandshakeError as refused:
        return refused.status
    return 101


REBOUND = [
    {"Host": "evil.example"},
    {"Host": "evil.example:8787", "Origin": "http://evil.example:8787"},
    {"Host": "localhost.evil.example"},
    {"Host": "127.0.0.1.evil.example"},
    {"Host": "evil@127.0.0.1"},
    {"Host": "[::1"},
    {"Host": "::1"},
    {"Host": "0.0.0.0"},
    {"Host": ""},
]


@pytest.mark.parametrize("headers", REBOUND)
async def test_issue9_a_rebound_host_is_refused_on_ws_and_history(headers: dict[str, str]) -> None:
    async with served(_hub_app()) as client:
        assert await _ws_status(client, headers) == 403
        assert await _history_status(client, headers) == (403, HOST_REFUSED)
        # The refusal costs the server nothing: the next request is served.
        assert (await _history_status(client, {}))[0] == 200


@pytest.mark.parametrize(
    "host", ["127.0.0.1", "127.8.9.10", "localhost", "LOCALHOST", "[::1]", "[0:0:0:0:0:0:0:1]"]
)
async def test_issue9_loopback_hosts_are_let_in(host: str) -> None:
    async with served(_hub_app()) as client:
        for value in (host, f"{host}:{client.port}"):
            origin = f"http://{value}"
            assert await _ws_status(client, {"Host": value}) == 101
            assert await _ws_status(client, {"Host": value, "Origin": origin}) == 101
            assert (await _history_status(client, {"Host": value, "Origin": origin}))[0] == 200


@pytest.mark.parametrize(
    "origin", ["http://evil.example", "null", "http://localhost:1", "http://[::1", "garbage"]
)
async def test_issue9_a_foreign_origin_is_refused_on_ws_and_history(origin: str) -> None:
    async with served(_hub_app()) as client:
        headers = {"Host": f"localhost:{client.port}", "Origin": origin}
        assert await _ws_status(client, headers) == 403
        assert await _history_status(client, headers) == (403, ORIGIN_REFUSED)


async def test_issue9_the_configured_http_host_is_let_in_and_a_wildcard_is_not() -> None:
    async with served(_hub_app("chat.lan")) as client:
        headers = {"Host": f"chat.lan:{client.port}", "Origin": f"http://chat.lan:{client.port}"}
        assert await _ws_status(client, headers) == 101
        assert await _ws_status(client, {"Host": "other.lan"}) == 403
    async with served(_hub_app("0.0.0.0")) as client:
        assert await _ws_status(client, {"Host": f"0.0.0.0:{client.port}"}) == 403
        assert await _ws_status(client, {"Host": f"127.0.0.1:{client.port}"}) == 101


async def test_issue9_the_gateway_hands_http_host_to_the_room() -> None:
    # Not started (chat.lan does not resolve here): its app is served on loopback instead.
    gateway = Gateway(demo_config(host="chat.lan", port=0, delay=0), clock=lambda: NOW)
    async with served(gateway.app) as client:
        assert (await _history_status(client, {"Host": "chat.lan"}))[0] == 200
        assert await _history_status(client, {"Host": "evil.example"}) == (403, HOST_REFUSED)


@pytest.mark.parametrize(
    ("name", "other"),
    [
        ("ping", "PING"),
        ("ping", "p\u0456ng"),
        ("ping", "pi\u200bng"),
        ("ping", "\uff50\uff49\uff4e\uff47"),
        ("Ping Bot", "pingbot"),
        ("alice", "\u0430lice"),
    ],
)
def test_issue9_look_alike_names_share_a_key(name: str, other: str) -> None:
    assert name_key(name) == name_key(other)


def test_issue9_different_names_keep_different_keys() -> None:
    assert len({name_key(n) for n in ("ping", "pong", "ping-bot", "ping.2", "p1ng")}) == 5
