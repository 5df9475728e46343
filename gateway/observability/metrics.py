"""Prometheus counters of one gateway, on a registry of its own.

A dedicated `CollectorRegistry` (not the process-global one) lets tests and several
gateways share a process without "duplicated timeseries" errors. The counters sit on the
per-message hot path, where a prometheus-client `Counter` child costs a lock and a few
calls per increment; so counts are kept in plain dicts (every increment happens on the
event loop's thread) and turned into counter families only when `/metrics` is scraped,
by a collector registered on that registry.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector


@dataclass(frozen=True, slots=True)
class _Family:
    """One counter's exposition name (without `_total`), help text and label names."""

    name: str
    documentation: str
    labels: tuple[str, ...]


_FAMILIES = (
    _Family("messages_in", "Inbound messages handed to the pipeline", ("platform",)),
    _Family("replies_out", "Replies delivered to a platform", ("platform",)),
    _Family("refusals", "Messages a stage refused to answer", ("stage", "reason")),
    _Family(
        "guard_decisions",
        'Guard verdicts by guard and code; shadow="true" for a guard in shadow mode',
        ("guard", "code", "shadow"),
    ),
    _Family("delivery_retries", "Sends retried after a transient failure", ("platform",)),
    _Family("delivery_failures", "Replies that could not be delivered", ("platform",)),
    _Family("errors", "Unexpected errors, by the stage they escaped from", ("stage",)),
    _Family(
        "transcript_records_skipped",
        "Transcript records that could not be read, skipped from an agent's history",
        (),
    ),
    _Family(
        "events_dropped",
        "Inbound events a connector dropped, by platform and reason (connectors/skips.py)",
        ("platform", "reason"),
    ),
)


class _Counts(Collector):
    """The counts of every family, exposed as counters at scrape time."""

    def __init__(self) -> None:
        self.values: dict[str, dict[tuple[str, ...], int]] = {f.name: {} for f in _FAMILIES}

    def collect(self) -> Iterator[Metric]:
        for family in _FAMILIES:
            metric = CounterMetricFamily(
                family.name, family.documentation, labels=list(family.labels)
            )
            for labels, value in list(self.values[family.name].items()):
                metric.add_metric(list(labels), value)
            yield metric


@runtime_checkable
class ReportsOutages(Protocol):
    """A state backend that can be unreachable (Redis) and says so."""

    @property
    def degraded(self) -> bool: ...

    @property
    def unavailable_calls(self) -> int: ...


class _StateHealth(Collector):
    """The state backend's outage flag and unreachable-call count, read at scrape time."""

    def __init__(self, store: ReportsOutages) -> None:
        self._store = store

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "state_degraded",
            "1 while the state backend is unreachable: with state.on_error allow, budgets,"
            " cooldowns and dedupe are local to this process until it is back",
            value=1.0 if self._store.degraded else 0.0,
        )
        yield CounterMetricFamily(
            "state_unavailable_calls",
            "State calls that could not reach the backend",
            value=self._store.unavailable_calls,
        )


class Metrics:
    """The gateway's counters; the runtime serves `render()` (or the registry) at `/metrics`."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self._counts = _Counts()
        self.registry.register(self._counts)
        values = self._counts.values
        self._messages_in = values["messages_in"]
        self._replies_out = values["replies_out"]
        self._refusals = values["refusals"]
        self._guard_decisions = values["guard_decisions"]
        self._delivery_retries = values["delivery_retries"]
        self._delivery_failures = values["delivery_failures"]
        self._errors = values["errors"]
        self._events_dropped = values["events_dropped"]
        self._transcript_skipped = values["transcript_records_skipped"]

    def message_in(self, platform: str) -> None:
        """Count one inbound message."""
        key = (platform,)
        self._messages_in[key] = self._messages_in.get(key, 0) + 1

    def reply_out(self, platform: str) -> None:
        """Count one reply delivered (all of its chunks)."""
        key = (platform,)
        self._replies_out[key] = self._replies_out.get(key, 0) + 1

    def refusal(self, stage: str, reason: str) -> None:
        """Count one message a stage refused."""
        key = (stage, reason)
        self._refusals[key] = self._refusals.get(key, 0) + 1

    def guard_decision(self, guard: str, code: str, *, shadow: bool = False) -> None:
        """Count one guard verdict, admitted or not (`shadow`: the guard is in shadow mode)."""
        key = (guard, code, "true" if shadow else "false")
        self._guard_decisions[key] = self._guard_decisions.get(key, 0) + 1

    def delivery_retry(self, platform: str) -> None:
        """Count one retried send."""
        key = (platform,)
        self._delivery_retries[key] = self._delivery_retries.get(key, 0) + 1

    def delivery_failure(self, platform: str) -> None:
        """Count one reply given up on."""
        key = (platform,)
        self._delivery_failures[key] = self._delivery_failures.get(key, 0) + 1

    def error(self, stage: str) -> None:
        """Count one unexpected error."""
        key = (stage,)
        self._errors[key] = self._errors.get(key, 0) + 1

    def event_dropped(self, platform: str, reason: str) -> None:
        """Count one inbound event a connector dropped."""
        key = (platform, reason)
        self._events_dropped[key] = self._events_dropped.get(key, 0) + 1

    def transcript_skipped(self, count: int) -> None:
        """Count transcript records skipped because they could not be read."""
        self._transcript_skipped[()] = self._transcript_skipped.get((), 0) + count

    def watch_state(self, store: object) -> None:
        """Expose a state backend's outage flag and count, when it reports them."""
        if isinstance(store, ReportsOutages):
            self.registry.register(_StateHealth(store))

    def value(self, name: str, **labels: str) -> float:
        """The sum of the samples of `name` whose labels include `labels`, 0 when none does.

        So `value("guard_decisions_total", guard="bot_loop", code="ok")` counts both modes.
        """
        wanted = labels.items()
        return sum(
            (
                sample.value
                for metric in self.registry.collect()
                for sample in metric.samples
                if sample.name == name and wanted <= sample.labels.items()
            ),
            0.0,
        )

    def render(self) -> bytes:
        """The text exposition format, for `/metrics`."""
        return generate_latest(self.registry)
