"""A proxy SIGKILLed mid-call: its budget holds are shown, then given back (issue 20).

A real `loopwarden proxy` subprocess on sqlite or redis state forwards calls the fake
upstream never answers, and is killed with SIGKILL while they are in flight: it never
charges them. Their estimates stay held (shown by `loopwarden spend` and `/admin/spend`,
and refusing every call) while the dead proxy's lease could still be alive; once it has
lapsed, the next proxy to start gives them back and calls are admitted again. The later
proxies run in the test's process on a clock moved past the lease, so nothing waits on
the wall clock.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest

from gateway.calls.budgets import OWNER_SECONDS
from gateway.calls.factory import build_call_store
from gateway.config import Config, parse_config
from gateway.proxy.alerts import Alerter
from gateway.proxy.app import ProxyServer
from tests.fakes.llm_upstream import FakeLLM, FakeResponse, Received, hang_response
from tests.gateway.proxy.proxy_helpers import ADMIN_TOKEN, MODEL, PROXY_KEY, proxy_yaml
from tests.gateway.proxy.test_proxy_cli import free_port

# Five calls of $0.10 fill the month's $0.50: the in-flight holds alone refuse the sixth.
BUDGET = """
budgets:
  - {name: agent-monthly, per: [agent], limit_usd: 0.50, period: month}
"""
IN_FLIGHT = 5
_prefixes = itertools.count()


def priced_body(prompt: str) -> bytes:
    """A call the proxy estimates at exactly $0.10: 40 input + 30 output tokens."""
    for pad in range(200):
        data = {
            "model": MODEL,
            "messages": [{"role": "user", "content": prompt + " " * pad}],
            "max_tokens": 30,
        }
        encoded = json.dumps(data, separators=(",", ":")).encode()
        if 156 < len(encoded) <= 160:
            return encoded
    raise AssertionError("no padding prices the body at $0.10")


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
def state(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The `state:` section of one shared backend, on data of its own."""
    if request.param == "sqlite":
        return f"{{backend: sqlite, path: '{tmp_path / 'state.sqlite3'}'}}"
    url = request.getfixturevalue("redis_url")
    return f"{{backend: redis, url: '{url}', key_prefix: 'holds{next(_prefixes)}:'}}"


async def call(url: str, prompt: str) -> int:
    headers = {"Authorization": f"Bearer {PROXY_KEY}", "Content-Type": "application/json"}
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"{url}/openai/v1/chat/completions", data=priced_body(prompt), headers=headers
        ) as answer,
    ):
        await answer.read()
        return answer.status


async def admin_spend(url: str) -> str:
    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with aiohttp.ClientSession() as http, http.get(f"{url}/admin/spend", headers=auth) as got:
        table: str = (await got.json())["result"]
        return table


def held_cell(table: str) -> str:
    """The HELD cell of the table's one group."""
    heading, row = table.splitlines()
    return row.split()[heading.split().index("HELD")]


@asynccontextmanager
async def in_process_proxy(config: Config, clock: Callable[[], float]) -> AsyncIterator[str]:
    """A proxy on the config's state whose store and budgets read `clock`; its URL."""
    store = build_call_store(config.state, clock=clock)
    proxy = ProxyServer(config, store=store, alerter=Alerter([]), wall_clock=clock)
    await proxy.start()
    try:
        yield f"http://127.0.0.1:{proxy.port}"
    finally:
        await proxy.stop()


async def test_issue20_a_sigkilled_proxy_s_holds_are_shown_then_given_back(
    state: str, tmp_path: Path
) -> None:
    forwarded = asyncio.Event()
    received: list[Received] = []

    def hang(request: Received) -> FakeResponse:
        received.append(request)
        if len(received) == IN_FLIGHT:
            forwarded.set()
        return hang_response()

    async with FakeLLM(responder=hang) as upstream:
        port = free_port()
        path = tmp_path / "loopwarden.yaml"
        path.write_text(proxy_yaml(upstream.url, BUDGET, state=state, port=port))
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            *("-m", "gateway", "proxy", "--config", str(path)),
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        assert process.stderr is not None
        try:
            started = b""
            while b"proxy listening" not in started:
                started = await asyncio.wait_for(process.stderr.readline(), timeout=20)
            url = f"http://127.0.0.1:{port}"
            calls = [asyncio.create_task(call(url, f"task {n}")) for n in range(IN_FLIGHT)]
            await asyncio.wait_for(forwarded.wait(), timeout=20)
            process.send_signal(signal.SIGKILL)
            await asyncio.wait_for(process.wait(), timeout=10)
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
        assert process.returncode == -signal.SIGKILL
        await asyncio.gather(*calls, return_exceptions=True)

        # The killed proxy's lease may still run: its holds show, and refuse every call.
        spend = await asyncio.create_subprocess_exec(
            sys.executable,
            *("-m", "gateway", "spend", "--config", str(path)),
            stdout=asyncio.subprocess.PIPE,
        )
        printed, _ = await asyncio.wait_for(spend.communicate(), timeout=20)
        assert spend.returncode == 0
        assert held_cell(printed.decode().strip()) == "$0.5000"
        config = parse_config(proxy_yaml(upstream.url, BUDGET, state=state), env={})
        async with in_process_proxy(config, time.time) as live:
            assert held_cell(await admin_spend(live)) == "$0.5000"
            assert await call(live, "refused") == 429

        # Past the lease: the next proxy to start gives the dead one's holds back.
        def later() -> float:
            return time.time() + OWNER_SECONDS + 1

        async with in_process_proxy(config, later) as live:
            assert held_cell(await admin_spend(live)) == "$0.0000"
            upstream.responder = None
            assert await call(live, "admitted") == 200
