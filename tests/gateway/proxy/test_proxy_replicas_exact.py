"""Budgets and call circuits exact across 4 `loopwarden proxy` replicas (issue 24).

Four real `python -m gateway proxy` processes share one state (a redis-server, or one
sqlite file) in front of the fake upstream, which answers each call with a usage of our
choosing, so every call costs a known amount. 200 calls at once, spread round-robin over
the replicas, meet a budget with exactly one call's worth left: one is admitted, and the
money spent passes the limit by at most what that one call cost beyond its estimate
(nothing when the estimate was right). The spend the admin API shows equals the sum of
the request log's charges, to the nano-dollar. 200 identical calls at once meet a call
circuit of `max_repeats: 5`: five are forwarded, the rest refused, one alert goes out.

These are the promises LiteLLM's budgets break when several pods share them (litellm
#26672: a $10 key spent $217; PR #24682: counted per pod; #39390: per-model caps overspent
twice over); docs/how-to/replicas.md gives the figures. The replicas are stopped with
SIGTERM (which waits for their charges and request-log writes) before the log is read;
every other wait is a bounded poll on a condition.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from gateway.calls.budgets import nano
from gateway.calls.entry import CallLogEntry
from gateway.calls.factory import build_call_store
from gateway.config import parse_config
from gateway.proxy import messages
from tests.fakes.llm_upstream import FakeLLM, FakeResponse, Received
from tests.fakes.loopback import LOOPBACK_HOST, serve_loopback
from tests.gateway.proxy.proxy_helpers import ADMIN_TOKEN, MODEL, OTHER_KEY, PROXY_KEY, proxy_yaml
from tests.gateway.proxy.test_proxy_cli import free_port
from tests.gateway.proxy.test_proxy_holds import priced_body

REPLICAS = 4
BURST = 200
WAIT_SECONDS = 60.0
"""A bound on every wait, so a broken run fails instead of hanging; never a pass condition."""

# Each call is estimated at $0.10 (40 input + 30 output tokens, `priced_body`). Four
# calls spend $0.40 of each agent's $0.50, leaving exactly one call's worth.
BUDGET = """
budgets:
  - {name: agent-monthly, per: [agent], limit_usd: 0.50, period: month}
"""
LIMIT_NANO = nano(0.50)
ESTIMATE_NANO = nano(0.10)
SPENT_BEFORE = 4
EXACT = (40, 30)
"""The usage of a call whose estimate was right: $0.10."""
COSTLIER = (40, 55)
"""The usage of a call that cost more than its estimate: $0.15 ($0.05 over)."""
CIRCUIT = """
call_loop: {{max_repeats: 5}}
alerts: {{webhook: '{hook}'}}
"""
_prefixes = itertools.count()


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
def state(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The `state:` section the replicas share, on data of its own."""
    if request.param == "sqlite":
        return f"{{backend: sqlite, path: '{tmp_path / 'state.sqlite3'}'}}"
    url = request.getfixturevalue("redis_url")
    return f"{{backend: redis, url: '{url}', key_prefix: 'exact{next(_prefixes)}:'}}"


def completion(usage: tuple[int, int]) -> FakeResponse:
    """A chat completion reporting `usage` (input, output tokens)."""
    prompt, output = usage
    body = {
        "id": "chatcmpl-exact",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": MODEL,
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
        ],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": output,
            "total_tokens": prompt + output,
        },
    }
    return FakeResponse(body=body)


def priced(request: Received) -> FakeResponse:
    """The upstream's answer: a costlier usage for prompts that ask for one."""
    prompt = str(request.messages[0]["content"])
    return completion(COSTLIER if prompt.startswith("costly") else EXACT)


@dataclass
class Hook:
    """A local alert webhook that keeps what it receives."""

    url: str = ""
    received: list[dict[str, Any]] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.Response:
        self.received.append(await request.json())
        return web.Response(status=204)


@pytest.fixture
async def hook() -> AsyncIterator[Hook]:
    receiver = Hook()
    app = web.Application()
    app.router.add_post("/alerts", receiver.handle)
    runner = web.AppRunner(app, access_log=None)
    port = await serve_loopback(runner)
    receiver.url = f"http://{LOOPBACK_HOST}:{port}/alerts"
    yield receiver
    await runner.cleanup()


async def wait_for(predicate: Callable[[], Awaitable[bool]]) -> None:
    """Poll an async condition, bounded."""
    async with asyncio.timeout(WAIT_SECONDS):
        while not await predicate():  # noqa: ASYNC110 - the conditions are HTTP answers
            await asyncio.sleep(0.05)


@asynccontextmanager
async def replicas(text: str, tmp_path: Path) -> AsyncIterator[list[str]]:
    """REPLICAS `python -m gateway proxy` processes of one config text, each on its own port.

    Yields their URLs once every one is listening; stopped with SIGTERM, each must exit 0.
    """
    ports = [free_port() for _ in range(REPLICAS)]
    processes = []
    for index, port in enumerate(ports):
        own = tmp_path / f"replica{index}.yaml"
        own.write_text(text.replace("port: 0", f"port: {port}", 1), encoding="utf-8")
        processes.append(
            await asyncio.create_subprocess_exec(
                sys.executable,
                *("-m", "gateway", "proxy", "--config", str(own)),
                stderr=asyncio.subprocess.PIPE,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        )
    logs: list[list[bytes]] = [[] for _ in processes]

    async def drain(index: int, process: asyncio.subprocess.Process) -> None:
        assert process.stderr is not None
        async for line in process.stderr:
            logs[index].append(line)

    readers = [asyncio.create_task(drain(i, p)) for i, p in enumerate(processes)]
    try:

        async def listening() -> bool:
            return all(any(b"proxy listening" in line for line in log) for log in logs)

        await wait_for(listening)
        yield [f"http://127.0.0.1:{port}" for port in ports]
    finally:
        for process in processes:
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(WAIT_SECONDS):
            codes = [await process.wait() for process in processes]
            await asyncio.gather(*readers)
    printed = b"".join(b"".join(log) for log in logs).decode(errors="replace")
    assert codes == [0] * REPLICAS, printed


async def call(http: aiohttp.ClientSession, url: str, key: str, body: bytes) -> tuple[int, str]:
    """One chat completion through a replica: its status and `x-loopwarden-code`."""
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    async with http.post(f"{url}/openai/v1/chat/completions", data=body, headers=headers) as got:
        await got.read()
        return got.status, got.headers.get("x-loopwarden-code", "")


async def burst(urls: list[str], key: str, bodies: list[bytes]) -> list[tuple[int, str]]:
    """Every body at once, round-robin over the replicas, on as many connections."""
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as http:
        calls = [call(http, urls[n % len(urls)], key, body) for n, body in enumerate(bodies)]
        return await asyncio.gather(*calls)


async def spend_table(url: str) -> dict[str, dict[str, str]]:
    """`/admin/spend`'s groups by group name."""
    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with aiohttp.ClientSession() as http, http.get(f"{url}/admin/spend", headers=auth) as got:
        assert got.status == 200
        groups: list[dict[str, str]] = (await got.json())["groups"]
        return {group["group"]: group for group in groups}


def charged(entries: list[CallLogEntry], agent: str) -> list[int]:
    """The nano-dollars the request log says each of an agent's forwarded calls was charged."""
    return [
        nano(entry.cost or 0.0)
        for entry in entries
        if entry.agent == agent and entry.outcome == "forwarded"
    ]


async def test_issue24_a_budget_with_one_call_left_admits_one_call_of_200_across_4_replicas(
    state: str, tmp_path: Path
) -> None:
    async with FakeLLM(responder=priced) as upstream:
        text = proxy_yaml(upstream.url, BUDGET, state=state)
        async with replicas(text, tmp_path) as urls:
            async with aiohttp.ClientSession() as http:
                for n in range(SPENT_BEFORE):
                    for key in (PROXY_KEY, OTHER_KEY):
                        body = priced_body(f"warm {n}")
                        assert await call(http, urls[n % REPLICAS], key, body) == (200, "")
            # billing-bot's calls cost their estimate; support-bot's cost $0.05 more.
            exact, costly = await asyncio.gather(
                burst(urls, PROXY_KEY, [priced_body(f"task {n}") for n in range(BURST)]),
                burst(urls, OTHER_KEY, [priced_body(f"costly {n}") for n in range(BURST)]),
            )

            async def settled() -> bool:
                groups = await spend_table(urls[0])
                return len(groups) == 2 and all(g["held"] == "$0.0000" for g in groups.values())

            await wait_for(settled)
            shown = await spend_table(urls[1])

        for answers in (exact, costly):
            assert sorted(answers).count((200, "")) == 1
            assert sorted(answers)[1:] == [(429, "budget_exceeded")] * (BURST - 1)
        assert len(upstream.requests) == 2 * (SPENT_BEFORE + 1)

        config = parse_config(text, env={})
        store = build_call_store(config.state)
        await store.start()
        try:
            entries = await store.calls_since(3_600)
            groups = {key: spend for key, spend in await store.spend_groups()}
        finally:
            await store.aclose()
        assert len(entries) == 2 * (SPENT_BEFORE + BURST)
        by_agent = {agent: charged(entries, agent) for agent in ("billing-bot", "support-bot")}
        assert by_agent["billing-bot"] == [ESTIMATE_NANO] * (SPENT_BEFORE + 1)
        assert sorted(by_agent["support-bot"]) == [ESTIMATE_NANO] * SPENT_BEFORE + [nano(0.15)]
        # No overshoot when the estimate was right; the one admitted call's excess when not.
        assert sum(by_agent["billing-bot"]) == LIMIT_NANO
        assert sum(by_agent["support-bot"]) - LIMIT_NANO == nano(0.15) - ESTIMATE_NANO
        assert sorted(g.spent.nano_usd for g in groups.values()) == sorted(
            sum(charges) for charges in by_agent.values()
        )
        for agent, charges in by_agent.items():
            assert shown[f"agent={agent}"]["spent"] == messages.money(sum(charges), None)


async def test_issue24_a_circuit_forwards_5_of_200_identical_calls_across_4_replicas(
    state: str, tmp_path: Path, hook: Hook
) -> None:
    async with FakeLLM() as upstream:
        text = proxy_yaml(upstream.url, CIRCUIT.format(hook=hook.url), state=state)
        body = json.dumps(
            {"model": MODEL, "messages": [{"role": "user", "content": "Is the export done?"}]}
        ).encode()
        async with replicas(text, tmp_path) as urls:
            answers = await burst(urls, PROXY_KEY, [body] * BURST)

            async def alerted() -> bool:
                return bool(hook.received)

            await wait_for(alerted)

        assert [a for a in answers if a[0] == 200] == [(200, "")] * 5
        refused = [code for status, code in answers if status != 200]
        assert len(refused) == BURST - 5
        assert set(refused) <= {"loop_detected", "loop_paused"}
        assert "loop_detected" in refused
        assert len(upstream.requests) == 5
        assert len(hook.received) == 1  # one alert, from the replica that paused the circuit
