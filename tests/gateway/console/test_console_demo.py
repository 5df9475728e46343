"""`loopwarden demo` prints a one-time console link and never the admin token it made up."""

from __future__ import annotations

import asyncio
import io
import re
import secrets

import aiohttp
import pytest

from gateway.demo.room import DemoOptions, run_demo

WAIT_SECONDS = 30.0
"""A bound on the wait so a broken demo fails instead of hanging; never a pass condition."""

MADE_UP = "made-up-demo-admin-token-0123"


class Terminal(io.StringIO):
    """The demo's output; flags the console line."""

    def __init__(self) -> None:
        super().__init__()
        self.linked = asyncio.Event()

    def write(self, text: str) -> int:
        if "console: " in text:
            self.linked.set()
        return super().write(text)


async def test_issue12_the_demo_prints_a_one_time_console_link(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = secrets.token_urlsafe
    monkeypatch.setattr(secrets, "token_urlsafe", lambda n=None: MADE_UP if n == 24 else real(n))
    terminal = Terminal()
    stop = asyncio.Event()
    options = DemoOptions(port=0, open_browser=False, kickoff=False, delay=0)
    demo = asyncio.create_task(run_demo(options, out=terminal, stop=stop))
    try:
        async with asyncio.timeout(WAIT_SECONDS):
            await terminal.linked.wait()
        found = re.search(
            r"^console: (http://127\.0\.0\.1:\d+/console/login\?code=\S+)  ",
            terminal.getvalue(),
            re.M,
        )
        assert found is not None, terminal.getvalue()
        link = found.group(1)
        async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as http:
            async with http.get(link, allow_redirects=False) as first:
                assert first.status == 303
                assert "lw_console=" in first.headers["Set-Cookie"]
            async with http.get(link, allow_redirects=False) as again:
                assert again.status == 401
            login = link.partition("?")[0]
            async with http.post(login, data={"token": MADE_UP}, allow_redirects=False) as signed:
                assert signed.status == 303
    finally:
        stop.set()
        assert await demo == 0
    assert MADE_UP not in terminal.getvalue()
