"""Two proxy replicas on one Redis share circuits, pauses and the request log (issue 6)."""

from __future__ import annotations

import asyncio
import io
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path

import openai
import pytest

from gateway.cli.main import main
from gateway.config import parse_config
from gateway.proxy.alerts import Alerter
from gateway.proxy.app import ProxyServer
from tests.fakes.llm_upstream import FakeLLM
from tests.gateway.proxy.proxy_helpers import MODEL, PROXY_KEY, RecordingChannel, proxy_yaml

pytestmark = pytest.mark.redis


async def ask(port: int, text: str = "Is the export done?") -> None:
    async with openai.AsyncOpenAI(
        base_url=f"http://127.0.0.1:{port}/openai/v1",
        api_key=PROXY_KEY,
        default_headers={"X-Loopwarden-Session": "batch-3"},
    ) as sdk:
        await sdk.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": text}])


@pytest.fixture
async def replicas(
    redis_url: str, tmp_path: Path
) -> AsyncIterator[tuple[list[ProxyServer], FakeLLM, Path, list[RecordingChannel]]]:
    async with AsyncExitStack() as stack:
        upstream = await stack.enter_async_context(FakeLLM())
        text = proxy_yaml(upstream.url, state=f"{{backend: redis, url: '{redis_url}'}}")
        path = tmp_path / "loopwarden.yaml"
        path.write_text(text, encoding="utf-8")
        servers: list[ProxyServer] = []
        channels: list[RecordingChannel] = []
        for _ in range(2):
            channel = RecordingChannel()
            server = ProxyServer(parse_config(text, env={}), alerter=Alerter([channel]))
            await server.start()
            stack.push_async_callback(server.stop)
            servers.append(server)
            channels.append(channel)
        yield servers, upstream, path, channels


async def test_issue6_replicas_share_one_circuit(
    replicas: tuple[list[ProxyServer], FakeLLM, Path, list[RecordingChannel]],
) -> None:
    servers, upstream, path, channels = replicas
    for n in range(5):
        await ask(servers[n % 2].port)
    with pytest.raises(openai.RateLimitError) as caught:
        await ask(servers[1].port)
    assert caught.value.code == "loop_detected"
    with pytest.raises(openai.RateLimitError) as paused:
        await ask(servers[0].port, "A different question")
    assert paused.value.code == "loop_paused"
    assert len(upstream.requests) == 5
    for server in servers:
        await server.settle()
    assert [len(c.alerts) for c in channels] == [0, 1]  # one alert, from the replica that paused

    out = io.StringIO()

    def cli(*argv: str) -> int:
        saved, sys.stdout = sys.stdout, out
        try:
            return main([*argv, "--config", str(path)])
        finally:
            sys.stdout = saved

    assert await asyncio.to_thread(cli, "circuits", "list") == 0
    assert "billing-bot/session=batch-3" in out.getvalue()
    assert await asyncio.to_thread(cli, "circuits", "reopen", "billing-bot/session=batch-3") == 0
    await ask(servers[0].port)
    await servers[0].settle()  # the log is written in batches, after the response
    entries = await servers[1].store.calls_since(3_600)
    assert [e.outcome for e in entries] == ["forwarded"] * 5 + [
        "loop_detected",
        "loop_paused",
        "forwarded",
    ]
