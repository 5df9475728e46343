"""Telemetry set-up: the tracer and the metrics export `telemetry:` asks for.

The composition roots (the CLI's `run` and `proxy`) call `setup_telemetry` once at
start-up with their metrics, and `Telemetry.shutdown` when they stop; `setup_tracing`
and `reset_tracing` do the tracer alone. The OpenTelemetry SDK is imported here, lazily,
and only when `telemetry.otlp_endpoint` is set.

Decisions where DESIGN.md is silent: `OTEL_METRIC_EXPORT_INTERVAL` and
`OTEL_METRIC_EXPORT_TIMEOUT` are checked here, not left to the SDK (which raises on 0,
spins on a tiny interval and never exports at `inf` or past `threading`'s largest
timeout): each is a number of milliseconds from 100 to 86,400,000 (a day), or a
`ConfigError` naming the variable. So are the OTLP exporters' request timeouts
(`OTEL_EXPORTER_OTLP_TIMEOUT`, `OTEL_EXPORTER_OTLP_TRACES_TIMEOUT`,
`OTEL_EXPORTER_OTLP_METRICS_TIMEOUT`), which the SDK would take as `inf`, negative or
1e308: a number of seconds (the unit the Python SDK reads, not the specification's
milliseconds) from 0.1 to 3,600. Every such value is written in ASCII: `float` also
reads look-alike digits such as `١٢`.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol

from prometheus_client import CollectorRegistry

from gateway.app.errors import ConfigError
from gateway.config import TelemetryConfig
from gateway.observability import tracing
from gateway.observability.metrics import ModelCallMetrics

if TYPE_CHECKING:  # imported at run time only when metrics are exported
    from gateway.observability.otel_metrics import OtelMetrics

EXPORT_MILLISECONDS = (100.0, 86_400_000.0)
"""The bounds of `OTEL_METRIC_EXPORT_INTERVAL` and `OTEL_METRIC_EXPORT_TIMEOUT`."""
EXPORT_DEFAULTS = {"OTEL_METRIC_EXPORT_INTERVAL": 60_000.0, "OTEL_METRIC_EXPORT_TIMEOUT": 30_000.0}
"""The specification's defaults, in milliseconds."""
REQUEST_SECONDS = (0.1, 3_600.0)
"""The bounds of the OTLP exporters' request timeouts, in seconds (the SDK's unit)."""
TRACES_TIMEOUTS = ("OTEL_EXPORTER_OTLP_TIMEOUT", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT")
METRICS_TIMEOUTS = ("OTEL_EXPORTER_OTLP_TIMEOUT", "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT")


class ExportedMetrics(Protocol):
    """A server's metrics (`Metrics`, `ProxyMetrics`): its registry and its model calls."""

    registry: CollectorRegistry
    model_calls: ModelCallMetrics


class Telemetry:
    """What `setup_telemetry` started: the tracer and, when on, the metrics export."""

    def __init__(
        self,
        tracer: tracing.Tracer,
        metrics: OtelMetrics | None = None,
        detach: Callable[[], None] | None = None,
    ) -> None:
        self.tracer = tracer
        self.metrics = metrics
        self._detach = detach

    async def keep_fresh(self, refresh: Callable[[], Awaitable[None]]) -> None:
        """Await `refresh` now and every export interval until cancelled (metrics off: never).

        For figures a `/metrics` scrape reads first (the proxy's budget gauges): over OTLP
        nothing scrapes, so they are read once an interval instead.
        """
        if self.metrics is None:
            return
        while True:
            await refresh()
            await asyncio.sleep(self.metrics.interval_seconds)

    def force_flush(self) -> bool:
        """Export every finished span and every metric now; False when one did not finish."""
        spans = self.tracer.force_flush()
        return (self.metrics is None or self.metrics.force_flush()) and spans

    def shutdown(self) -> None:
        """Stop recording, export the metrics a last time, flush and stop the tracer."""
        if self._detach is not None:
            self._detach()
        if self.metrics is not None:
            self.metrics.shutdown()
        reset_tracing()


def _milliseconds(variable: str) -> float:
    """The variable's milliseconds (its default when unset), checked against the bounds."""
    value = _bounded(variable, EXPORT_MILLISECONDS, "milliseconds")
    return EXPORT_DEFAULTS[variable] if value is None else value


def _check_timeouts(variables: tuple[str, ...]) -> None:
    """Refuse an OTLP request timeout outside `REQUEST_SECONDS` (the SDK reads them itself)."""
    for variable in variables:
        _bounded(variable, REQUEST_SECONDS, "seconds")


def _bounded(variable: str, bounds: tuple[float, float], unit: str) -> float | None:
    """The variable's number (None when unset); a `ConfigError` naming it unless within
    `bounds` and written in ASCII (the value itself is never quoted: it may hold anything)."""
    text = os.environ.get(variable, "").strip()
    if not text:
        return None
    low, high = bounds
    value = math.nan
    if text.isascii():
        with contextlib.suppress(ValueError):
            value = float(text)
    if not low <= value <= high:
        raise ConfigError(variable, f"must be a number of {unit} from {low:,g} to {high:,.0f}")
    return value


def setup_telemetry(config: TelemetryConfig, service: str, metrics: ExportedMetrics) -> Telemetry:
    """Start the traces and metrics export `config` asks for; `Telemetry.shutdown` stops them.

    With an `otlp_endpoint`, `metrics`' GenAI histograms are recorded over OTLP too and
    every other family of its registry is read at each export
    (`gateway.observability.otel_metrics`).
    """
    url = config.metrics_url
    if url is None:
        return Telemetry(setup_tracing(config, service))
    interval = _milliseconds("OTEL_METRIC_EXPORT_INTERVAL")
    timeout = _milliseconds("OTEL_METRIC_EXPORT_TIMEOUT")
    _check_timeouts(METRICS_TIMEOUTS)
    tracer = setup_tracing(config, service)
    # The SDK is there: setup_tracing raised otherwise.
    from gateway.observability.otel_metrics import OtelMetrics

    exporter = OtelMetrics(
        url,
        service=service,
        registry=metrics.registry,
        interval_ms=interval,
        timeout_ms=timeout,
    )
    detach = metrics.model_calls.also_record(exporter.histograms)
    return Telemetry(tracer, exporter, detach)


def setup_tracing(config: TelemetryConfig, service: str) -> tracing.Tracer:
    """Install the tracer `config` asks for and return it.

    `service` is the default `service.name` (`OTEL_SERVICE_NAME` wins). With no
    `otlp_endpoint` that is `tracing.NO_TRACER`, and OpenTelemetry stays unimported.
    """
    url = config.traces_url
    if url is None:
        tracing.install(tracing.NO_TRACER)
        return tracing.NO_TRACER
    _check_timeouts(TRACES_TIMEOUTS)
    try:
        from gateway.observability.otel import OtelTracer
    except ImportError:
        raise ConfigError(
            "telemetry.otlp_endpoint",
            "tracing needs the OpenTelemetry SDK: install loopwarden's [otel] extra",
        ) from None

    active = OtelTracer(url, service=service, capture_content=config.capture_content)
    tracing.install(active)
    return active


def reset_tracing() -> None:
    """Flush and stop the installed tracer, and go back to `tracing.NO_TRACER`."""
    active = tracing.tracer()
    tracing.install(tracing.NO_TRACER)
    active.shutdown()
