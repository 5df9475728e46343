"""`loopwarden proxy --workers N`: N real processes on one loopback port (issue 24).

Each test starts the real command as a subprocess on sqlite state (the fake upstream
runs in the test's process) and tells the workers apart by the `X-Loopwarden-Worker`
header each response carries.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.cli.main import main
from gateway.cli.workers import WORKER_HEADER
from tests.fakes.llm_upstream import FakeLLM, FakeResponse, Received, hang_response
from tests.gateway.proxy.proxy_helpers import MODEL, PROXY_KEY, proxy_yaml
from tests.gateway.proxy.test_proxy_cli import free_port, run_cli
from tests.gateway.proxy.test_proxy_holds import priced_body

# Ten calls of $0.10 (priced_body's estimate) fill the month's $1.00.
TEN_CALLS = """
budgets:
  - {name: agent-monthly, per: [agent], limit_usd: 1.00, period: month}
"""
STARTED = re.compile(r"worker (\d+) started \(pid (\d+)\)")
TIMEOUT = 30


@dataclass
class Workers:
    """A running `loopwarden proxy --workers N` and what it has logged so far."""

    process: asyncio.subprocess.Process
    url: str
    lines: list[str] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def logged(self, pattern: str, count: int = 1) -> list[re.Match[str]]:
        """The first `count` log lines matching `pattern`, once they are there."""

        def found() -> list[re.Match[str]]:
            return [m for line in self.lines if (m := re.search(pattern, line))]

        try:
            async with asyncio.timeout(TIMEOUT):
                while len(found()) < count:
                    self.changed.clear()
                    await self.changed.wait()
        except TimeoutError:
            raise AssertionError(
                f"{pattern!r} not logged {count} times in:\n" + "".join(self.lines)
            ) from None
        return found()[:count]

    async def read(self) -> None:
        assert self.process.stderr is not None
        async for line in self.process.stderr:
            self.lines.append(line.decode())
            self.changed.set()


@asynccontextmanager
async def proxy_workers(
    tmp_path: Path, upstream_url: str, extra: str = "", *, count: int = 2
) -> AsyncIterator[Workers]:
    """`loopwarden proxy --workers count` on sqlite state, once every worker serves."""
    port = free_port()
    state = f"{{backend: sqlite, path: '{tmp_path / 'state.sqlite3'}'}}"
    path = tmp_path / "loopwarden.yaml"
    path.write_text(proxy_yaml(upstream_url, extra, state=state, port=port), encoding="utf-8")
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        *("-m", "gateway", "proxy", "--workers", str(count), "--config", str(path)),
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    workers = Workers(process, f"http://127.0.0.1:{port}")
    reading = asyncio.create_task(workers.read())
    try:
        await workers.logged("proxy listening", count)
        yield workers
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)  # the workers drain and exit with it
            await asyncio.wait_for(process.wait(), TIMEOUT)
        await reading


async def pids_answering(url: str, *, want: int, attempts: int = 400) -> set[str]:
    """The worker pids seen over up to `attempts` fresh connections (stop at `want`)."""
    seen: set[str] = set()
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector) as http:
        for _ in range(attempts):
            async with http.get(f"{url}/healthz") as answer:
                assert answer.status == 200
                seen.add(answer.headers[WORKER_HEADER])
            if len(seen) >= want:
                break
    return seen


async def call(url: str, body: bytes) -> int:
    headers = {"Authorization": f"Bearer {PROXY_KEY}", "Content-Type": "application/json"}
    connector = aiohttp.TCPConnector(force_close=True)
    async with (
        aiohttp.ClientSession(connector=connector) as http,
        http.post(f"{url}/openai/v1/chat/completions", data=body, headers=headers) as answer,
    ):
        await answer.read()
        return answer.status


async def test_issue24_two_workers_answer_on_one_port(tmp_path: Path) -> None:
    async with FakeLLM() as upstream, proxy_workers(tmp_path, upstream.url) as workers:
        started = await workers.logged(STARTED.pattern, 2)
        pids = {m[2] for m in started}
        assert len(pids) == 2
        assert await pids_answering(workers.url, want=2) == pids
        assert os.getpid() not in {int(pid) for pid in pids}


async def test_issue24_memory_state_with_two_workers_exits_2_naming_state_backend(
    tmp_path: Path,
) -> None:
    path = tmp_path / "loopwarden.yaml"
    path.write_text(proxy_yaml("http://127.0.0.1:9"), encoding="utf-8")
    code, _, err = await run_cli("proxy", "--workers", "2", "--config", str(path))
    assert code == 2
    assert err.startswith("config error: state.backend: memory")
    assert "--workers 2 needs sqlite or redis" in err


@pytest.mark.parametrize(
    ("count", "named"),
    [
        ("0", "must be from 1 to 256, not 0"),
        ("9" * 40, "must be from 1 to 256, not 9999"),
        ("two\x1b[2J" + "x" * 100, "must be a number or auto, not 'two\\x1b[2Jxxxxxxxxxxxxx'"),
    ],
)
def test_issue24_a_workers_count_out_of_range_exits_2_naming_the_option(
    count: str, named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["proxy", "--workers", count, "--config", "unused.yaml"])
    assert exited.value.code == 2
    assert f"argument --workers: {named}" in capsys.readouterr().err


async def test_issue24_sigterm_drains_every_worker_and_exits_0(tmp_path: Path) -> None:
    async with FakeLLM() as upstream, proxy_workers(tmp_path, upstream.url) as workers:
        upstream.gate = asyncio.Event()
        headers = {"Authorization": f"Bearer {PROXY_KEY}"}
        data = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
        async with (
            aiohttp.ClientSession() as http,
            http.post(
                f"{workers.url}/openai/v1/chat/completions", json=data, headers=headers
            ) as stream,
        ):
            first = await stream.content.readline()
            assert first.startswith(b"data: ")
            workers.process.send_signal(signal.SIGTERM)
            await workers.logged("stopping the proxy", 2)
            upstream.gate.set()  # the stream in flight ends during the drain
            rest = await stream.read()
        assert rest.rstrip().endswith(b"data: [DONE]")
        assert await asyncio.wait_for(workers.process.wait(), TIMEOUT) == 0
        await workers.logged("all 2 workers stopped")


async def test_issue24_a_sigkilled_worker_is_logged_and_started_again(tmp_path: Path) -> None:
    async with FakeLLM() as upstream, proxy_workers(tmp_path, upstream.url) as workers:
        first, second = await workers.logged(STARTED.pattern, 2)
        # A worker that answered has told the supervisor it serves: its death is a crash.
        assert await pids_answering(workers.url, want=2) == {first[2], second[2]}
        os.kill(int(first[2]), signal.SIGKILL)
        died = await workers.logged(r"worker 0 \(pid \d+\) was killed by SIGKILL; starting it")
        assert died[0][0].endswith(f"(pid {first[2]}) was killed by SIGKILL; starting it")
        again = (await workers.logged(STARTED.pattern, 3))[2]
        assert again[1] == "0"
        assert again[2] not in (first[2], second[2])
        await workers.logged("proxy listening", 3)
        assert await pids_answering(workers.url, want=2) == {again[2], second[2]}
        workers.process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(workers.process.wait(), TIMEOUT) == 0


async def test_issue24_a_budget_shared_through_sqlite_holds_across_workers(
    tmp_path: Path,
) -> None:
    forwarded: list[Received] = []
    ten = asyncio.Event()

    def hang(request: Received) -> FakeResponse:
        forwarded.append(request)
        if len(forwarded) == 10:
            ten.set()
        return hang_response()

    async with (
        FakeLLM(responder=hang) as upstream,
        proxy_workers(tmp_path, upstream.url, TEN_CALLS) as workers,
    ):
        calls = [
            asyncio.create_task(call(workers.url, priced_body(f"task {n}"))) for n in range(40)
        ]
        # The 30 refused answer at once; the 10 admitted hang upstream until the end.
        refused = []
        for answered in asyncio.as_completed(calls, timeout=TIMEOUT):
            refused.append(await answered)
            if len(refused) == 30:
                break
        assert refused == [429] * 30
        await asyncio.wait_for(ten.wait(), TIMEOUT)
        assert len(forwarded) == 10
        assert {json.loads(r.body)["messages"][0]["content"].strip() for r in forwarded} <= {
            f"task {n}" for n in range(40)
        }
        workers.process.send_signal(signal.SIGTERM)
        await asyncio.wait_for(workers.process.wait(), TIMEOUT)
        for task in calls:
            task.cancel()
        await asyncio.gather(*calls, return_exceptions=True)


def forwarded_total(exposition: str) -> float:
    """proxy_calls_total of the forwarded OpenAI calls, summed over its samples."""
    return sum(
        sample.value
        for family in text_string_to_metric_families(exposition)
        for sample in family.samples
        if sample.name == "proxy_calls_total"
        and sample.labels.get("outcome") == "forwarded"
        and sample.labels.get("provider") == "openai"
    )


async def test_issue24_metrics_count_every_worker_s_calls(tmp_path: Path) -> None:
    async with FakeLLM() as upstream, proxy_workers(tmp_path, upstream.url) as workers:
        answered_by: set[str] = set()
        connector = aiohttp.TCPConnector(force_close=True)
        headers = {"Authorization": f"Bearer {PROXY_KEY}"}
        async with aiohttp.ClientSession(connector=connector) as http:
            calls = 0
            while len(answered_by) < 2 or calls < 20:
                data = {"model": MODEL, "messages": [{"role": "user", "content": f"q {calls}"}]}
                async with http.post(
                    f"{workers.url}/openai/v1/chat/completions", json=data, headers=headers
                ) as answer:
                    assert answer.status == 200
                    answered_by.add(answer.headers[WORKER_HEADER])
                calls += 1
            # Whichever worker answers a scrape counts both workers' calls.
            scraped_by: dict[str, float] = {}
            async with asyncio.timeout(TIMEOUT):
                while len(scraped_by) < 2 or set(scraped_by.values()) != {calls}:
                    async with http.get(f"{workers.url}/metrics") as scrape:
                        text = await scrape.text()
                        scraped_by[scrape.headers[WORKER_HEADER]] = forwarded_total(text)
        assert set(scraped_by) == answered_by
