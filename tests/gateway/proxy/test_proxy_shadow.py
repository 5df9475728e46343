"""Shadow mode in the proxy, with the real `openai` SDK, on every state backend (issue 13)."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import openai
import pytest

from tests.fakes.llm_upstream import FakeLLM
from tests.gateway.proxy.proxy_helpers import MODEL, PROXY_KEY, Rig, running_proxy

BACKENDS = ["memory", "sqlite", pytest.param("redis", marks=pytest.mark.redis)]
COMPLETIONS = "/v1/chat/completions"
SHADOW_HEADER = "x-loopwarden-shadow"
_prefixes = itertools.count()


@pytest.fixture(params=BACKENDS)
def state(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The `state:` section of one backend, on data of its own."""
    backend: str = request.param
    if backend == "memory":
        return "{backend: memory}"
    if backend == "sqlite":
        return f"{{backend: sqlite, path: '{tmp_path / 'state.sqlite3'}'}}"
    url = request.getfixturevalue("redis_url")
    return f"{{backend: redis, url: '{url}', key_prefix: 'shadow{next(_prefixes)}:'}}"


def client(rig: Rig, **headers: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=f"{rig.url}/openai/v1",
        api_key=PROXY_KEY,
        default_headers={"X-Loopwarden-Session": "run-1", **headers},
    )


async def shadow_codes(sdk: openai.AsyncOpenAI, prompts: list[str]) -> list[str | None]:
    """Send each prompt; the answer must be the upstream's; each response's shadow header."""
    codes: list[str | None] = []
    for prompt in prompts:
        raw = await sdk.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": prompt}]
        )
        assert raw.parse().choices[0].message.content == "pong"
        codes.append(raw.headers.get(SHADOW_HEADER))
    return codes


@pytest.fixture
async def shadow_circuit(state: str) -> AsyncIterator[Rig]:
    async with running_proxy("call_loop: {mode: shadow}", state=state) as rig:
        yield rig


async def test_issue13_a_shadow_circuit_forwards_every_call_and_marks_the_refused_ones(
    shadow_circuit: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    rig = shadow_circuit
    with caplog.at_level(logging.INFO, logger="loopwarden.proxy"):
        async with client(rig) as sdk:
            codes = await shadow_codes(sdk, ["Is the export done?"] * 8)
    # Enforce mode refuses the 6th call and pauses the circuit; shadow forwards them all.
    assert codes == [None] * 5 + ["loop_detected", "loop_paused", "loop_paused"]
    assert len(rig.upstream.calls(COMPLETIONS)) == 8
    assert rig.served == ["/openai/v1/chat/completions"] * 8  # no SDK retry of anything
    logged = await rig.logged()
    assert [entry.outcome for entry in logged] == ["forwarded"] * 8
    # The state is what enforce mode leaves: the circuit is paused (and can be reopened).
    assert [p.circuit for p in await rig.store.paused()] == ["billing-bot/session=run-1"]
    assert rig.alerts.alerts == []
    flagged = [getattr(r, "shadow", None) for r in caplog.records if "shadow:" in r.getMessage()]
    assert flagged == ["true"] * 3


async def test_issue13_a_shadow_rule_forwards_and_names_itself(state: str) -> None:
    rules = """
    rules:
      - {name: one-per-step, fields: [session, step], max_calls: 1, window_seconds: 60,
         mode: shadow}
    """
    async with running_proxy(rules, state=state) as rig:
        async with client(rig, **{"X-Loopwarden-Step": "page-3"}) as sdk:
            codes = await shadow_codes(sdk, ["Summarise page 3", "Summarise page 3 again"])
        assert codes == [None, "duplicate_call:one-per-step"]
        assert len(rig.upstream.calls(COMPLETIONS)) == 2


async def test_issue13_an_enforce_rule_still_refuses_beside_a_shadow_circuit(state: str) -> None:
    rules = """
    call_loop: {mode: shadow, max_repeats: 1}
    rules:
      - {name: three-per-session, fields: [session], max_calls: 3, window_seconds: 60}
    """
    async with running_proxy(rules, state=state) as rig:
        async with client(rig) as sdk:
            codes = await shadow_codes(sdk, ["one", "two", "three"])
            assert codes == [None, None, None]
            with pytest.raises(openai.RateLimitError) as caught:
                await sdk.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": "four"}]
                )
        assert caught.value.code == "duplicate_call"
        assert SHADOW_HEADER not in caught.value.response.headers
        assert len(rig.upstream.calls(COMPLETIONS)) == 3


def priced_body(prompt: str) -> bytes:
    """A streamed call the proxy estimates at exactly $0.10: 40 input + 30 output tokens.

    `gpt-4o*` costs $1 / $2 per 1,000 tokens and the estimate takes 4 bytes a token, so
    the prompt is padded until the body is 157 to 160 bytes long.
    """
    for pad in range(200):
        data = {
            "model": MODEL,
            "messages": [{"role": "user", "content": prompt + " " * pad}],
            "max_tokens": 30,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        encoded = json.dumps(data, separators=(",", ":")).encode()
        if 156 < len(encoded) <= 160:
            return encoded
    raise AssertionError("no padding prices the body at $0.10")


async def test_issue20_a_shadow_circuit_does_not_unlock_spend(state: str) -> None:
    budget = """
    call_loop: {mode: shadow}
    budgets:
      - {name: agent-daily, per: [agent], limit_usd: 1.00, period: day}
    """
    gate = asyncio.Event()
    async with (
        running_proxy(budget, state=state, upstream=FakeLLM(gate=gate)) as rig,
        aiohttp.ClientSession() as http,
    ):
        data = priced_body("Is the export done?")
        headers = {
            "Authorization": f"Bearer {PROXY_KEY}",
            "Content-Type": "application/json",
            "X-Loopwarden-Session": "run-1",
        }
        refused: list[str] = []
        decided: list[int] = []
        all_decided = asyncio.Event()

        async def call() -> int:
            url = f"{rig.url}/openai/v1/chat/completions"
            async with http.post(url, data=data, headers=headers) as answer:
                # A forwarded stream's headers arrive before the upstream's gate holds it.
                decided.append(answer.status)
                if len(decided) == 50:
                    all_decided.set()
                if answer.status != 200:
                    refused.append(answer.headers.get("x-loopwarden-code", ""))
                await answer.read()
                return answer.status

        calls = [asyncio.create_task(call()) for _ in range(50)]
        async with asyncio.timeout(30):
            await all_decided.wait()
        gate.set()
        statuses = await asyncio.gather(*calls)
        await rig.proxy.settle()
        rows = await rig.store.spend_groups()
    # $1.00 holds ten $0.10 estimates: the 5 the circuit admits and 5 it would refuse.
    assert statuses.count(200) == 10
    assert len(rig.upstream.calls(COMPLETIONS)) == 10
    assert refused == ["budget_exceeded"] * 40
    [(_, spend)] = rows
    assert spend.held.nano_usd == 0
    assert spend.spent.nano_usd <= 1_000_000_000


async def test_issue20_a_shadow_circuit_does_not_waive_the_anomaly_pause(state: str) -> None:
    pausing = """
    call_loop: {mode: shadow}
    anomaly: {window: 60m, factor: 3, min_usd: 0.04, action: pause}
    """
    async with running_proxy(pausing, state=state) as rig, client(rig) as sdk:
        # A new agent is judged by min_usd alone: the 2nd $0.025 call passes $0.04 and pauses it.
        assert await shadow_codes(sdk, ["first question", "second question"]) == [None, None]
        await rig.proxy.settle()
        with pytest.raises(openai.RateLimitError) as caught:
            await sdk.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "third question"}]
            )
        assert caught.value.code == "loop_paused"
        assert "spend anomaly" in caught.value.message
        assert SHADOW_HEADER not in caught.value.response.headers
        assert len(rig.upstream.calls(COMPLETIONS)) == 2
        logged = await rig.logged()
    assert [entry.outcome for entry in logged] == ["forwarded", "forwarded", "loop_paused"]
