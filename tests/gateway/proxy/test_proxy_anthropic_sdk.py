"""The proxy with the real `anthropic` SDK in front and a fake provider behind (issue 6)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import anthropic
import pytest

from tests.fakes.llm_upstream import INPUT_TOKENS, OUTPUT_TOKENS, FakeLLM
from tests.gateway.proxy.proxy_helpers import PROXY_KEY, UPSTREAM_KEY, Rig, running_proxy

MODEL = "claude-fake-1"
MESSAGES = "/v1/messages"


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    async with running_proxy() as running:
        yield running


def client(rig: Rig, session: str = "job-7", key: str = PROXY_KEY) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(
        base_url=f"{rig.url}/anthropic",
        api_key=key,
        default_headers={"X-Loopwarden-Session": session},
    )


async def ask(sdk: anthropic.AsyncAnthropic, text: str = "Summarise invoice 88231") -> str:
    message = await sdk.messages.create(
        model=MODEL, max_tokens=64, messages=[{"role": "user", "content": text}]
    )
    block = message.content[0]
    assert isinstance(block, anthropic.types.TextBlock)
    return block.text


async def test_issue6_a_looping_client_gets_five_calls_then_loop_detected(rig: Rig) -> None:
    async with client(rig) as sdk:
        for _ in range(5):
            assert await ask(sdk) == "pong"
        with pytest.raises(anthropic.RateLimitError) as caught:
            await ask(sdk)
        with pytest.raises(anthropic.RateLimitError) as paused:
            await ask(sdk, "Something else")
        async with client(rig, "job-8") as other:
            assert await ask(other) == "pong"
    assert len(rig.upstream.calls(MESSAGES)) == 6
    assert rig.served == ["/anthropic/v1/messages"] * 8  # no automatic retries
    body = caught.value.body
    assert isinstance(body, dict)
    assert body["type"] == "error"
    assert body["error"]["type"] == "rate_limit_error"
    assert body["error"]["code"] == "loop_detected"
    assert "loop_detected" in caught.value.message
    assert "billing-bot" in caught.value.message
    assert "job-7" in caught.value.message
    assert caught.value.response.headers["x-should-retry"] == "false"
    assert caught.value.response.headers["Retry-After"] == "300"
    assert "loop_paused" in paused.value.message


async def test_the_upstream_gets_x_api_key_and_the_version(rig: Rig) -> None:
    async with client(rig) as sdk:
        await ask(sdk)
    async with aiohttp.ClientSession() as http:
        body = {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "x"}]}
        headers = {"x-api-key": PROXY_KEY}
        async with http.post(f"{rig.url}/anthropic/v1/messages", json=body, headers=headers):
            pass
    from_sdk, bare = (
        {k.lower(): v for k, v in sent.headers.items()} for sent in rig.upstream.requests
    )
    assert from_sdk["x-api-key"] == UPSTREAM_KEY
    assert from_sdk["anthropic-version"] == sdk.default_headers["anthropic-version"]
    assert "authorization" not in from_sdk
    assert bare["anthropic-version"] == "2023-06-01"


async def test_issue6_an_unknown_key_gets_401_in_anthropic_format(rig: Rig) -> None:
    async with client(rig, key="lw-nope") as sdk:
        with pytest.raises(anthropic.AuthenticationError) as caught:
            await ask(sdk)
    body = caught.value.body
    assert isinstance(body, dict)
    assert body["error"]["type"] == "authentication_error"
    assert rig.upstream.requests == []


async def test_issue6_streaming_passes_through_unbuffered() -> None:
    gate = asyncio.Event()
    async with (
        running_proxy(upstream=FakeLLM(gate=gate, reply="abcdefghi")) as rig,
        client(rig) as sdk,
        sdk.messages.stream(
            model=MODEL, max_tokens=64, messages=[{"role": "user", "content": "hi"}]
        ) as stream,
    ):
        texts = aiter(stream.text_stream)
        first = await asyncio.wait_for(anext(texts), timeout=10)
        assert not gate.is_set()
        assert first == "abc"
        gate.set()
        rest = [text async for text in texts]
        assert "".join([first, *rest]) == "abcdefghi"
        final = await stream.get_final_message()
        assert final.usage.output_tokens == OUTPUT_TOKENS
        (entry,) = await rig.logged()
    assert (entry.input_tokens, entry.output_tokens) == (INPUT_TOKENS, OUTPUT_TOKENS)
    assert entry.cost == pytest.approx((INPUT_TOKENS * 3.0 + OUTPUT_TOKENS * 15.0) / 1000)
    assert entry.provider == "anthropic"


async def test_an_overloaded_upstream_is_not_counted(rig: Rig) -> None:
    rig.upstream.fail_next(529, 3, retry_after=0.01)
    async with client(rig) as sdk:
        assert await ask(sdk.with_options(max_retries=3)) == "pong"
        for _ in range(4):
            await ask(sdk)
        with pytest.raises(anthropic.RateLimitError):
            await ask(sdk)
    assert len(rig.upstream.calls(MESSAGES)) == 8


async def test_issue9_the_sdk_reads_error_code_and_sends_a_refused_call_once(rig: Rig) -> None:
    async with client(rig) as sdk:
        for _ in range(5):
            await ask(sdk)
        with pytest.raises(anthropic.RateLimitError) as first:
            await ask(sdk)
        with pytest.raises(anthropic.RateLimitError) as retried:
            await ask(sdk)
    # The SDK's default max_retries=2 resent neither refusal.
    assert rig.served == ["/anthropic/v1/messages"] * 7
    assert first.value.error_code == "loop_detected"
    assert retried.value.error_code == "loop_detected"  # a quick retry keeps the first code
    assert first.value.response.headers["x-should-retry"] == "false"
