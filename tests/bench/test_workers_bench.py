"""bench/workers_bench.py's wrk requests are distinct calls to the proxy (issue 24).

wrk's Lua script numbers its requests; the call guard reads a number of 5 or more digits
as a volatile id, so a number in digits made request 10,001 and 10,002 one call repeated,
and the proxy refused the bench's run as a loop ("2029 answers were not 2xx").
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest
from aiohttp import web

from bench import workers_bench
from guards.call_loop import fingerprint_call

pytestmark = pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk is not installed")


async def test_issue24_wrk_requests_past_10000_are_distinct_calls(tmp_path: Path) -> None:
    bodies: list[bytes] = []

    async def record(request: web.Request) -> web.Response:
        bodies.append(await request.read())
        return web.json_response(workers_bench.COMPLETION)

    app = web.Application()
    app.router.add_post("/{tail:.*}", record)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    script = workers_bench.WRK_SCRIPT % {"key": "k", "path": "/v1/chat/completions", "run": "b"}
    # Start just short of the five-digit numbers, where the bodies used to collapse.
    script = script.replace("counter = 0", "counter = 9990", 1)
    path = tmp_path / "run.lua"
    path.write_text(script)
    wrk = await asyncio.create_subprocess_exec(
        "wrk",
        "-t1",
        "-c1",
        "-d2s",
        "-s",
        str(path),
        f"http://127.0.0.1:{port}",
        stdout=asyncio.subprocess.DEVNULL,
    )
    await wrk.wait()
    await runner.cleanup()
    assert len(bodies) > 20  # past 10,000
    calls = set()
    for body in bodies:
        data = json.loads(body)
        calls.add(fingerprint_call(data["model"], data["messages"]))
    assert len(calls) == len(bodies)
