"""Helpers shared by the platform connector tests: bounded waits, a recording sink, the
gateway of a config file in-process, and `python -m gateway run` as a real subprocess.

Every wait here is bounded by `WAIT_SECONDS` (or a longer limit given by the caller), so a
broken test fails instead of hanging; a bound is never what makes a test pass. Ports are
always chosen by the OS (port 0) and learned afterwards, never fixed or probed in advance.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from gateway.app.connector import ConnectorServices
from gateway.app.runtime import Gateway
from gateway.app.types import InboundMessage
from gateway.config import load_config

ROOT = Path(__file__).resolve().parents[2]
WAIT_SECONDS = 10.0
"""The bound on a wait inside one process (generous: CI machines are small and busy)."""
PROCESS_SECONDS = 30.0
"""The bound on a subprocess starting up, and on it exiting after SIGTERM."""
_SERVING = re.compile(r"http server on [\d.]+:(\d+)")

BUDGET = 4
"""The end-to-end configs' pair budget: bot-to-bot exchanges per window before a cooldown."""
NOTICE = "Loop guard: pausing"
"""How the cooldown notice the gateway posts into a room starts."""
LONG_REPLY = " ".join(f"word{i:04d}" for i in range(700))
"""The scripted agent's answer to a message starting with "long": 6,299 characters."""

_E2E_CONFIG = """
state: {{backend: memory}}
http: {{host: 127.0.0.1, port: 0}}
agents:
  parrot:
    kind: scripted
    delay: {delay}
    rules:
      - {{match: "^quiet", reply: "NO_REPLY"}}
      - {{match: "^long", reply: "{long}"}}
    default: "echo: {{text}}"
bots:
{bots}
admins: {{{platform}: ["{admin}"]}}
policy:
  bot_loop: {{max_events_per_window: {budget}, window_seconds: 600, cooldown_seconds: 600}}
{extra}"""


def write_e2e_config(
    tmp_path: Path,
    *,
    platform: str,
    admin: str,
    bots: str,
    delay: float = 0.0,
    extra: str = "",
) -> Path:
    """The config file of an end-to-end test, with the agent `parrot` and port 0.

    `parrot` answers `quiet…` with NO_REPLY, `long…` with `LONG_REPLY` and anything else
    with `echo: {text}` (after `delay` seconds); `admin` is the platform's one admin, the
    pair budget is `BUDGET` per 10 minutes; `bots` is the YAML of the `bots:` list items and
    `extra` more top-level YAML (e.g. `channels:`).
    """
    text = _E2E_CONFIG.format(
        delay=delay,
        long=LONG_REPLY,
        bots=bots,
        platform=platform,
        admin=admin,
        budget=BUDGET,
        extra=extra,
    )
    path = tmp_path / "loopwarden.yaml"
    path.write_text(text, encoding="utf-8")
    return path


async def wait_for(predicate: Callable[[], bool], limit: float = WAIT_SECONDS) -> None:
    """Poll a condition (bounded) instead of sleeping for a fixed time."""
    async with asyncio.timeout(limit):
        while not predicate():  # noqa: ASYNC110 - the conditions live in fakes, not in events
            await asyncio.sleep(0.01)


@dataclass
class Inbox:
    """A sink that records what a connector handed over.

    `gate` holds every hand-over until set; `hold` holds the messages with a given text;
    `fail` makes the sink raise (a pipeline bug).
    """

    messages: list[InboundMessage] = field(default_factory=list)
    gate: asyncio.Event | None = None
    hold: dict[str, asyncio.Event] = field(default_factory=dict)
    fail: bool = False

    async def __call__(self, message: InboundMessage) -> None:
        self.messages.append(message)
        for gate in (self.gate, self.hold.get(message.text)):
            if gate is not None:
                await gate.wait()
        if self.fail:
            raise RuntimeError("pipeline exploded")

    def texts(self) -> list[str]:
        """The texts handed over, in order."""
        return [m.text for m in self.messages]

    async def next(self, count: int = 1) -> InboundMessage:
        """The `count`-th message handed over (1-based), once it has been."""
        await wait_for(lambda: len(self.messages) >= count)
        return self.messages[count - 1]


def services() -> ConnectorServices:
    """What the runtime lends a connector: a fresh aiohttp app, no peers, fresh metrics."""
    return ConnectorServices(http=web.Application())


@contextmanager
def refused_port() -> Iterator[int]:
    """A loopback port that refuses connections: bound (so nobody else takes it), not listening."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        port: int = held.getsockname()[1]
        yield port


@asynccontextmanager
async def running(path: Path) -> AsyncIterator[Gateway]:
    """The gateway of a config file, built, started and stopped as `loopwarden run` does."""
    config = load_config(path)
    gateway = Gateway(config)
    await gateway.start()
    try:
        await wait_for(lambda: gateway.ready)
        yield gateway
    finally:
        await gateway.stop(config.pipeline.drain_seconds)


class GatewayProcess:
    """`python -m gateway run --config FILE --log-level DEBUG`, its output read as it comes.

    Both pipes are drained all the time (a full pipe would block the gateway's logging);
    `port` is read from the gateway's own "http server on …" line, so the config can say
    `port: 0`.
    """

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self._process = process
        self._lines: list[str] = []
        self._port: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._readers = [
            asyncio.create_task(self._read(stream))
            for stream in (process.stdout, process.stderr)
            if stream is not None
        ]

    @property
    def output(self) -> str:
        """Everything the process printed so far, stdout and stderr."""
        return "".join(self._lines)

    @property
    def returncode(self) -> int | None:
        """The exit code, None while running."""
        return self._process.returncode

    async def _read(self, stream: asyncio.StreamReader) -> None:
        while line := (await stream.readline()).decode(errors="replace"):
            self._lines.append(line)
            found = _SERVING.search(line)
            if found and not self._port.done():
                self._port.set_result(int(found.group(1)))

    async def ready(self) -> int:
        """Wait until `/readyz` says every bot is connected; the HTTP port."""
        async with asyncio.timeout(PROCESS_SECONDS):
            exited = asyncio.ensure_future(self._process.wait())
            try:
                await asyncio.wait({self._port, exited}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                exited.cancel()
            if not self._port.done():
                raise AssertionError("the gateway exited before serving:\n" + self.output)
            port = self._port.result()
            async with aiohttp.ClientSession() as http:
                while not await _ready(http, port):
                    if self.returncode is not None:
                        raise AssertionError("the gateway exited early:\n" + self.output)
                    await asyncio.sleep(0.05)
        return port

    async def terminate(self) -> float:
        """SIGTERM, then wait (bounded) for the exit and the rest of the output; seconds taken."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        self._process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(PROCESS_SECONDS):
            await self._process.wait()
            taken = loop.time() - started
            await asyncio.gather(*self._readers)
        return taken

    async def kill(self) -> None:
        """Kill the process if it still runs and stop reading its output."""
        if self._process.returncode is None:
            self._process.kill()
            await self._process.wait()
        for reader in self._readers:
            reader.cancel()
        await asyncio.gather(*self._readers, return_exceptions=True)


async def _ready(http: aiohttp.ClientSession, port: int) -> bool:
    with suppress(aiohttp.ClientError):
        async with http.get(f"http://127.0.0.1:{port}/readyz") as response:
            return response.status == 200
    return False


@asynccontextmanager
async def gateway_process(config: Path) -> AsyncIterator[GatewayProcess]:
    """Run the gateway of `config` as a subprocess at DEBUG; killed at the end if still running."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gateway",
        "run",
        "--config",
        str(config),
        "--log-level",
        "DEBUG",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        cwd=ROOT,
    )
    gateway = GatewayProcess(process)
    try:
        yield gateway
    finally:
        await gateway.kill()


async def dropped_at_metrics(port: int, platform: str) -> dict[str, float]:
    """`events_dropped_total` of one platform, by reason, as the gateway's `/metrics` serves it."""
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://127.0.0.1:{port}/metrics") as response,
    ):
        assert response.status == 200
        text = await response.text()
    return {
        sample.labels["reason"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "events_dropped_total" and sample.labels["platform"] == platform
    }


def assert_no_secret(output: str, *secrets: str) -> None:
    """No secret, nor any 12-character piece of one, appears in the output."""
    for secret in secrets:
        pieces = {secret[i : i + 12] for i in range(max(len(secret) - 11, 1))}
        leaked = sorted(piece for piece in pieces if piece in output)
        assert not leaked, f"a secret leaked into the output: {leaked[0]!r}…"
