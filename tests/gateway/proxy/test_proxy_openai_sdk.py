"""The proxy with the real `openai` SDK in front and a fake provider behind (issue 6)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import aiohttp
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.fakes.llm_upstream import INPUT_TOKENS, OUTPUT_TOKENS, FakeLLM
from tests.gateway.proxy.proxy_helpers import (
    MODEL,
    OTHER_KEY,
    PROXY_KEY,
    UPSTREAM_KEY,
    Rig,
    running_proxy,
)

COMPLETIONS = "/v1/chat/completions"
TEXT = "Check order 12345 at 10:00"
QUESTION: list[ChatCompletionMessageParam] = [{"role": "user", "content": TEXT}]


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    async with running_proxy() as running:
        yield running


def client(rig: Rig, session: str | None = "run-1", key: str = PROXY_KEY) -> openai.AsyncOpenAI:
    """The official SDK as an agent would use it: default retries, a session header."""
    headers = {"X-Loopwarden-Session": session} if session else {}
    return openai.AsyncOpenAI(base_url=f"{rig.url}/openai/v1", api_key=key, default_headers=headers)


async def ask(sdk: openai.AsyncOpenAI, content: str = TEXT) -> str | None:
    answer = await sdk.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": content}]
    )
    return answer.choices[0].message.content


async def test_issue6_a_looping_client_gets_five_calls_then_loop_detected(rig: Rig) -> None:
    async with client(rig) as sdk:
        for _ in range(5):
            assert await ask(sdk) == "pong"
        with pytest.raises(openai.RateLimitError) as caught:
            await ask(sdk)
    assert len(rig.upstream.calls(COMPLETIONS)) == 5
    # max_retries=2 by default, yet the refusal was not retried: six calls, six requests.
    assert rig.served == ["/openai/v1/chat/completions"] * 6
    error = caught.value
    assert error.code == "loop_detected"
    assert error.response.headers["x-should-retry"] == "false"
    assert error.response.headers["Retry-After"] == "300"
    assert error.response.headers["x-loopwarden-code"] == "loop_detected"
    assert "billing-bot" in error.message
    assert "run-1" in error.message


async def test_issue6_the_paused_session_refuses_other_calls_while_others_go_on(rig: Rig) -> None:
    async with client(rig) as looping, client(rig, "run-2") as other_session:
        for _ in range(5):
            await ask(looping)
        with pytest.raises(openai.RateLimitError):
            await ask(looping)
        with pytest.raises(openai.RateLimitError) as paused:
            await ask(looping, "A different question entirely")
        assert paused.value.code == "loop_paused"
        assert int(paused.value.response.headers["Retry-After"]) <= 300
        assert await ask(other_session) == "pong"
    async with client(rig, "run-1", OTHER_KEY) as other_key:
        assert await ask(other_key) == "pong"
    assert len(rig.upstream.calls(COMPLETIONS)) == 7


async def test_without_a_session_the_circuit_is_the_whole_key(rig: Rig) -> None:
    async with client(rig, session=None) as sdk:
        for _ in range(5):
            await ask(sdk)
        with pytest.raises(openai.RateLimitError) as caught:
            await ask(sdk)
    assert "session none" in caught.value.message
    assert [p.circuit for p in await rig.store.paused()] == ["billing-bot"]


@pytest.mark.parametrize("key", ["lw-wrong-key", ""])
async def test_issue6_an_unknown_or_missing_key_gets_401(rig: Rig, key: str) -> None:
    async with client(rig, key=key or "placeholder") as sdk:
        keyless = sdk.with_options(default_headers={"Authorization": ""}) if not key else sdk
        with pytest.raises(openai.AuthenticationError) as caught:
            await ask(keyless)
    assert caught.value.code == "invalid_api_key"
    assert rig.upstream.requests == []
    assert rig.served == ["/openai/v1/chat/completions"]


async def test_issue6_the_upstream_gets_its_own_key_never_the_proxy_key(rig: Rig) -> None:
    async with client(rig) as sdk:
        await ask(sdk)
    sent = rig.upstream.requests[0]
    headers = {name.lower(): value for name, value in sent.headers.items()}
    assert headers["authorization"] == f"Bearer {UPSTREAM_KEY}"
    assert PROXY_KEY not in str(sent.headers)
    assert not any(name.startswith("x-loopwarden") for name in headers)


async def test_issue6_the_upstream_key_is_never_returned_nor_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    async with running_proxy(upstream=FakeLLM(echo_auth=True)) as rig, client(rig) as sdk:
        raw = await sdk.chat.completions.with_raw_response.create(model=MODEL, messages=QUESTION)
        body = raw.http_response.text
        async with aiohttp.ClientSession() as http:
            headers = {"Authorization": f"Bearer {PROXY_KEY}"}
            streaming = {"model": MODEL, "messages": QUESTION, "stream": True}
            url = f"{rig.url}/openai/v1/chat/completions"
            async with http.post(url, json=streaming, headers=headers) as stream:
                streamed = (await stream.read()).decode()
            async with http.get(f"{rig.url}/openai/v1/models", headers=headers) as listing:
                assert listing.status == 200
                models_headers = dict(listing.headers)
    assert UPSTREAM_KEY not in body
    assert "*" * len(UPSTREAM_KEY) in body  # masked in place, same length
    assert UPSTREAM_KEY not in streamed
    assert f": echo Bearer {'*' * len(UPSTREAM_KEY)}" in streamed
    assert "x-echo-auth" not in {name.lower() for name in raw.headers}
    assert UPSTREAM_KEY not in str(models_headers)
    assert caplog.records
    assert all(UPSTREAM_KEY not in record.getMessage() for record in caplog.records)
    assert all(PROXY_KEY not in record.getMessage() for record in caplog.records)


async def test_issue6_streaming_passes_through_unbuffered() -> None:
    gate = asyncio.Event()
    async with running_proxy(upstream=FakeLLM(gate=gate, reply="abcdefghi")) as rig:
        async with client(rig) as sdk:
            stream = await sdk.chat.completions.create(
                model=MODEL,
                messages=QUESTION,
                stream=True,
                stream_options={"include_usage": True},
            )
            chunks = aiter(stream)
            first = await asyncio.wait_for(anext(chunks), timeout=10)
            # The upstream still holds the rest back: the proxy relayed the first chunk alone.
            assert not gate.is_set()
            assert first.choices[0].delta.content == "abc"
            gate.set()
            rest = [chunk async for chunk in chunks]
        text = "".join(c.choices[0].delta.content or "" for c in [first, *rest] if c.choices)
        assert text == "abcdefghi"
        assert rest[-1].usage is not None
        (entry,) = await rig.logged()
    assert (entry.input_tokens, entry.output_tokens, entry.estimated) == (
        INPUT_TOKENS,
        OUTPUT_TOKENS,
        False,
    )


async def test_streamed_bytes_are_relayed_unchanged(rig: Rig) -> None:
    body = {"model": MODEL, "messages": QUESTION, "stream": True}
    async with aiohttp.ClientSession() as http:
        headers = {"Authorization": f"Bearer {PROXY_KEY}"}
        async with http.post(
            f"{rig.url}/openai/v1/chat/completions", json=body, headers=headers
        ) as via_proxy:
            proxied = await via_proxy.read()
            assert via_proxy.headers["Content-Type"] == "text/event-stream"
        async with http.post(f"{rig.upstream.url}{COMPLETIONS}", json=body) as direct:
            assert proxied == await direct.read()


@pytest.mark.parametrize("status", [429, 500, 503])
async def test_issue6_upstream_failures_are_passed_on_and_not_counted(
    rig: Rig, status: int
) -> None:
    rig.upstream.fail_next(status, 4, retry_after=0.01)
    async with client(rig) as sdk:
        failing = sdk.with_options(max_retries=0)
        for _ in range(4):
            with pytest.raises(openai.APIStatusError) as caught:
                await ask(failing)
            assert caught.value.status_code == status
            assert caught.value.message.startswith("Error code")
        for _ in range(5):
            assert await ask(sdk) == "pong"
        with pytest.raises(openai.RateLimitError) as refused:
            await ask(sdk)
    assert refused.value.code == "loop_detected"
    outcomes = [entry.outcome for entry in await rig.logged()]
    assert outcomes == ["upstream_error"] * 4 + ["forwarded"] * 5 + ["loop_detected"]


async def test_issue6_sdk_retries_of_upstream_failures_are_not_repeats(rig: Rig) -> None:
    rig.upstream.fail_next(503, 2, retry_after=0.01)
    async with client(rig) as sdk:
        assert await ask(sdk) == "pong"  # two retries by the SDK, then an answer
        for _ in range(4):
            await ask(sdk)
        with pytest.raises(openai.RateLimitError):
            await ask(sdk)
    retries = [entry.retry for entry in await rig.logged()][:3]
    assert retries == [0, 1, 2]


async def test_issue6_a_dropped_connection_is_a_502_and_not_counted(rig: Rig) -> None:
    rig.upstream.drop_next(3)
    async with client(rig) as sdk:
        failing = sdk.with_options(max_retries=0)
        for _ in range(3):
            with pytest.raises(openai.InternalServerError) as caught:
                await ask(failing)
            assert caught.value.status_code == 502
            assert caught.value.code == "upstream_unreachable"
        for _ in range(5):
            await ask(sdk)
    assert not await rig.store.paused()


async def test_a_stream_the_upstream_drops_is_cut_off_and_not_counted(rig: Rig) -> None:
    rig.upstream.break_next_stream()
    async with client(rig) as sdk:
        stream = await sdk.chat.completions.create(model=MODEL, messages=QUESTION, stream=True)
        with pytest.raises(openai.APIError):
            _ = [chunk async for chunk in stream]
        for _ in range(5):
            await ask(sdk)
    entries = await rig.logged()
    assert [e.outcome for e in entries] == ["upstream_error"] + ["forwarded"] * 5
    assert not await rig.store.paused()


async def test_other_paths_are_forwarded_as_they_are(rig: Rig) -> None:
    async with client(rig) as sdk:
        models = await sdk.models.list()
        for _ in range(8):
            await sdk.models.list()
    assert [m.id async for m in models] == [MODEL]
    assert len(rig.upstream.calls("/v1/models")) == 9
    assert await rig.logged() == []


async def test_issue6_the_request_log_has_tokens_cost_and_blocked_estimates(rig: Rig) -> None:
    async with client(rig) as sdk:
        for _ in range(5):
            await ask(sdk)
        with pytest.raises(openai.RateLimitError):
            await ask(sdk)
    entries = await rig.logged()
    forwarded, refused = entries[0], entries[-1]
    assert (forwarded.agent, forwarded.session, forwarded.model) == ("billing-bot", "run-1", MODEL)
    assert forwarded.circuit == "billing-bot/session=run-1"
    assert (forwarded.outcome, forwarded.status, forwarded.estimated) == ("forwarded", 200, False)
    assert (forwarded.input_tokens, forwarded.output_tokens) == (INPUT_TOKENS, OUTPUT_TOKENS)
    assert forwarded.cost == pytest.approx((INPUT_TOKENS * 1.0 + OUTPUT_TOKENS * 2.0) / 1000)
    assert (refused.outcome, refused.status, refused.estimated) == ("loop_detected", None, True)
    assert refused.output_tokens == OUTPUT_TOKENS  # this model's average so far
    assert refused.input_tokens is not None
    assert refused.input_tokens > 0
    assert refused.cost is not None
    assert refused.cost > 0
    assert dict(refused.fields) == {"session": "run-1", "agent": "billing-bot", "model": MODEL}


async def test_issue6_an_upstream_timeout_is_a_504_and_not_counted() -> None:
    async with running_proxy("read_timeout: 0.2") as rig:
        rig.upstream.stall_next(2)
        async with client(rig) as sdk:
            failing = sdk.with_options(max_retries=0)
            for _ in range(2):
                with pytest.raises(openai.APIStatusError) as caught:
                    await ask(failing)
                assert caught.value.status_code == 504
                assert caught.value.code == "upstream_timeout"
            for _ in range(5):
                assert await ask(sdk) == "pong"
        outcomes = [(e.outcome, e.status) for e in await rig.logged()]
    assert outcomes == [("upstream_error", None)] * 2 + [("forwarded", 200)] * 5


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


async def test_issue9_a_quick_retry_of_a_refused_call_keeps_loop_detected() -> None:
    clock = Clock()
    async with running_proxy(clock=clock) as rig, client(rig) as sdk:
        for _ in range(5):
            await ask(sdk)
        with pytest.raises(openai.RateLimitError) as first:
            await ask(sdk)
        clock.now += 9
        with pytest.raises(openai.RateLimitError) as retried:
            await ask(sdk)  # the client's own retry, e.g. litellm's num_retries
        clock.now += 2
        with pytest.raises(openai.RateLimitError) as later:
            await ask(sdk)
        await rig.proxy.settle()
    # Every refused call reached the proxy once: the SDK's max_retries=2 did not resend.
    assert rig.served == ["/openai/v1/chat/completions"] * 8
    assert first.value.code == retried.value.code == "loop_detected"
    assert retried.value.message == first.value.message
    assert retried.value.response.headers["x-loopwarden-code"] == "loop_detected"
    assert later.value.code == "loop_paused"
    assert len(rig.alerts.alerts) == 1
