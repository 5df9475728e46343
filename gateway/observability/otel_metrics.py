"""Metrics over OTLP (DESIGN.md §9), with the OpenTelemetry SDK (the `[otel]` extra).

Imported only by `gateway.observability.telemetry.setup_telemetry` when
`telemetry.otlp_endpoint` is set. A `MeterProvider` of this exporter's own (not the global
one) and a `PeriodicExportingMetricReader` post OTLP/HTTP protobuf to
`<endpoint>/v1/metrics` every `OTEL_METRIC_EXPORT_INTERVAL` milliseconds; the exporter
reads `OTEL_EXPORTER_OTLP_HEADERS`, `_TIMEOUT`, `_COMPRESSION` and
`OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE` (cumulative by default).

What is exported:
- `gen_ai.client.token.usage` and `gen_ai.client.operation.duration` as histograms with
  the names, units, attributes and advised boundaries of `gateway.observability.semconv`,
  recorded as each model call is logged, from the values the Prometheus histograms get
  (`GenAiHistograms`, fed by `ModelCallMetrics.also_record`). `error.type` is set on a
  failed call only.
- Every other family of the Prometheus registry, without a second definition: observable
  instruments whose callbacks read the registry at export time (`RegistryBridge`), so
  nothing is added to a hot path. A counter is an `ObservableCounter` named as the family
  (`loops_cut`, whose Prometheus series is `loops_cut_total`), a gauge an
  `ObservableGauge`, their labels the attributes. OpenTelemetry has no asynchronous
  histogram, so a Prometheus histogram (`state_operation_seconds`, `proxy_added_seconds`,
  ...) goes as two counters, `<name>_count` and `<name>_sum`; its buckets stay on
  `/metrics`. The families bridged are those registered when export starts (the gateway
  and the proxy register all of theirs in their constructors).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from functools import partial
from typing import Literal

from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.metrics import CallbackOptions, Meter, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric

from gateway.observability import semconv
from gateway.observability.metrics import DURATION_FAMILY, TOKEN_USAGE_FAMILY
from gateway.observability.otel_resource import service_resource

METER = "loopwarden"
NATIVE_FAMILIES = frozenset({TOKEN_USAGE_FAMILY, DURATION_FAMILY})
"""The Prometheus families recorded as OTel histograms of their own, so not bridged."""

Kind = Literal["counter", "gauge"]


class GenAiHistograms:
    """The GenAI client histograms (a `metrics.GenAiRecorder`)."""

    def __init__(self, meter: Meter) -> None:
        self._tokens = meter.create_histogram(
            semconv.TOKEN_USAGE,
            unit=semconv.TOKEN_USAGE_UNIT,
            description="Tokens a model call used, as its provider reported them",
            explicit_bucket_boundaries_advisory=[float(b) for b in semconv.TOKEN_BUCKETS],
        )
        self._duration = meter.create_histogram(
            semconv.OPERATION_DURATION,
            unit=semconv.OPERATION_DURATION_UNIT,
            description="A model call's duration, from its start to its answer's end",
            explicit_bucket_boundaries_advisory=semconv.DURATION_BUCKETS,
        )

    def token_usage(self, key: tuple[str, ...], tokens: float) -> None:
        """Record one token count; `key` holds `semconv.TOKEN_USAGE_ATTRIBUTES`' values."""
        self._tokens.record(tokens, dict(zip(semconv.TOKEN_USAGE_ATTRIBUTES, key, strict=True)))

    def operation_duration(self, key: tuple[str, ...], seconds: float) -> None:
        """Record one duration; `key` as `semconv.OPERATION_DURATION_ATTRIBUTES`, "" no error."""
        attributes = dict(zip(semconv.OPERATION_DURATION_ATTRIBUTES, key, strict=True))
        if not attributes[semconv.ERROR_TYPE]:
            del attributes[semconv.ERROR_TYPE]
        self._duration.record(seconds, attributes)


def _instruments(family: Metric) -> Iterator[tuple[str, str, Kind]]:
    """(instrument name, the Prometheus sample it reads, kind) for each instrument of `family`."""
    name = family.name
    if family.type == "counter":
        yield name, f"{name}_total", "counter"
    elif family.type == "gauge":
        yield name, name, "gauge"
    elif family.type == "histogram":
        yield f"{name}_count", f"{name}_count", "counter"
        yield f"{name}_sum", f"{name}_sum", "counter"


class RegistryBridge:
    """A Prometheus registry's families as observable instruments, read at export time.

    One export calls every instrument's callback: the first to find its values gone
    collects the whole registry once and leaves the other instruments theirs, so an
    export reads the registry once, not once per instrument. The callbacks run on the
    reader's thread; the registry's collectors copy their dicts in one step each.
    """

    def __init__(self, registry: CollectorRegistry, meter: Meter) -> None:
        self._registry = registry
        self._lock = threading.Lock()
        self._pending: dict[str, list[Observation]] = {}
        for family in self._families():
            for name, _, kind in _instruments(family):
                callback = partial(self._observe, name)
                if kind == "counter":
                    meter.create_observable_counter(
                        name, [callback], description=family.documentation
                    )
                else:
                    meter.create_observable_gauge(
                        name, [callback], description=family.documentation
                    )

    def _families(self) -> Iterable[Metric]:
        return (family for family in self._registry.collect() if family.name not in NATIVE_FAMILIES)

    def _snapshot(self) -> dict[str, list[Observation]]:
        """Every instrument's observations, from one collection of the registry."""
        snapshot: dict[str, list[Observation]] = {}
        for family in self._families():
            for name, sample_name, _ in _instruments(family):
                snapshot[name] = [
                    Observation(sample.value, sample.labels)
                    for sample in family.samples
                    if sample.name == sample_name
                ]
        return snapshot

    def _observe(self, name: str, options: CallbackOptions) -> Iterable[Observation]:
        with self._lock:
            observations = self._pending.pop(name, None)
            if observations is None:
                self._pending = self._snapshot()
                observations = self._pending.pop(name, [])
        return observations


class OtelMetrics:
    """Exports the GenAI histograms and a Prometheus registry over OTLP/HTTP protobuf."""

    def __init__(
        self,
        metrics_url: str,
        *,
        service: str,
        registry: CollectorRegistry,
        interval_ms: float,
        timeout_ms: float,
    ) -> None:
        self.interval_seconds = interval_ms / 1000
        """How often the reader exports."""
        reader = PeriodicExportingMetricReader(
            OTLPMetricExporter(metrics_url),
            export_interval_millis=interval_ms,
            export_timeout_millis=timeout_ms,
        )
        self._provider = MeterProvider(metric_readers=[reader], resource=service_resource(service))
        meter = self._provider.get_meter(METER, schema_url=semconv.SCHEMA_URL)
        self.histograms = GenAiHistograms(meter)
        RegistryBridge(registry, meter)

    def force_flush(self) -> bool:
        """Export every instrument's values now; False when the export did not finish in time."""
        return self._provider.force_flush()

    def shutdown(self) -> None:
        """Export a last time and stop."""
        self._provider.shutdown()
