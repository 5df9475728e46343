"""Telemetry set-up: the tracer `telemetry:` asks for, installed for the whole process.

The composition roots (the CLI's `run` and `proxy`, the demo) call `setup_tracing` once at
start-up and `reset_tracing` when they stop. The OpenTelemetry SDK is imported here, lazily,
and only when `telemetry.otlp_endpoint` is set.
"""

from __future__ import annotations

from gateway.app.errors import ConfigError
from gateway.config import TelemetryConfig
from gateway.observability import tracing


def setup_tracing(config: TelemetryConfig, service: str) -> tracing.Tracer:
    """Install the tracer `config` asks for and return it.

    `service` is the default `service.name` (`OTEL_SERVICE_NAME` wins). With no
    `otlp_endpoint` that is `tracing.NO_TRACER`, and OpenTelemetry stays unimported.
    """
    url = config.traces_url
    if url is None:
        tracing.install(tracing.NO_TRACER)
        return tracing.NO_TRACER
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
