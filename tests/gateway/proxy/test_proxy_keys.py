"""The upstream key never reaches a client: status line, compressed bodies, encodings (issue 9)."""

from __future__ import annotations

import base64
import json
from dataclasses import replace
from urllib.parse import quote

import aiohttp
import pytest

from gateway.proxy.alerts import Alerter
from gateway.proxy.app import ProxyServer
from tests.fakes.llm_upstream import INPUT_TOKENS, FakeLLM, text_response
from tests.gateway.proxy.proxy_helpers import (
    MODEL,
    PROXY_KEY,
    UPSTREAM_KEY,
    proxy_config,
    running_proxy,
)

# A key with the characters that escaping and encoding change.
ODD_KEY = "sk-up/stream+5ecret=0123/456789abcdef"
COMPLETIONS = "/openai/v1/chat/completions"
HEADERS = {"Authorization": f"Bearer {PROXY_KEY}", "X-Loopwarden-Session": "keys"}
QUESTION = [{"role": "user", "content": "Check order 12345"}]


def leaks(text: str, key: str) -> list[str]:
    """The spellings of `key` (as the fake echoes `Bearer <key>`) found in `text`."""
    bearer = f"Bearer {key}".encode()
    plain_b64 = base64.b64encode(bearer).decode()
    url_b64 = base64.urlsafe_b64encode(b"x" + bearer).decode()
    forms = {
        "plain": key,
        "slash-escaped": key.replace("/", "\\/"),
        "percent": quote(key, safe=""),
        # The middle of each base64 text encodes key bytes only.
        "base64": plain_b64[12:-4],
        "base64url": url_b64[12:-4],
    }
    return [name for name, form in forms.items() if form in text]


async def test_issue9_the_reason_phrase_is_the_standard_one_never_the_upstreams() -> None:
    async with running_proxy() as rig, aiohttp.ClientSession() as http:
        rig.upstream.fail_next(401, reason=f"Bad key {UPSTREAM_KEY}")
        body = {"model": MODEL, "messages": QUESTION}
        async with http.post(f"{rig.url}{COMPLETIONS}", json=body, headers=HEADERS) as answer:
            assert answer.status == 401
            assert answer.reason == "Unauthorized"
            text = await answer.text()
    assert UPSTREAM_KEY not in text


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
@pytest.mark.parametrize("stream", [False, True])
async def test_issue9_a_compressed_body_is_decoded_then_masked(encoding: str, stream: bool) -> None:
    upstream = FakeLLM(echo_auth=True, encoding=encoding)
    async with running_proxy(upstream=upstream) as rig, aiohttp.ClientSession() as http:
        body = {"model": MODEL, "messages": QUESTION, "stream": stream}
        async with http.post(f"{rig.url}{COMPLETIONS}", json=body, headers=HEADERS) as answer:
            assert answer.status == 200
            assert "Content-Encoding" not in answer.headers
            text = await answer.text()
        (entry,) = await rig.logged()
    assert leaks(text, UPSTREAM_KEY) == []
    assert "*" * len(UPSTREAM_KEY) in text
    if not stream:
        assert json.loads(text)["usage"]["prompt_tokens"] == INPUT_TOKENS
        assert (entry.input_tokens, entry.estimated) == (INPUT_TOKENS, False)


@pytest.mark.parametrize("encoding", ["br", "zstd", "gzip, br", "compress"])
async def test_issue9_a_body_the_proxy_cannot_decode_is_never_relayed(encoding: str) -> None:
    upstream = FakeLLM(echo_auth=True, encoding=encoding)
    async with (
        running_proxy(upstream=upstream) as rig,
        aiohttp.ClientSession(auto_decompress=False) as http,
    ):
        body = {"model": MODEL, "messages": QUESTION}
        async with http.post(f"{rig.url}{COMPLETIONS}", json=body, headers=HEADERS) as answer:
            assert answer.status == 502
            assert answer.headers["x-should-retry"] == "false"
            error = json.loads(await answer.read())["error"]
        (entry,) = await rig.logged()
    assert error["code"] == "upstream_unreadable"
    assert encoding in error["message"]
    assert UPSTREAM_KEY not in json.dumps(error)
    assert entry.outcome == "upstream_error"


@pytest.mark.parametrize("stream", [False, True])
async def test_issue9_escaped_percent_and_base64_forms_are_masked(stream: bool) -> None:
    upstream = FakeLLM(echo_auth=True, echo_encoded=True)
    async with (
        running_proxy(upstream=upstream, upstream_key=ODD_KEY) as rig,
        aiohttp.ClientSession() as http,
    ):
        body = {"model": MODEL, "messages": QUESTION, "stream": stream}
        async with http.post(f"{rig.url}{COMPLETIONS}", json=body, headers=HEADERS) as answer:
            assert answer.status == 200
            text = await answer.text()
            headers = dict(answer.headers)
        async with http.get(f"{rig.url}/openai/v1/models", headers=HEADERS) as listing:
            listing_headers = dict(listing.headers)
            listing_text = await listing.text()
        direct_headers = {"Authorization": f"Bearer {ODD_KEY}"}
        url = f"{rig.upstream.url}/v1/chat/completions"
        async with http.post(url, json=body, headers=direct_headers) as direct:
            echoed = await direct.text() + json.dumps(dict(direct.headers))
    # Straight from the fake, every form is there (JSON escapes only outside streams).
    escaped = set() if stream else {"slash-escaped"}
    assert set(leaks(echoed, ODD_KEY)) == {"plain", "percent", "base64", "base64url", *escaped}
    assert leaks(text, ODD_KEY) == []
    assert leaks(listing_text, ODD_KEY) == []
    assert leaks(json.dumps(headers), ODD_KEY) == []
    assert not [name for name in {**headers, **listing_headers} if name.startswith("x-echo")]


async def test_a_cookie_an_upstream_sets_never_rides_on_a_later_call() -> None:
    # One upstream session serves every client: what one answer sets must not reach
    # the upstream again on anyone's next call (Cloudflare's __cf_bm, say). By name, not
    # by IP: a cookie jar keeps no cookie for a bare IP address.
    async with FakeLLM() as fake, aiohttp.ClientSession() as http:
        named = fake.url.replace("127.0.0.1", "localhost")
        proxy = ProxyServer(proxy_config(named), alerter=Alerter([]))
        await proxy.start()
        try:
            answered = text_response("hello")
            cookie = {"Set-Cookie": "__cf_bm=tenant-a-secret; Path=/"}
            fake.enqueue(replace(answered, headers=cookie))
            for text in ("first", "second"):
                body = {"model": MODEL, "messages": [{"role": "user", "content": text}]}
                url = f"http://127.0.0.1:{proxy.port}{COMPLETIONS}"
                async with http.post(url, json=body, headers=HEADERS) as answer:
                    assert answer.status == 200
        finally:
            await proxy.stop()
    [first, second] = fake.calls("/v1/chat/completions")
    assert "Cookie" not in first.headers
    assert "Cookie" not in second.headers
