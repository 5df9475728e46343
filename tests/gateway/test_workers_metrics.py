"""`/metrics` merged over `--workers` (gateway/observability/workers.py, issue 24)."""

from __future__ import annotations

import os
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gateway.observability.workers import SharedMetrics


def exposition(calls: int, seconds: list[float], degraded: int, *, room: str = "r1") -> bytes:
    registry = CollectorRegistry()
    counter = Counter("proxy_calls", "calls", ["outcome"], registry=registry)
    counter.labels(outcome="forwarded").inc(calls)
    Counter("loops_cut", "cut", ["room"], registry=registry).labels(room=room).inc()
    histogram = Histogram("added_seconds", "added", buckets=(0.001, 0.01), registry=registry)
    for value in seconds:
        histogram.observe(value)
    Gauge("state_degraded", "outage", registry=registry).set(degraded)
    return generate_latest(registry)


def values(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text.decode())
        for s in family.samples
        if not s.name.endswith("_created")
    }


def test_issue24_counters_and_histograms_are_summed_gauges_are_the_answering_worker_s(
    tmp_path: Path,
) -> None:
    # Another worker (a dead one's file stays) published its figures.
    (tmp_path / f"{os.getpid() + 1}.prom").write_bytes(exposition(5, [0.0005, 0.5], 1, room="r2"))
    own = exposition(3, [0.005], 0)
    merged = values(SharedMetrics(tmp_path, lambda: own).merged(own))
    assert merged[("proxy_calls_total", (("outcome", "forwarded"),))] == 8
    assert merged[("loops_cut_total", (("room", "r1"),))] == 1
    assert merged[("loops_cut_total", (("room", "r2"),))] == 1  # a label set only it had
    assert merged[("added_seconds_bucket", (("le", "0.001"),))] == 1
    assert merged[("added_seconds_bucket", (("le", "0.01"),))] == 2
    assert merged[("added_seconds_bucket", (("le", "+Inf"),))] == 3
    assert merged[("added_seconds_count", ())] == 3
    assert merged[("state_degraded", ())] == 0


def test_issue24_a_worker_publishes_its_figures_for_the_others(tmp_path: Path) -> None:
    own = exposition(2, [], 0)
    shared = SharedMetrics(tmp_path, lambda: own)
    shared.publish()
    assert (tmp_path / f"{os.getpid()}.prom").read_bytes() == own
    assert [p.name for p in tmp_path.iterdir()] == [f"{os.getpid()}.prom"]
    # Its own file is not counted twice.
    assert values(shared.merged(own))[("proxy_calls_total", (("outcome", "forwarded"),))] == 2
