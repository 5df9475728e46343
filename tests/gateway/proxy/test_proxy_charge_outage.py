"""Money through the proxy when Redis fails (issue 24): charged late, never lost, refused.

Real parts: the proxy app before the fake upstream, whose stream is held after its first
chunk (`gate`) while a real redis-server is stopped (SIGKILL, no persistence) and
started again empty. The charge and the request-log entry Redis could not take are kept
in the proxy and written once it answers: `/admin/spend` and the log show the call once.
With `state.wait_replicas` on a master whose replica is frozen (SIGSTOP), a budgeted
call is refused `state_unavailable` under `deny`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from gateway.calls.budgets import nano
from gateway.calls.redis_store import RedisCallStore
from tests.fakes.llm_upstream import FakeLLM
from tests.fakes.redis_cluster import SentinelPair, running_sentinel
from tests.fakes.redis_server import RedisServer
from tests.gateway.proxy.proxy_helpers import ADMIN_TOKEN, MODEL, PROXY_KEY, Rig, running_proxy

pytestmark = pytest.mark.redis

BUDGET = """
budgets:
  - {name: agent-tokens, per: [agent], limit_tokens: 100000, period: day}
"""
CHAT = "/openai/v1/chat/completions"
POLLS = 400
POLL_SECONDS = 0.05
"""A bounded wait for Redis to be used again (DESIGN.md: within 10 s): 400 polls of 50 ms."""


def state(redis: RedisServer, on_error: str) -> str:
    return f"{{backend: redis, url: '{redis.url}', on_error: {on_error}}}"


def call_store(rig: Rig) -> RedisCallStore:
    store = rig.store
    assert isinstance(store, RedisCallStore)
    return store


async def chat(rig: Rig) -> tuple[int, dict[str, object]]:
    """A plain chat completion; its status and JSON body."""
    headers = {"Authorization": f"Bearer {PROXY_KEY}"}
    body = {"model": MODEL, "messages": [{"role": "user", "content": "q"}]}
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{rig.url}{CHAT}", json=body, headers=headers) as answer,
    ):
        return answer.status, json.loads(await answer.read())


async def stream(rig: Rig) -> tuple[int, bytes]:
    """A streamed chat completion that asks for usage; its status and whole body."""
    body = {
        "model": MODEL,
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": "a question asked once"}],
    }
    headers = {"Authorization": f"Bearer {PROXY_KEY}"}
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{rig.url}{CHAT}", json=body, headers=headers) as answer,
    ):
        return answer.status, await answer.read()


async def admin_spend(rig: Rig) -> list[dict[str, object]] | None:
    """`GET /admin/spend`'s groups, None while it cannot answer."""
    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{rig.url}/admin/spend", headers=auth) as answer,
    ):
        if answer.status != 200:
            return None
        groups: list[dict[str, object]] = (await answer.json())["groups"]
        return groups


async def written(rig: Rig) -> list[dict[str, object]]:
    """Poll `/admin/spend` until Redis answers and nothing waits to be written."""
    store = call_store(rig)
    for _ in range(POLLS):
        waiting = store.pending_writes
        groups = await admin_spend(rig)  # also lets the proxy find Redis back
        if groups is not None and not waiting:
            return groups
        await asyncio.sleep(POLL_SECONDS)
    raise AssertionError(f"{store.pending_writes} writes still wait for Redis")


async def test_issue24_a_call_in_flight_when_redis_goes_away_is_charged_once_it_is_back(
    redis: RedisServer,
) -> None:
    gate = asyncio.Event()
    async with running_proxy(
        BUDGET, upstream=FakeLLM(gate=gate), state=state(redis, "allow")
    ) as rig:
        call = asyncio.create_task(stream(rig))
        await rig.upstream.first_chunk_sent.wait()  # admitted: its estimate is held in Redis
        redis.stop()
        gate.set()
        status, body = await call
        assert status == 200
        assert b"[DONE]" in body
        await rig.proxy.settle()
        assert call_store(rig).pending_writes == 2  # its charge and its log entry

        redis.start()  # empty: the hold went with the old process
        groups = await written(rig)
        (entry,) = await rig.logged()
        assert entry.outcome == "forwarded"
        assert not entry.estimated
        tokens = (entry.input_tokens or 0) + (entry.output_tokens or 0)
        assert [(g["budget"], g["spent"], g["held"]) for g in groups] == [
            ("agent-tokens", f"{tokens} tokens", "0 tokens")
        ]
        ((_, record),) = await rig.store.spend_groups()
        assert record.spent.tokens == tokens
        assert record.spent.nano_usd == nano(entry.cost or 0.0)


async def test_issue24_a_refusal_for_unreachable_state_is_logged_state_unavailable(
    redis: RedisServer,
) -> None:
    async with running_proxy(BUDGET, state=state(redis, "deny")) as rig:
        redis.stop()
        status, answer = await chat(rig)
        assert status == 503
        assert answer["error"]["code"] == "state_unavailable"  # type: ignore[index]
        await rig.proxy.settle()
        assert (
            rig.proxy.metrics.registry.get_sample_value("state_pending_writes") == 1
        )  # the log entry, kept
        redis.start()
        await written(rig)
        (entry,) = await rig.logged()
        assert entry.outcome == "state_unavailable"
        assert entry.agent == "billing-bot"
        assert len(rig.upstream.requests) == 0
        refusals = rig.proxy.metrics.registry.get_sample_value(
            "proxy_refusals_total", {"provider": "openai", "code": "state_unavailable"}
        )
        assert refusals == 1


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[SentinelPair]:
    with running_sentinel(tmp_path / "sentinel") as started:
        yield started
        started.replica.thaw()


async def test_issue24_wait_replicas_from_the_config_refuses_when_the_replica_lags(
    pair: SentinelPair,
) -> None:
    url = f"redis://127.0.0.1:{pair.master.port}/0"
    state = f"{{backend: redis, url: '{url}', on_error: deny, wait_replicas: 1}}"
    async with running_proxy(BUDGET, state=state) as rig:
        assert (await chat(rig))[0] == 200
        pair.replica.freeze()
        status, answer = await chat(rig)
        assert status == 503
        assert answer["error"]["code"] == "state_unavailable"  # type: ignore[index]
        assert len(rig.upstream.requests) == 1
        short = rig.proxy.metrics.registry.get_sample_value("state_replica_waits_short_total")
        assert short is not None
        assert short >= 1
        pair.replica.thaw()
        assert (await chat(rig))[0] == 200
        outcomes = [entry.outcome for entry in await rig.logged()]
        assert sorted(outcomes) == ["forwarded", "forwarded", "state_unavailable"]


async def test_issue24_admin_spend_while_redis_is_down_is_503_and_served_again_after(
    redis: RedisServer,
) -> None:
    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with running_proxy(BUDGET, state=state(redis, "allow")) as rig:
        assert (await chat(rig))[0] == 200
        redis.stop()
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"{rig.url}/admin/spend", headers=auth) as answer,
        ):
            assert answer.status == 503
            assert answer.headers["Retry-After"] == "10"
            body = await answer.json()
        assert body["ok"] is False
        assert body["error"].startswith("state_unavailable")
        redis.start()
        assert await written(rig) is not None
