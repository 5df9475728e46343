"""`/metrics` summed over the worker processes of `--workers N` (gateway/cli/workers.py).

Every worker keeps its own counters (gateway.observability.metrics); a scrape reaches one
worker, chosen by the kernel. So each worker publishes its exposition to a file of its own
in a directory the supervisor made (`<pid>.prom`, rewritten every `PUBLISH_SECONDS` and
when the worker stops), and the worker that answers a scrape merges: counters and
histograms are summed over its own fresh figures and every other worker's latest file,
gauges are its own. A dead worker's file stays, so a total never goes down when a worker
is restarted (Prometheus' multiprocess mode keeps dead processes' counters the same way).

Decisions where DESIGN.md is silent:
- The other workers' figures are at most `PUBLISH_SECONDS` old (plus what a killed
  worker counted after its last publication, which is lost), well under a scrape interval.
- Gauges are the answering worker's: the budget gauges are read from the shared store
  (the same in every worker), the state outage flag is that worker's view.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

from aiohttp import web
from aiohttp.typedefs import Handler
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

log = logging.getLogger("loopwarden")

PUBLISH_SECONDS = 1.0
_SUMMED = ("counter", "histogram", "summary")


class SharedMetrics:
    """One worker's side: publish its own figures, answer scrapes with everyone's."""

    def __init__(self, directory: Path, render: Callable[[], bytes]) -> None:
        self._directory = directory
        self._render = render
        self._own = directory / f"{os.getpid()}.prom"

    def publish(self, exposition: bytes | None = None) -> None:
        """Write this worker's figures (`exposition`, else rendered now) for the others."""
        text = self._render() if exposition is None else exposition
        scratch = self._own.with_suffix(".tmp")
        scratch.write_bytes(text)
        scratch.replace(self._own)

    def merged(self, own: bytes) -> bytes:
        """`own` exposition with every other worker's counters and histograms added."""
        families = {f.name: f for f in text_string_to_metric_families(own.decode())}
        for path in self._directory.glob("*.prom"):
            if path == self._own:
                continue
            try:
                text = path.read_text(encoding="utf-8")
            except FileNotFoundError:  # replaced between the listing and the read
                continue
            for other in text_string_to_metric_families(text):
                mine = families.get(other.name)
                if mine is not None and mine.type == other.type and mine.type in _SUMMED:
                    _add(mine, other)
        return generate_latest(_Fixed(list(families.values())))

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """An aiohttp middleware: answer `GET /metrics` with the workers' merged figures."""
        response = await handler(request)
        if request.path != "/metrics" or not isinstance(response, web.Response):
            return response
        if response.status != 200 or not isinstance(response.body, bytes):
            return response
        own = response.body
        self.publish(own)
        kind = response.headers.get("Content-Type", "text/plain")
        return web.Response(body=self.merged(own), headers={"Content-Type": kind})

    async def publishing(self, app: web.Application) -> AsyncIterator[None]:
        """An aiohttp cleanup context: publish every PUBLISH_SECONDS, and once at the end."""
        task = asyncio.create_task(self._every())
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        self.publish()

    async def _every(self) -> None:
        while True:
            try:
                self.publish()
            except OSError:
                log.exception("publishing this worker's metrics failed")
            await asyncio.sleep(PUBLISH_SECONDS)


def _add(mine: Metric, other: Metric) -> None:
    """Add `other`'s samples into `mine`'s (by name and labels); its new ones appended."""
    index = {(s.name, tuple(sorted(s.labels.items()))): n for n, s in enumerate(mine.samples)}
    for sample in other.samples:
        if sample.name.endswith("_created"):
            continue
        key = (sample.name, tuple(sorted(sample.labels.items())))
        at = index.get(key)
        if at is None:
            index[key] = len(mine.samples)
            mine.samples.append(sample)
        else:
            mine.samples[at] = mine.samples[at]._replace(
                value=mine.samples[at].value + sample.value
            )


class _Fixed(CollectorRegistry):
    """A registry that yields the given families, for `generate_latest`."""

    def __init__(self, families: list[Metric]) -> None:
        super().__init__(auto_describe=False)
        self._families = families

    def collect(self) -> Iterator[Metric]:
        yield from self._families
