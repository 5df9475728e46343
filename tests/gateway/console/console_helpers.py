"""A started gateway with a console, a manual clock, and a browser-like client without a jar."""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import aiohttp
from yarl import URL

from gateway.admin.access import SESSION_COOKIE
from gateway.app.runtime import Gateway
from gateway.config import parse_config
from tests.gateway.runtime_helpers import FakePlatform

TOKEN = "adm-console-0123456789"
ROOM = "room:lobby"


class Clock:
    """A clock the test moves: the sessions, the limiter and the state read it."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def config_text(http: str = "") -> str:
    """The test gateway's config; `http` adds fields to `http:`."""
    return f"""
http: {{host: 127.0.0.1, port: 0, admin_token: '${{ADMIN:-}}'{http}}}
agents: {{parrot: {{kind: scripted, default: 'echo: {{text}}'}}}}
bots:
  - {{id: bot-a, platform: room, agent: parrot}}
admins: {{room: [alice]}}
"""


@dataclass
class Browser:
    """An HTTP client that keeps no cookies by itself, follows no redirects, sends raw paths."""

    http: aiohttp.ClientSession
    base: str

    async def request(
        self,
        method: str,
        path: str,
        *,
        cookie: str | None = None,
        headers: dict[str, str] | None = None,
        data: bytes | str | None = None,
        json: object = None,
    ) -> tuple[aiohttp.ClientResponse, str]:
        """One request; the response (already read) and its text."""
        sent = dict(headers or {})
        if cookie is not None:
            sent["Cookie"] = f"{SESSION_COOKIE}={cookie}"
        if isinstance(data, str):
            sent.setdefault("Content-Type", "application/x-www-form-urlencoded")
        async with self.http.request(
            method,
            URL(self.base + path, encoded=True),
            headers=sent,
            data=data,
            json=json,
            allow_redirects=False,
        ) as response:
            body = await response.read()
            return response, body.decode("utf-8", "replace")

    async def sign_in(self, token: str = TOKEN) -> tuple[str, str]:
        """Sign in with the form; the session cookie's value and the page's CSRF token."""
        response, _ = await self.request("POST", "/console/login", data=f"token={token}")
        assert response.status == 303, response.status
        cookie = session_cookie(response)
        assert cookie is not None
        _, page = await self.request("GET", "/console/", cookie=cookie)
        return cookie, csrf_of(page)


def session_cookie(response: aiohttp.ClientResponse) -> str | None:
    """The value the response sets `lw_console` to, if it sets it."""
    for header in response.headers.getall("Set-Cookie", []):
        name, _, rest = header.partition("=")
        if name == SESSION_COOKIE:
            return rest.partition(";")[0]
    return None


def csrf_of(page: str) -> str:
    """The CSRF token of a console page's `<meta name="csrf-token">`."""
    found = re.search(r'<meta name="csrf-token" content="([^"]+)">', page)
    assert found is not None, page[:300]
    return found.group(1)


@asynccontextmanager
async def console_gateway(
    *, token: str = TOKEN, http: str = "", clock: Clock | None = None
) -> AsyncIterator[tuple[Gateway, Browser]]:
    """A started gateway (admin token `token`, empty: none) and a client for its console."""
    config = parse_config(config_text(http), env={"ADMIN": token})
    gateway = Gateway(config, connector_factory=FakePlatform(), clock=clock)
    await gateway.start()
    try:
        async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as http_client:
            yield gateway, Browser(http_client, f"http://127.0.0.1:{gateway.port}")
    finally:
        await gateway.stop(1.0)
