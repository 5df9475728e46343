"""Drive the room page once in headless Chromium over the DevTools protocol (aiohttp only)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from tests.connectors.room.room_helpers import WAIT_SECONDS, demo_gateway

CHROMIUM = shutil.which("chromium") or shutil.which("chromium", path="/usr/bin")

pytestmark = [
    pytest.mark.chromium,
    pytest.mark.skipif(
        CHROMIUM is None, reason="needs the chromium binary (apt-get install chromium)"
    ),
]


class DevTools:
    """A minimal Chrome DevTools Protocol client on one page target."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self._ws = ws
        self._next_id = 0

    async def call(self, method: str, params: dict[str, object] | None = None) -> dict[str, object]:
        """Send one command and return its result, skipping events that arrive meanwhile."""
        self._next_id += 1
        await self._ws.send_json({"id": self._next_id, "method": method, "params": params or {}})
        async with asyncio.timeout(WAIT_SECONDS):
            while True:
                reply = json.loads((await self._ws.receive()).data)
                if reply.get("id") == self._next_id:
                    if "error" in reply:
                        raise AssertionError(f"{method} failed: {reply['error']}")
                    result = reply["result"]
                    assert isinstance(result, dict)
                    return result

    async def evaluate(self, expression: str, *, await_promise: bool = False) -> object:
        """Evaluate JavaScript in the page and return its JSON value."""
        params: dict[str, object] = {
            "expression": expression,
            "returnByValue": True,
            "awaitPromise": await_promise,
        }
        value = (await self.call("Runtime.evaluate", params))["result"]
        assert isinstance(value, dict)
        return value.get("value")

    async def wait_for(self, expression: str) -> object:
        """The value of a JavaScript expression once it is truthy, checked in the page (bounded)."""
        waiter = (
            "new Promise(resolve => { const check = () => { const value = (" + expression + ");"
            " if (value) resolve(value); else setTimeout(check, 20); }; check(); })"
        )
        return await self.evaluate(waiter, await_promise=True)


@contextlib.asynccontextmanager
async def chromium(profile: Path) -> AsyncIterator[str]:
    """Run headless Chromium; yield the DevTools HTTP root. Always killed on the way out."""
    assert CHROMIUM is not None
    process = await asyncio.create_subprocess_exec(
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        "--remote-debugging-port=0",
        "about:blank",
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
        start_new_session=True,  # its own process group: the renderers go with it
    )
    try:
        active_port = profile / "DevToolsActivePort"
        async with asyncio.timeout(WAIT_SECONDS * 3):
            while not active_port.exists() or not active_port.read_text().strip():
                if process.returncode is not None:
                    raise AssertionError(f"chromium exited with {process.returncode}")
                await asyncio.sleep(0.05)
        port = active_port.read_text().split()[0]
        yield f"http://127.0.0.1:{port}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        await process.wait()


async def test_page_shows_the_bots_replies_in_headless_chromium(tmp_path: Path) -> None:
    async with (
        demo_gateway() as gateway,
        chromium(tmp_path / "profile") as devtools_root,
        aiohttp.ClientSession() as http,
    ):
        async with http.get(f"{devtools_root}/json/list") as response:
            targets = await response.json()
        page = next(target for target in targets if target["type"] == "page")
        async with http.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0) as ws:
            browser = DevTools(ws)
            await browser.call("Page.navigate", {"url": f"http://127.0.0.1:{gateway.port}/room"})
            await browser.wait_for("document.getElementById('status')?.dataset.state === 'joined'")
            await browser.evaluate(
                "document.getElementById('text').value = '@ping start';"
                "document.getElementById('composer').requestSubmit();"
            )
            texts = await browser.wait_for(
                "(() => { const bots = [...document.querySelectorAll("
                "'#messages li.message.bot')].map(li => li.querySelector('.text').textContent);"
                " return bots.includes('@pong ping') && bots.includes('@ping pong') && bots; })()"
            )
            human = await browser.evaluate(
                "document.querySelector('#messages li.message.human .text').textContent"
            )
            badge = await browser.evaluate(
                "document.querySelector('#messages li.message.bot .badge').textContent"
            )
    assert human == "@ping start"
    assert badge == "bot"
    assert isinstance(texts, list)
    assert texts[:2] == ["@pong ping", "@ping pong"]
