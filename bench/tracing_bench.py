"""What tracing costs: the pipeline's msg/s and the proxy's added p50, tracing on against off.

Run with `.venv/bin/python -m bench.tracing_bench [--quick]` (needs the `[otel]` extra).

Tracing on is the real exporter (`telemetry.otlp_endpoint`, every trace sampled, the
export thread posting OTLP/HTTP protobuf with the SDK's exporter) to a sink on loopback
that answers 200 in a thread of its own. The export queue is made large enough
(`OTEL_BSP_MAX_QUEUE_SIZE`) that no span is dropped, so every span is paid for. In one
run, alternating off and on:
- the pipeline (bench/pipeline_bench.py's workload and pipeline, room memory off): msg/s
  in the event loop's thread CPU time, off and on, best of the runs; the export thread
  (`gateway.observability.otel_batch`) is not in that figure: its own CPU time over the
  run and the flush after it is printed beside it (it runs on the other core, taking
  turns with the event loop for the GIL);
- the proxy (bench/proxy_bench.py's request, memory state): requests alternating direct
  and through the proxy, one at a time; the added p50 off and on, median of the rounds.
Targets: the pipeline at least 0.85× its rate with tracing off, and the proxy's added
p50 at most 0.1 ms more.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import aiohttp

from bench.pipeline_bench import BOT_MESSAGES_PER_ROOM, CONFIG, NO_ROOM_MEMORY, Bench, timed
from bench.proxy_bench import PROXY_KEY, Send, _config, _sender, _sequential
from gateway.config import TelemetryConfig, parse_config
from gateway.observability import tracing
from gateway.observability.otel_batch import EXPORT_THREAD
from gateway.observability.telemetry import reset_tracing, setup_tracing
from gateway.proxy.alerts import Alerter
from gateway.proxy.app import ProxyServer
from tests.fakes.llm_upstream import FakeLLM

TARGET_RATIO = 0.85
TARGET_ADDED_MS = 0.1


class _Sink(BaseHTTPRequestHandler):
    """Reads each export and answers 200, as a collector that keeps nothing."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base's name
        """Quiet."""


async def _pipeline(on: tracing.Tracer, rooms: int, repeat: int) -> None:
    bench = Bench(parse_config(CONFIG + NO_ROOM_MEMORY, env={}))
    await timed(bench, bench.through_pipeline, rooms // 10 or 1)  # warm-up
    on.force_flush()
    exporter = _export_clock()
    off_runs, on_runs, exports = [], [], []
    for _ in range(repeat):
        tracing.install(tracing.NO_TRACER)
        off_runs.append(await timed(bench, bench.through_pipeline, rooms))
        tracing.install(on)
        began = time.clock_gettime(exporter)
        on_runs.append(await timed(bench, bench.through_pipeline, rooms))
        on.force_flush()
        exports.append(time.clock_gettime(exporter) - began)
    tracing.install(tracing.NO_TRACER)
    count = rooms * (1 + BOT_MESSAGES_PER_ROOM)
    off = 1 / min(run.cpu for run in off_runs)
    traced = 1 / min(run.cpu for run in on_runs)
    ratio = traced / off
    added_us = (1 / traced - 1 / off) * 1e6
    export_us = min(exports) / count * 1e6
    print(f"pipeline, {count:,} messages a run, best of {repeat} (event-loop thread CPU)")
    print(f"  tracing off           {off:>10,.0f} msg/s")
    print(f"  tracing on            {traced:>10,.0f} msg/s  (+{added_us:.2f} µs/msg)")
    print(f"  on / off              {ratio:>10.2f} ×  (target ≥ {TARGET_RATIO})")
    print(f"  export thread         {export_us:>10.2f} µs/msg of its own CPU, not in the above")
    verdict = "meets" if ratio >= TARGET_RATIO else "misses"
    print(f"  {verdict} the target")


async def _proxy(on: tracing.Tracer, requests: int, rounds: int) -> None:
    added: dict[bool, list[float]] = {False: [], True: []}
    async with FakeLLM() as upstream:
        config = parse_config(_config(upstream.url, "{backend: memory}"), env={})
        proxy = ProxyServer(config, alerter=Alerter([]))
        await proxy.start()
        try:
            async with aiohttp.ClientSession() as http:
                direct = _sender(http, f"{upstream.url}/v1/chat/completions", {})
                auth = {"Authorization": f"Bearer {PROXY_KEY}"}
                url = f"http://127.0.0.1:{proxy.port}/openai/v1/chat/completions"
                proxied = _sender(http, url, auth)
                warm = max(50, requests // 10)
                await _sequential(direct, proxied, warm)
                offset = warm
                for _ in range(rounds):
                    for traced in (False, True):
                        tracing.install(on if traced else tracing.NO_TRACER)
                        gc.collect()
                        # Fresh request bodies each round: a repeat would be a loop to refuse.
                        plain, through = await _sequential(
                            _shifted(direct, offset), _shifted(proxied, offset), requests
                        )
                        offset += requests
                        added[traced].append(through.percentile(50) - plain.percentile(50))
                    on.force_flush()
        finally:
            tracing.install(tracing.NO_TRACER)
            await proxy.stop()
    off_ms, on_ms = statistics.median(added[False]), statistics.median(added[True])
    print(f"proxy, {requests:,} requests a round each way, median of {rounds} rounds")
    print(f"  added p50, tracing off  {off_ms:.3f} ms  (rounds {_range(added[False])})")
    print(f"  added p50, tracing on   {on_ms:.3f} ms  (rounds {_range(added[True])})")
    more = on_ms - off_ms
    verdict = "meets" if more <= TARGET_ADDED_MS else "misses"
    print(f"  tracing adds            {more:+.3f} ms  (target ≤ +{TARGET_ADDED_MS} ms): {verdict}")


def _export_clock() -> int:
    """The CPU clock of the tracer's export thread."""
    [thread] = [thread for thread in threading.enumerate() if thread.name == EXPORT_THREAD]
    if thread.ident is None:
        raise RuntimeError("the export thread has not started")
    return time.pthread_getcpuclockid(thread.ident)


def _shifted(send: Send, offset: int) -> Send:
    """`send` of request `n + offset`."""

    async def shifted(n: int) -> None:
        await send(n + offset)

    return shifted


def _range(samples: list[float]) -> str:
    return f"{min(samples):.3f}-{max(samples):.3f}"


async def main(messages: int, repeat: int, requests: int) -> None:
    sink = ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    os.environ.setdefault("OTEL_BSP_MAX_QUEUE_SIZE", "1000000")
    endpoint = f"http://127.0.0.1:{sink.server_address[1]}"
    on = setup_tracing(TelemetryConfig(otlp_endpoint=endpoint), "loopwarden-bench")
    try:
        rooms = max(1, messages // (1 + BOT_MESSAGES_PER_ROOM))
        await _pipeline(on, rooms, repeat)
        await _proxy(on, requests, repeat)
    finally:
        reset_tracing()
        sink.shutdown()


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--messages", type=int, default=30_000, help="pipeline messages per run")
    parser.add_argument("--requests", type=int, default=1_000, help="proxy requests per round")
    parser.add_argument("--repeat", type=int, default=3, help="pipeline runs and proxy rounds")
    parser.add_argument("--quick", action="store_true", help="a tenth of the work, 2 runs")
    args = parser.parse_args()
    if args.quick:
        args.messages, args.requests, args.repeat = args.messages // 10, args.requests // 5, 2
    asyncio.run(main(args.messages, args.repeat, args.requests))


if __name__ == "__main__":
    cli()
