"""The `telemetry:` section: where traces go over OTLP, and whether spans carry message text.

Decisions where DESIGN.md is silent:
- `otlp_endpoint` is the collector's base URL (`http(s)://host:port`, checked like every URL
  of the config, `gateway.config.urls`); traces go to `<endpoint>/v1/traces` and metrics
  to `<endpoint>/v1/metrics`. Unset (the default), both are off and nothing of
  OpenTelemetry is imported (`gateway.observability.telemetry`).
- The endpoint may carry a path (a collector behind a reverse proxy at `/otel`) but no
  credentials, query or fragment: headers an endpoint needs come from the standard
  `OTEL_EXPORTER_OTLP_HEADERS`, which the SDK reads and never logs.
"""

from __future__ import annotations

from typing import Annotated
from urllib.parse import urlsplit

from pydantic import AfterValidator

from gateway.config.base import Frozen
from gateway.config.urls import http_url


def _endpoint(value: str | None) -> str | None:
    if value is None:
        return None
    parts = urlsplit(http_url(value))
    if parts.username is not None or parts.password is not None:
        raise ValueError("must not carry credentials (use OTEL_EXPORTER_OTLP_HEADERS)")
    if parts.query or parts.fragment:
        raise ValueError("must not have a query or fragment")
    return value.rstrip("/")


OtlpEndpoint = Annotated[str | None, AfterValidator(_endpoint)]
"""An OTLP/HTTP collector's base URL, e.g. `http://127.0.0.1:4318` (None: tracing off)."""


class TelemetryConfig(Frozen):
    """OpenTelemetry export: off unless `otlp_endpoint` is set; text in spans only by choice."""

    otlp_endpoint: OtlpEndpoint = None
    capture_content: bool = False

    @property
    def traces_url(self) -> str | None:
        """Where spans are posted (`<otlp_endpoint>/v1/traces`), or None when tracing is off."""
        return None if self.otlp_endpoint is None else f"{self.otlp_endpoint}/v1/traces"

    @property
    def metrics_url(self) -> str | None:
        """Where metrics are posted (`<otlp_endpoint>/v1/metrics`), or None when export is off."""
        return None if self.otlp_endpoint is None else f"{self.otlp_endpoint}/v1/metrics"
