"""`loopwarden proxy --workers N` against nginx directly, with wrk as the client (issue 24).

The upstream is nginx serving one fixed chat completion on loopback, the client wrk
(both from Debian: `apt-get install -y nginx-light wrk`; the bench says so and stops when
either is missing), so neither takes much of the CPU the proxy needs. In one run, each
with wrk's POSTs of chat completions (every body different, so the call guard admits
them all):
- nginx directly;
- `loopwarden proxy` with 1 worker on memory state, and on sqlite state;
- `loopwarden proxy --workers 2` on sqlite state (N > 1 needs shared state), its req/s
  compared with both one-worker runs (the sqlite one tells the workers' gain apart from
  what the shared state costs);
- a bare aiohttp proxy on uvloop (`BARE_PROXY`: the same two aiohttp hops, a pooled
  client session, no guard, no log, no metrics), the floor of what a proxy built on
  aiohttp adds on this machine, so the proxy's own share is printed beside the target;
each at one request in flight (latency: p50 and p99, and what the proxy adds over
nginx's) and at `CONNECTIONS` in flight (requests/s). Targets on a 2-core machine: 2
workers >= 1.6x one worker's requests/s; added p50 <= 0.25 ms at one request in flight
on memory state.

Run: `.venv/bin/python -m bench.workers_bench [--seconds S]`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

CONNECTIONS = 32
TARGET_SPEEDUP = 1.6
TARGET_ADDED_P50_MS = 0.25
PROXY_KEY = "lw-bench-key"
COMPLETION = {
    "id": "chatcmpl-bench",
    "object": "chat.completion",
    "created": 1700000000,
    "model": "gpt-4o-mini",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
    ],
    "usage": {"prompt_tokens": 11, "completion_tokens": 1, "total_tokens": 12},
}
# Every request a different body, as an agent's calls are: the request's number and the
# run's in letters ("bcd"), since the call guard reads numbers of 5 or more digits as
# volatile ids (guards/call_loop/normalise.py), so "question 10001" and "question 10002"
# would be one call repeated, refused as a loop after a few thousand requests.
WRK_SCRIPT = """
counter = 0
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer %(key)s"
local function letters(n)
  return (string.gsub(tostring(n), "%%d", function(d) return string.char(97 + d) end))
end
request = function()
  counter = counter + 1
  local body = '{"model":"gpt-4o-mini","max_tokens":5,"messages":[{"role":"user",' ..
    '"content":"question ' .. letters(counter) .. ' of run %(run)s"}]}'
  return wrk.format(nil, "%(path)s", nil, body)
end
"""
NGINX_CONF = """
daemon off;
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/error.log;
events {{ worker_connections 1024; }}
http {{
  access_log off;
  client_body_temp_path {dir}/body;
  server {{
    listen 127.0.0.1:{port};
    location / {{
      default_type application/json;
      return 200 '{body}';
    }}
  }}
}}
"""
# The floor: aiohttp's server and client hops alone, relaying the upstream's status and body.
BARE_PROXY = """
import asyncio
import sys
import aiohttp
import uvloop
from aiohttp import web

port, upstream = int(sys.argv[1]), sys.argv[2]

async def forward(request):
    body = await request.read()
    headers = {"Content-Type": "application/json", "Authorization": "Bearer sk-bench"}
    async with request.app["session"].post(upstream, data=body, headers=headers) as answer:
        return web.Response(status=answer.status, body=await answer.read(),
                            content_type=answer.content_type)

async def session(app):
    app["session"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
    yield
    await app["session"].close()

async def main():
    app = web.Application()
    app.router.add_post("/{tail:.*}", forward)
    app.cleanup_ctx.append(session)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    print("bare proxy listening", file=sys.stderr, flush=True)  # bound: it answers now
    await asyncio.Event().wait()

uvloop.run(main())
"""
_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


@dataclass(frozen=True, slots=True)
class Figures:
    """One wrk run: requests/s and the latency percentiles in milliseconds."""

    rps: float
    p50_ms: float
    p99_ms: float


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def wrk(url: str, path: str, *, connections: int, seconds: float, scripts: Path) -> Figures:
    """Run wrk's POSTs to url+path; its requests/s and latency p50/p99.

    Each run's bodies are its own (a run number in them): the proxy serves two runs, and
    the second's first requests must not repeat the first's.
    """
    runs = len(list(scripts.glob("run-*.lua")))
    script = scripts / f"run-{runs}.lua"
    tag = "".join(chr(ord("a") + int(digit)) for digit in str(runs))
    script.write_text(WRK_SCRIPT % {"key": PROXY_KEY, "path": path, "run": tag})
    argv = [
        "wrk",
        "-t1",
        f"-c{connections}",
        f"-d{seconds:g}s",
        "--latency",
        "-s",
        str(script),
        url,
    ]
    out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    found = re.search(r"Requests/sec:\s+([\d.]+)", out)
    assert found, out
    rps = float(found[1])
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if non2xx:
        raise SystemExit(f"{url}{path}: {non2xx[1]} answers were not 2xx:\n{out}")

    def percentile(name: str) -> float:
        found = re.search(rf"^\s+{name}%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
        assert found, out
        return float(found[1]) * _UNITS[found[2]]

    return Figures(rps, percentile("50"), percentile("99"))


def start_proxy(
    directory: Path, upstream: str, workers: int, state: str, run: int
) -> tuple[subprocess.Popen[bytes], str]:
    """`loopwarden proxy --workers N`, once every worker listens; (process, its URL)."""
    port = free_port()
    config = directory / f"proxy-{run}.yaml"
    log_path = directory / f"proxy-{run}.log"
    config.write_text(
        f"""
state: {state}
proxy:
  host: 127.0.0.1
  port: {port}
  keys: {{{PROXY_KEY}: {{agent: bench}}}}
  upstreams:
    openai: {{base_url: '{upstream}/v1', api_key: 'sk-bench-upstream'}}
  prices: {{'gpt-4o*': {{input_per_1k: 0.15, output_per_1k: 0.6}}}}
""",
        encoding="utf-8",
    )
    argv = [sys.executable, "-m", "gateway", "proxy", "--config", str(config)]
    if workers > 1:
        argv += ["--workers", str(workers)]
    return started(argv, log_path, "proxy listening", workers), f"http://127.0.0.1:{port}"


def started(
    argv: list[str], log_path: Path, marker: str, count: int = 1
) -> subprocess.Popen[bytes]:
    """`argv` run with its stderr in `log_path`, once `marker` (printed when it listens) is
    there `count` times; the bench stops with the log if it dies or takes 30 s."""
    log = log_path.open("w")
    process = subprocess.Popen(argv, stderr=log, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    log.close()  # the process has its own copy
    deadline = time.monotonic() + 30
    while log_path.read_text().count(marker) < count:
        if time.monotonic() > deadline or process.poll() is not None:
            raise SystemExit(log_path.read_text())
        time.sleep(0.1)
    return process


def start_bare_proxy(directory: Path, upstream: str) -> tuple[subprocess.Popen[bytes], str]:
    """`BARE_PROXY` in front of the upstream's chat completions; (process, its URL)."""
    port = free_port()
    argv = [sys.executable, "-c", BARE_PROXY, str(port), f"{upstream}/v1/chat/completions"]
    process = started(argv, directory / "bare-proxy.log", "bare proxy listening")
    return process, f"http://127.0.0.1:{port}"


def stop(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="each wrk run's length")
    args = parser.parse_args()
    missing = [tool for tool in ("nginx", "wrk") if shutil.which(tool) is None]
    if missing:
        print(f"skipped: {', '.join(missing)} not installed (apt-get install -y nginx-light wrk)")
        return
    with tempfile.TemporaryDirectory(prefix="workers-bench-") as name:
        directory = Path(name)
        (directory / "body").mkdir()
        nginx_port = free_port()
        body = json.dumps(COMPLETION, separators=(",", ":"))
        conf = directory / "nginx.conf"
        conf.write_text(NGINX_CONF.format(dir=directory, port=nginx_port, body=body))
        nginx = subprocess.Popen(["nginx", "-p", str(directory), "-c", str(conf)])
        upstream = f"http://127.0.0.1:{nginx_port}"
        time.sleep(0.5)
        path = "/openai/v1/chat/completions"
        results: dict[str, tuple[Figures, Figures]] = {}
        try:

            def measure(url: str, path: str) -> tuple[Figures, Figures]:
                one = wrk(url, path, connections=1, seconds=args.seconds, scripts=directory)
                many = wrk(
                    url, path, connections=CONNECTIONS, seconds=args.seconds, scripts=directory
                )
                return one, many

            results["nginx directly"] = measure(upstream, "/v1/chat/completions")
            bare, bare_url = start_bare_proxy(directory, upstream)
            try:
                results["bare aiohttp proxy (memory)"] = measure(bare_url, path)
            finally:
                stop(bare)
            sqlite = f"{{backend: sqlite, path: '{directory / 'state.sqlite3'}'}}"
            for workers, state in ((1, "{backend: memory}"), (1, sqlite), (2, sqlite)):
                process, url = start_proxy(directory, upstream, workers, state, len(results))
                try:
                    label = f"proxy, {workers} worker{'s' if workers > 1 else ''} ({state[10:16]})"
                    results[label] = measure(url, path)
                finally:
                    stop(process)
        finally:
            nginx.send_signal(signal.SIGQUIT)
            nginx.wait(timeout=10)
    report(results, args.seconds)


def report(results: dict[str, tuple[Figures, Figures]], seconds: float) -> None:
    print(f"{platform.node()}: {os.cpu_count()} cores, {platform.python_version()}, {seconds:g} s")
    base_one, _ = results["nginx directly"]
    print(f"{'':34} {'req/s @32':>10} {'p50 @1':>9} {'p99 @1':>9} {'+p50':>8} {'+p99':>8}")
    for label, (one, many) in results.items():
        added_50 = one.p50_ms - base_one.p50_ms
        added_99 = one.p99_ms - base_one.p99_ms
        print(
            f"{label:34} {many.rps:10.0f} {one.p50_ms:8.3f}ms {one.p99_ms:8.3f}ms "
            f"{added_50:+7.3f}ms {added_99:+7.3f}ms"
        )
    memory, sqlite, two = (figures for label, figures in results.items() if "worker" in label)
    for name, one_worker in (("memory", memory), ("sqlite", sqlite)):
        speedup = two[1].rps / one_worker[1].rps
        print(
            f"2 workers (sqlite) / 1 worker ({name}) req/s: {speedup:.2f}x "
            f"(target >= {TARGET_SPEEDUP}x): {'met' if speedup >= TARGET_SPEEDUP else 'MISSED'}"
        )
    added = memory[0].p50_ms - base_one.p50_ms
    bare = results["bare aiohttp proxy (memory)"][0].p50_ms - base_one.p50_ms
    print(
        f"added p50 at one in flight, memory: {added:.3f} ms (target <= {TARGET_ADDED_P50_MS}"
        f" ms): {'met' if added <= TARGET_ADDED_P50_MS else 'MISSED'}; a bare aiohttp proxy "
        f"adds {bare:.3f} ms, loopwarden's guards, log and metrics {added - bare:+.3f} ms"
    )


if __name__ == "__main__":
    main()
