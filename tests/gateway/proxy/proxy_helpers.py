"""A running proxy in front of the fake LLM provider, with a count of requests it served."""

from __future__ import annotations

import asyncio
import textwrap
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from aiohttp import web

from gateway.calls.entry import CallLogEntry
from gateway.calls.store import CallStore
from gateway.config import Config, parse_config
from gateway.proxy.alerts import Alert, Alerter
from gateway.proxy.app import ProxyServer
from tests.fakes.llm_upstream import FakeLLM

PROXY_KEY = "lw-demo-key"
OTHER_KEY = "lw-support-key"
UPSTREAM_KEY = "sk-upstream-5ecret-0123456789abcdef"
ADMIN_TOKEN = "lw-admin-7a8b9c0d1e2f"
MODEL = "gpt-4o-mini"


def proxy_yaml(
    upstream_url: str,
    extra: str = "",
    *,
    state: str = "{backend: memory}",
    port: int = 0,
    upstream_key: str = UPSTREAM_KEY,
    keys: str = "",
) -> str:
    """The YAML of a proxy config for the fake upstream; `extra` is more YAML under `proxy:`.

    `keys` is more entries of `proxy.keys` (one a line, `key: {agent: ...}`).
    """
    return f"""
state: {state}
proxy:
  host: 127.0.0.1
  port: {port}
  admin_token: {ADMIN_TOKEN}
  keys:
    {PROXY_KEY}: {{agent: billing-bot}}
    {OTHER_KEY}: {{agent: support-bot}}
{textwrap.indent(textwrap.dedent(keys), "    ")}
  upstreams:
    openai: {{base_url: '{upstream_url}/v1', api_key: '{upstream_key}'}}
    anthropic: {{base_url: '{upstream_url}', api_key: '{upstream_key}'}}
    gemini: {{base_url: '{upstream_url}', api_key: '{upstream_key}'}}
  prices:
    'gpt-4o*': {{input_per_1k: 1.0, output_per_1k: 2.0}}
    'claude-*': {{input_per_1k: 3.0, output_per_1k: 15.0}}
  drain_seconds: 2
{textwrap.indent(textwrap.dedent(extra), "  ")}
"""


def proxy_config(
    upstream_url: str,
    extra: str = "",
    *,
    state: str = "{backend: memory}",
    upstream_key: str = UPSTREAM_KEY,
    keys: str = "",
) -> Config:
    """The proxy config of `proxy_yaml`, parsed."""
    yaml = proxy_yaml(upstream_url, extra, state=state, upstream_key=upstream_key, keys=keys)
    return parse_config(yaml, env={})


class RecordingChannel:
    """An alert channel that keeps what it was given."""

    def __init__(self) -> None:
        self.alerts: list[Alert] = []

    @property
    def name(self) -> str:
        return "recording"

    async def deliver(self, alert: Alert, http: object) -> None:
        self.alerts.append(alert)


@dataclass
class Rig:
    """The proxy, the fake upstream behind it, and what reached the proxy."""

    proxy: ProxyServer
    upstream: FakeLLM
    alerts: RecordingChannel
    served: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.proxy.port}"

    @property
    def store(self) -> CallStore:
        return self.proxy.store

    async def logged(self) -> list[CallLogEntry]:
        """The request log, once the background writes are done."""
        await self.proxy.settle()
        return await self.store.calls_since(3_600.0)


@asynccontextmanager
async def running_proxy(
    extra: str = "",
    *,
    upstream: FakeLLM | None = None,
    state: str = "{backend: memory}",
    configured_alerts: bool = False,
    upstream_key: str = UPSTREAM_KEY,
    clock: Callable[[], float] = time.monotonic,
    keys: str = "",
) -> AsyncIterator[Rig]:
    """A started proxy before a started fake upstream; both stopped after.

    Alerts go to a recording channel, or with `configured_alerts` where `proxy.alerts` says.
    """
    async with upstream or FakeLLM() as fake:
        config = proxy_config(fake.url, extra, state=state, upstream_key=upstream_key, keys=keys)
        channel = RecordingChannel()
        alerter = None if configured_alerts else Alerter([channel])
        proxy = ProxyServer(config, alerter=alerter, clock=clock)
        rig = Rig(proxy, fake, channel)

        async def count(request: web.Request, response: web.StreamResponse) -> None:
            rig.served.append(request.path)

        proxy.app.on_response_prepare.append(count)
        await proxy.start()
        try:
            yield rig
        finally:
            await proxy.stop()


async def raw_request(port: int, path: str, headers: bytes, body: bytes = b"") -> tuple[int, bytes]:
    """One HTTP/1.1 request written byte for byte (headers no client would send); status, body."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" % (
        path.encode()
    )
    length = b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body)
    writer.write(head + headers + length + body)
    await writer.drain()
    answer = await reader.read()
    writer.close()
    await writer.wait_closed()
    status_line, _, rest = answer.partition(b"\r\n")
    return int(status_line.split()[1]), rest.partition(b"\r\n\r\n")[2]
