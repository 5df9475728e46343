"""Answers relayed whole or streamed (issue 10): masking, the bound, breaks and hang-ups.

A real proxy in front of small upstreams of the tests' own, on loopback: one answers a
body it is given once a gate opens (or writes part of it, waits, then the rest), one
breaks off a body after its headers.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import aiohttp
import pytest
from aiohttp import web

from gateway.proxy.alerts import Alerter
from gateway.proxy.app import ProxyServer
from gateway.proxy.relay import WHOLE_BODY_MAX, masked_forms
from tests.fakes.loopback import LOOPBACK_HOST, serve_loopback
from tests.gateway.proxy.proxy_helpers import MODEL, PROXY_KEY, UPSTREAM_KEY, proxy_config

COMPLETIONS = "/openai/v1/chat/completions"
HEADERS = {"Authorization": f"Bearer {PROXY_KEY}", "X-Loopwarden-Session": "whole"}
REQUEST = {"model": MODEL, "messages": [{"role": "user", "content": "Sum invoice 12345"}]}
USAGE = {"prompt_tokens": 21, "completion_tokens": 13}


def completion(content: str) -> bytes:
    """A chat completion with `content` as its answer and `USAGE`."""
    message = {"role": "assistant", "content": content}
    answer = {"id": "chatcmpl-1", "choices": [{"index": 0, "message": message}], "usage": USAGE}
    return json.dumps(answer).encode()


@dataclass
class HeldUpstream:
    """Answers each chat completion with `body` (Content-Length set) once `gate` is set.

    `split` > 0: the first `split` bytes go out at once, the rest once the gate opens.
    """

    body: bytes
    split: int = 0
    gate: asyncio.Event = field(default_factory=asyncio.Event)
    received: asyncio.Event = field(default_factory=asyncio.Event)

    async def answer(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        self.received.set()
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.content_length = len(self.body)
        if not self.split:
            await self.gate.wait()
        await response.prepare(request)
        await response.write(self.body[: self.split])
        await self.gate.wait()
        await response.write(self.body[self.split :])
        await response.write_eof()
        return response


@asynccontextmanager
async def proxy_before(upstream_url: str) -> AsyncIterator[ProxyServer]:
    """A started proxy whose upstreams are at `upstream_url`; stopped after."""
    proxy = ProxyServer(proxy_config(upstream_url), alerter=Alerter([]))
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.stop()


@asynccontextmanager
async def held(upstream: HeldUpstream) -> AsyncIterator[ProxyServer]:
    """The proxy in front of a `HeldUpstream`."""
    app = web.Application()
    app.router.add_post("/v1/chat/completions", upstream.answer)
    runner = web.AppRunner(app)
    port = await serve_loopback(runner)
    try:
        async with proxy_before(f"http://{LOOPBACK_HOST}:{port}") as proxy:
            yield proxy
    finally:
        await runner.cleanup()


def every_form(key: str) -> str:
    """Each spelling of `key` the proxy masks, side by side and between words."""
    return " and ".join(masked_forms(key)) + "".join(masked_forms(key))


async def logged(proxy: ProxyServer) -> list[tuple[str, int | None, int | None, bool]]:
    """(outcome, input tokens, output tokens, estimated) of each logged call."""
    await proxy.settle()
    entries = await proxy.store.calls_since(3_600.0)
    return [(e.outcome, e.input_tokens, e.output_tokens, e.estimated) for e in entries]


async def test_issue10_a_small_answer_is_relayed_whole_with_every_key_form_masked() -> None:
    # The key's forms open the body, sit side by side in it, and close it.
    forms = every_form(UPSTREAM_KEY)
    body = forms.encode() + completion(forms) + forms.encode()
    upstream = HeldUpstream(body)
    upstream.gate.set()
    async with held(upstream) as proxy, aiohttp.ClientSession() as http:
        url = f"http://127.0.0.1:{proxy.port}{COMPLETIONS}"
        async with http.post(url, json=REQUEST, headers=HEADERS) as answer:
            assert answer.status == 200
            assert answer.headers["Content-Length"] == str(len(body))
            assert "Transfer-Encoding" not in answer.headers
            relayed = await answer.read()
        assert len(relayed) == len(body)
        assert not [form for form in masked_forms(UPSTREAM_KEY) if form.encode() in relayed]
        # Only masked: every byte is the upstream's or an asterisk.
        assert all(sent in (kept, ord("*")) for sent, kept in zip(relayed, body, strict=True))
        # Not JSON with the forms around it: the usage is estimated, not read.
        assert [(outcome, estimated) for outcome, *_, estimated in await logged(proxy)] == [
            ("forwarded", True)
        ]


async def test_issue10_the_usage_of_an_answer_relayed_whole_is_charged() -> None:
    upstream = HeldUpstream(completion(f"your key is {UPSTREAM_KEY}"))
    upstream.gate.set()
    async with held(upstream) as proxy, aiohttp.ClientSession() as http:
        url = f"http://127.0.0.1:{proxy.port}{COMPLETIONS}"
        async with http.post(url, json=REQUEST, headers=HEADERS) as answer:
            relayed = json.loads(await answer.read())
        assert relayed["choices"][0]["message"]["content"] == "your key is " + "*" * len(
            UPSTREAM_KEY
        )
        assert await logged(proxy) == [("forwarded", 21, 13, False)]


async def test_issue10_an_answer_over_the_bound_is_still_streamed() -> None:
    # The key straddles the point where the upstream stops until the gate opens.
    head = completion("x" * (WHOLE_BODY_MAX + 4096) + UPSTREAM_KEY)
    split = head.index(UPSTREAM_KEY.encode()) + len(UPSTREAM_KEY) // 2
    upstream = HeldUpstream(head, split=split)
    async with held(upstream) as proxy, aiohttp.ClientSession() as http:
        url = f"http://127.0.0.1:{proxy.port}{COMPLETIONS}"
        async with http.post(url, json=REQUEST, headers=HEADERS) as answer:
            assert answer.headers["Content-Length"] == str(len(head))
            # Bytes arrive while the upstream still holds the rest: streamed, not held.
            first = await answer.content.readexactly(WHOLE_BODY_MAX)
            upstream.gate.set()
            relayed = first + await answer.read()
    assert len(relayed) == len(head)
    assert relayed == head.replace(UPSTREAM_KEY.encode(), b"*" * len(UPSTREAM_KEY))
    assert await logged(proxy) == [("forwarded", 21, 13, False)]


async def test_issue10_an_answer_the_upstream_breaks_off_cuts_the_client_off(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def break_off(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 500\r\n"
        writer.write(head + b"\r\n" + completion("cut")[:40])
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(break_off, LOOPBACK_HOST, 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with proxy_before(f"http://{LOOPBACK_HOST}:{port}") as proxy:
            async with aiohttp.ClientSession() as http:
                url = f"http://127.0.0.1:{proxy.port}{COMPLETIONS}"
                # Each is uncounted, so the same call again and again is never refused.
                for _ in range(5):
                    with pytest.raises(aiohttp.ClientError):
                        async with http.post(url, json=REQUEST, headers=HEADERS) as answer:
                            await answer.read()
            assert [outcome for outcome, *_ in await logged(proxy)] == ["upstream_error"] * 5
            assert not await proxy.store.paused()
        broke = [r for r in caplog.records if "broke off" in r.getMessage()]
        assert [r.levelno for r in broke] == [logging.WARNING] * 5
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    finally:
        server.close()
        await server.wait_closed()


async def test_issue10_a_client_hanging_up_before_a_whole_answer_is_one_info_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    upstream = HeldUpstream(completion("late"))
    async with held(upstream) as proxy:
        caplog.set_level(logging.INFO)
        data = json.dumps(REQUEST).encode()
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(
            f"POST {COMPLETIONS} HTTP/1.1\r\nHost: proxy\r\n".encode()
            + f"Authorization: Bearer {PROXY_KEY}\r\nContent-Type: application/json\r\n".encode()
            + f"Content-Length: {len(data)}\r\n\r\n".encode()
            + data
        )
        await writer.drain()
        await upstream.received.wait()
        writer.transport.abort()
        upstream.gate.set()
        for _ in range(100):
            if any("disconnected" in r.getMessage() for r in caplog.records):
                break
            await asyncio.sleep(0.02)
        # The call reached the provider: logged with the usage it reported, so charged.
        assert await logged(proxy) == [("forwarded", 21, 13, False)]
    lines = [r for r in caplog.records if "disconnected" in r.getMessage()]
    assert [(r.levelno, r.getMessage()) for r in lines] == [
        (logging.INFO, "openai client disconnected during the response on billing-bot")
    ]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
