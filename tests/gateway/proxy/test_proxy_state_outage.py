"""Budgets while Redis is down (issue 24): `on_error: deny` fails closed, `allow` decides locally.

A real redis-server is stopped mid-test under the real proxy app and the fake upstream.
"""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from tests.fakes.redis_server import RedisServer
from tests.gateway.proxy.proxy_helpers import MODEL, OTHER_KEY, PROXY_KEY, Rig, running_proxy

pytestmark = pytest.mark.redis

# The budget applies to billing-bot (PROXY_KEY) only; support-bot (OTHER_KEY) has none.
BILLING_BUDGET = """
budgets:
  - {name: billing-tokens, per: [agent], limit_tokens: 40, period: day,
     filters: {agent: billing-bot}}
"""
OPENAI = "/openai/v1/chat/completions"
ANTHROPIC = "/anthropic/v1/messages"
GEMINI = "/gemini/v1beta/models/gemini-2.0-flash:generateContent"
BODIES = {
    OPENAI: {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "q"}]},
    ANTHROPIC: {
        "model": "claude-x",
        "max_tokens": 5,
        "messages": [{"role": "user", "content": "q"}],
    },
    GEMINI: {"contents": [{"parts": [{"text": "q"}]}]},
}
# DESIGN.md §2 "State": the gateway uses Redis again within 10 s of its return.
RECOVERY_SECONDS = 10.0
RECOVERY_POLLS = 50


def state(redis: RedisServer, on_error: str) -> str:
    return f"{{backend: redis, url: '{redis.url}', on_error: {on_error}}}"


async def post(rig: Rig, path: str, key: str = PROXY_KEY) -> tuple[int, dict[str, str], bytes]:
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    data = json.dumps(BODIES[path]).encode()
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{rig.url}{path}", data=data, headers=headers) as answer,
    ):
        return answer.status, dict(answer.headers), await answer.read()


async def test_issue24_deny_refuses_budgeted_calls_503_in_each_format_until_redis_is_back(
    redis: RedisServer,
) -> None:
    async with running_proxy(BILLING_BUDGET, state=state(redis, "deny")) as rig:
        assert (await post(rig, OPENAI))[0] == 200
        redis.stop()
        sent = len(rig.upstream.requests)

        status, headers, raw = await post(rig, OPENAI)
        assert status == 503
        error = json.loads(raw)["error"]
        assert (error["code"], error["type"]) == ("state_unavailable", "server_error")
        assert "billing-tokens" in error["message"]
        assert headers["Retry-After"] == "3"
        assert headers["x-loopwarden-code"] == "state_unavailable"
        assert headers["x-loopwarden-budget"] == "billing-tokens"
        assert headers["x-should-retry"] == "true"  # nothing was sent: safe to retry

        status, headers, raw = await post(rig, ANTHROPIC)
        assert status == 503
        body = json.loads(raw)
        assert body["type"] == "error"
        assert body["error"]["type"] == "api_error"
        assert body["error"]["details"]["error_code"] == "state_unavailable"
        assert headers["Retry-After"] == "3"

        status, headers, raw = await post(rig, GEMINI)
        assert status == 503
        error = json.loads(raw)["error"]
        assert (error["code"], error["status"]) == (503, "UNAVAILABLE")
        assert error["details"][0]["reason"] == "STATE_UNAVAILABLE"
        assert headers["Retry-After"] == "3"
        assert len(rig.upstream.requests) == sent  # the upstream saw none of them

        # No budget applies to support-bot: the call guard's local fallback decides.
        assert (await post(rig, OPENAI, OTHER_KEY))[0] == 200
        assert len(rig.upstream.requests) == sent + 1

        redis.start()
        for _ in range(RECOVERY_POLLS):
            status = (await post(rig, OPENAI))[0]
            if status != 503:
                break
            await asyncio.sleep(RECOVERY_SECONDS / RECOVERY_POLLS)
        assert status == 200


async def test_issue24_allow_decides_budgets_on_local_records_while_redis_is_down(
    redis: RedisServer,
) -> None:
    async with running_proxy(BILLING_BUDGET, state=state(redis, "allow")) as rig:
        redis.stop()
        # The local budget records start empty: the 40 tokens admit one call, as on Redis.
        assert (await post(rig, OPENAI))[0] == 200
        await rig.proxy.settle()
        status, _, raw = await post(rig, OPENAI)
        assert status == 429
        assert json.loads(raw)["error"]["code"] == "budget_exceeded"
        assert len(rig.upstream.requests) == 1
