"""Budgets and call circuits exact across 4 `loopwarden proxy` replicas (issue 24).

Four real `python -m gateway proxy` processes share one state (a redis-server, the
3-master Redis Cluster of tests/fakes/redis_cluster.py, or one sqlite file) in front of
the fake upstream, which answers each call with a usage of our choosing, so every call
costs a known amount. 200 calls at once, spread round-robin over the replicas, meet a
budget with exactly one call's worth left: one is admitted, and the money spent passes
the limit by at most what that one call cost beyond its estimate (nothing when the
estimate was right). The spend the admin API shows equals the sum of the request log's
charges, to the nano-dollar. The same holds for two `--workers 2` processes on the
cluster, every one of the four workers deciding some of the calls. 200 identical calls
at once meet a call circuit of `max_repeats: 5`: five are forwarded, the rest refused,
one alert goes out; and one at a time on the cluster, the 6th repeat is refused on
whichever replica it lands.

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
from typing import Any, cast

import aiohttp
import pytest
from aiohttp import web

from gateway.calls.budgets import nano
from gateway.calls.entry import CallLogEntry
from gateway.calls.factory import build_call_store
from gateway.cli.workers import WORKER_HEADER
from gateway.config import parse_config
from gateway.proxy import messages
from gateway.proxy.calls import SESSION_HEADER
from tests.fakes.llm_upstream import FakeLLM, FakeResponse, Received
from tests.fakes.loopback import LOOPBACK_HOST, serve_loopback
from tests.fakes.redis_cluster import RedisCluster
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
REPEATED = json.dumps(
    {"model": MODEL, "messages": [{"role": "user", "content": "Is the export done?"}]}
).encode()
"""The call the circuit tests repeat."""
_prefixes = itertools.count()


@pytest.fixture(
    params=[
        "sqlite",
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("redis-cluster", marks=pytest.mark.redis),
    ]
)
def state(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The `state:` section the replicas share, on data of its own: one sqlite file, one
    redis-server, or the 3-master Redis Cluster (tests/fakes/redis_cluster.py)."""
    if request.param == "sqlite":
        return f"{{backend: sqlite, path: '{tmp_path / 'state.sqlite3'}'}}"
    if request.param == "redis-cluster":
        return cluster_state(cast(RedisCluster, request.getfixturevalue("redis_cluster")))
    url = request.getfixturevalue("redis_url")
    return f"{{backend: redis, url: '{url}', key_prefix: 'exact{next(_prefixes)}:'}}"


def cluster_state(cluster: RedisCluster) -> str:
    """The `state:` section of the cluster, under a key prefix of its own."""
    prefix = f"exact{next(_prefixes)}:"
    return f"{{backend: redis, url: '{cluster.url}', cluster: true, key_prefix: '{prefix}'}}"


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
async def replicas(
    text: str, tmp_path: Path, *, count: int = REPLICAS, workers: int = 1
) -> AsyncIterator[list[str]]:
    """`count` `python -m gateway proxy --workers <workers>` processes of one config text,
    each on its own port.

    Yields their URLs once every worker is listening; stopped with SIGTERM, each must exit 0.
    """
    ports = [free_port() for _ in range(count)]
    processes = []
    for index, port in enumerate(ports):
        own = tmp_path / f"replica{index}.yaml"
        own.write_text(text.replace("port: 0", f"port: {port}", 1), encoding="utf-8")
        processes.append(
            await asyncio.create_subprocess_exec(
                sys.executable,
                *("-m", "gateway", "proxy", "--workers", str(workers), "--config", str(own)),
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
            return all(sum(b"proxy listening" in line for line in log) >= workers for log in logs)

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
    assert codes == [0] * count, printed


@dataclass
class Answers:
    """What a burst got back: each call's status and `x-loopwarden-code`, and the worker
    pids that answered (`X-Loopwarden-Worker`, sent only by `--workers` processes)."""

    codes: list[tuple[int, str]]
    workers: set[str]


async def call(
    http: aiohttp.ClientSession, url: str, key: str, body: bytes, *, session: str = ""
) -> tuple[int, str, str]:
    """One chat completion through a replica, in `session` when given: its status,
    `x-loopwarden-code` and worker."""
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    if session:
        headers[SESSION_HEADER] = session
    async with http.post(f"{url}/openai/v1/chat/completions", data=body, headers=headers) as got:
        await got.read()
        code = got.headers.get("x-loopwarden-code", "")
        return got.status, code, got.headers.get(WORKER_HEADER, "")


async def burst(urls: list[str], key: str, bodies: list[bytes]) -> Answers:
    """Every body at once, round-robin over the replicas, on as many connections."""
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as http:
        calls = [call(http, urls[n % len(urls)], key, body) for n, body in enumerate(bodies)]
        answers = await asyncio.gather(*calls)
    return Answers([(status, code) for status, code, _ in answers], {w for *_, w in answers})


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


async def one_call_left_of_200(
    upstream: FakeLLM, text: str, tmp_path: Path, *, count: int = REPLICAS, workers: int = 1
) -> set[str]:
    """Two agents with one call's worth left each meet 200 calls at once over `count`
    processes of `workers` workers: one call each is admitted, the overshoot is at most
    the admitted call's excess over its estimate, and `/admin/spend` and the spend store
    equal the request log's charges to the nano-dollar. Returns the worker pids that
    answered the bursts."""
    async with replicas(text, tmp_path, count=count, workers=workers) as urls:
        async with aiohttp.ClientSession() as http:
            for n in range(SPENT_BEFORE):
                for key in (PROXY_KEY, OTHER_KEY):
                    answer = await call(http, urls[n % count], key, priced_body(f"warm {n}"))
                    assert answer[:2] == (200, "")
        # billing-bot's calls cost their estimate; support-bot's cost $0.05 more.
        exact, costly = await asyncio.gather(
            burst(urls, PROXY_KEY, [priced_body(f"task {n}") for n in range(BURST)]),
            burst(urls, OTHER_KEY, [priced_body(f"costly {n}") for n in range(BURST)]),
        )

        async def settled() -> bool:
            groups = await spend_table(urls[0])
            return len(groups) == 2 and all(g["held"] == "$0.0000" for g in groups.values())

        await wait_for(settled)
        shown = await spend_table(urls[-1])

    for answers in (exact.codes, costly.codes):
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
    return exact.workers | costly.workers


async def test_issue24_a_budget_with_one_call_left_admits_one_call_of_200_across_4_replicas(
    state: str, tmp_path: Path
) -> None:
    async with FakeLLM(responder=priced) as upstream:
        await one_call_left_of_200(
            upstream, proxy_yaml(upstream.url, BUDGET, state=state), tmp_path
        )


@pytest.mark.redis
async def test_issue24_two_proxies_of_2_workers_on_the_cluster_admit_one_call_of_200(
    redis_cluster: RedisCluster, tmp_path: Path
) -> None:
    async with FakeLLM(responder=priced) as upstream:
        text = proxy_yaml(upstream.url, BUDGET, state=cluster_state(redis_cluster))
        answered = await one_call_left_of_200(upstream, text, tmp_path, count=2, workers=2)
    assert len(answered) == 4  # every worker of both processes decided some of the calls


async def test_issue24_a_circuit_forwards_5_of_200_identical_calls_across_4_replicas(
    state: str, tmp_path: Path, hook: Hook
) -> None:
    async with FakeLLM() as upstream:
        text = proxy_yaml(upstream.url, CIRCUIT.format(hook=hook.url), state=state)
        async with replicas(text, tmp_path) as urls:
            answers = (await burst(urls, PROXY_KEY, [REPEATED] * BURST)).codes

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


@pytest.mark.redis
async def test_issue24_the_6th_repeat_is_refused_on_whichever_of_4_replicas_on_the_cluster(
    redis_cluster: RedisCluster, tmp_path: Path
) -> None:
    async with FakeLLM() as upstream:
        text = proxy_yaml(
            upstream.url, "call_loop: {max_repeats: 5}", state=cluster_state(redis_cluster)
        )
        async with replicas(text, tmp_path) as urls, aiohttp.ClientSession() as http:
            for landing in range(REPLICAS):
                # One session (circuit) per landing replica; its 5 repeats go to the others.
                session = f"run-{landing}"
                for n in range(5):
                    url = urls[(landing + 1 + n) % REPLICAS]
                    answer = await call(http, url, PROXY_KEY, REPEATED, session=session)
                    assert answer[:2] == (200, "")
                sixth = await call(http, urls[landing], PROXY_KEY, REPEATED, session=session)
                assert sixth[:2] == (429, "loop_detected"), landing
        assert len(upstream.requests) == 5 * REPLICAS
