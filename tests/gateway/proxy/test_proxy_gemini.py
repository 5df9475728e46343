"""The proxy's Gemini routes with a raw aiohttp client and the fake provider (issue 6)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import aiohttp
import pytest

from gateway.proxy.pricing import catalogue_price
from tests.fakes.llm_upstream import INPUT_TOKENS, OUTPUT_TOKENS, FakeLLM
from tests.gateway.proxy.proxy_helpers import PROXY_KEY, UPSTREAM_KEY, Rig, running_proxy

MODEL = "gemini-2.0-flash"
GENERATE = f"/gemini/v1beta/models/{MODEL}:generateContent"
STREAM = f"/gemini/v1beta/models/{MODEL}:streamGenerateContent"
GOOGLE_RETRIED = {408, 429, 500, 502, 503, 504}
BODY = {"contents": [{"role": "user", "parts": [{"text": "Check order 12345 at 10:00"}]}]}


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    async with running_proxy() as running:
        yield running


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


def headers(session: str = "crawl-1") -> dict[str, str]:
    return {"x-goog-api-key": PROXY_KEY, "X-Loopwarden-Session": session}


async def test_generate_content_is_forwarded_with_the_upstream_key(
    rig: Rig, http: aiohttp.ClientSession
) -> None:
    async with http.post(f"{rig.url}{GENERATE}", json=BODY, headers=headers()) as response:
        assert response.status == 200
        answer = await response.json()
    assert answer["candidates"][0]["content"]["parts"][0]["text"] == "pong"
    (sent,) = rig.upstream.requests
    assert sent.path == f"/v1beta/models/{MODEL}:generateContent"
    assert {k.lower(): v for k, v in sent.headers.items()}["x-goog-api-key"] == UPSTREAM_KEY
    (entry,) = await rig.logged()
    assert (entry.provider, entry.model, entry.session) == ("gemini", MODEL, "crawl-1")
    assert (entry.input_tokens, entry.output_tokens) == (INPUT_TOKENS, OUTPUT_TOKENS)
    # No price in the test config: genai-prices has Google's (issue 14).
    price = catalogue_price("gemini", MODEL)
    assert price is not None
    expected = (INPUT_TOKENS * price.input_per_1k + OUTPUT_TOKENS * price.output_per_1k) / 1000
    assert entry.cost == pytest.approx(expected)


async def test_a_key_in_the_query_string_works_and_is_never_forwarded(
    rig: Rig, http: aiohttp.ClientSession
) -> None:
    url = f"{rig.url}{GENERATE}?key={PROXY_KEY}&alt=json"
    async with http.post(url, json=BODY) as response:
        assert response.status == 200
    (sent,) = rig.upstream.requests
    assert dict(sent.query) == {"alt": "json"}
    assert PROXY_KEY not in json.dumps(sent.headers)


async def test_issue9_a_loop_gets_400_failed_precondition_outside_googles_retry_list(
    rig: Rig, http: aiohttp.ClientSession
) -> None:
    for _ in range(5):
        async with http.post(f"{rig.url}{GENERATE}", json=BODY, headers=headers()) as response:
            assert response.status == 200
    async with http.post(f"{rig.url}{GENERATE}", json=BODY, headers=headers()) as response:
        # google-genai's retry options retry 408, 429, 500, 502, 503 and 504.
        assert response.status not in GOOGLE_RETRIED
        assert response.status == 400
        assert response.headers["x-should-retry"] == "false"
        assert response.headers["x-loopwarden-code"] == "loop_detected"
        assert response.headers["Retry-After"] == "300"
        error = (await response.json())["error"]
    assert (error["code"], error["status"]) == (400, "FAILED_PRECONDITION")
    assert error["details"][0]["reason"] == "LOOP_DETECTED"
    assert error["details"][0]["metadata"] == {"code": "loop_detected"}
    assert "billing-bot" in error["message"]
    assert "crawl-1" in error["message"]
    assert len(rig.upstream.requests) == 5


async def test_issue6_an_unknown_key_gets_401_unauthenticated(
    rig: Rig, http: aiohttp.ClientSession
) -> None:
    async with http.post(f"{rig.url}{GENERATE}?key=nope", json=BODY) as response:
        assert response.status == 401
        error = (await response.json())["error"]
    assert error["status"] == "UNAUTHENTICATED"
    async with http.post(f"{rig.url}{GENERATE}", json=BODY) as response:
        assert response.status == 401
    assert rig.upstream.requests == []


async def test_issue6_streamed_sse_passes_through_unbuffered(http: aiohttp.ClientSession) -> None:
    gate = asyncio.Event()
    async with running_proxy(upstream=FakeLLM(gate=gate, reply="abcdefghi")) as rig:
        url = f"{rig.url}{STREAM}?alt=sse"
        async with http.post(url, json=BODY, headers=headers()) as response:
            assert response.headers["Content-Type"] == "text/event-stream"
            first = await asyncio.wait_for(response.content.readuntil(b"\r\n\r\n"), timeout=10)
            assert not gate.is_set()
            assert json.loads(first[len(b"data: ") :])["candidates"][0]["content"]["parts"] == [
                {"text": "abc"}
            ]
            gate.set()
            rest = await response.read()
        assert rest.count(b"data: ") == 2
        (entry,) = await rig.logged()
        assert entry.output_tokens == OUTPUT_TOKENS


async def test_a_streamed_json_array_reports_its_usage(
    rig: Rig, http: aiohttp.ClientSession
) -> None:
    async with http.post(f"{rig.url}{STREAM}", json=BODY, headers=headers()) as response:
        chunks = await response.json()
    assert len(chunks) == 2
    (entry,) = await rig.logged()
    assert (entry.output_tokens, entry.estimated) == (OUTPUT_TOKENS, False)


async def test_model_listing_is_forwarded_unguarded(rig: Rig, http: aiohttp.ClientSession) -> None:
    async with http.get(f"{rig.url}/gemini/v1beta/models", headers=headers()) as response:
        assert response.status == 200
        assert (await response.json())["models"][0]["name"] == "models/gemini-2.0-flash"
    assert [r.path for r in rig.upstream.requests] == ["/v1beta/models"]
    assert await rig.logged() == []
