"""The OpenTelemetry SDK behind `gateway.observability.tracing` (the `[otel]` extra).

Imported only by `setup_tracing` when `telemetry.otlp_endpoint` is set. Spans are batched
(`BatchSpanProcessor`) and posted as OTLP/HTTP protobuf to `<endpoint>/v1/traces`; the
SDK reads the standard variables (`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`,
`OTEL_TRACES_SAMPLER`, `OTEL_BSP_*`, `OTEL_EXPORTER_OTLP_HEADERS`, `..._TIMEOUT`,
`..._COMPRESSION`, `OTEL_PROPAGATORS`). The provider is this tracer's own, not the
global one, so libraries that trace through the global API (redis-py 8) stay unrecorded.
A failed span records `error.type` and an ERROR status without a description: an
exception's message may quote a user's text or a secret.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import AbstractContextManager, contextmanager

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Status, StatusCode

from gateway.observability.tracing import (
    ERROR_TYPE,
    NO_SPAN,
    SCHEMA_URL,
    Attributes,
    AttributeValue,
    Span,
    SpanKind,
)

_KINDS = {
    "internal": trace.SpanKind.INTERNAL,
    "server": trace.SpanKind.SERVER,
    "client": trace.SpanKind.CLIENT,
}


class _OtelSpan:
    """An SDK span seen through `tracing.Span`."""

    __slots__ = ("_span",)

    def __init__(self, span: trace.Span) -> None:
        self._span = span

    def set_attribute(self, key: str, value: AttributeValue) -> None:
        """Set one attribute."""
        self._span.set_attribute(key, value)

    def set_error(self, error_type: str) -> None:
        """`error.type` and an ERROR status with no description."""
        self._span.set_attribute(ERROR_TYPE, error_type)
        self._span.set_status(Status(StatusCode.ERROR))


class OtelTracer:
    """Exports spans over OTLP/HTTP protobuf to `traces_url`."""

    enabled = True

    def __init__(self, traces_url: str, *, service: str, capture_content: bool) -> None:
        self.capture_content = capture_content
        attributes: dict[str, AttributeValue] = {}
        if not os.environ.get("OTEL_SERVICE_NAME"):
            attributes[SERVICE_NAME] = service
        self._provider = TracerProvider(resource=Resource.create(attributes))
        self._provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(traces_url)))
        self._tracer = self._provider.get_tracer("loopwarden", schema_url=SCHEMA_URL)

    def span(
        self,
        name: str,
        attributes: Attributes,
        *,
        kind: SpanKind = "internal",
        parent: Mapping[str, str] | None = None,
        root: bool = False,
    ) -> AbstractContextManager[Span]:
        """A span current inside the block; see `tracing.Tracer.span`."""
        context = Context() if root else None
        if parent is not None:
            context = propagate.extract(parent)
        return self._span(name, attributes, _KINDS[kind], context)

    @contextmanager
    def _span(
        self,
        name: str,
        attributes: Attributes,
        kind: trace.SpanKind,
        context: Context | None,
    ) -> Iterator[Span]:
        with self._tracer.start_as_current_span(
            name,
            context=context,
            kind=kind,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            wrapped = _OtelSpan(span)
            try:
                yield wrapped
            except BaseException as exc:
                wrapped.set_error(type(exc).__name__)
                raise

    def current(self) -> Span:
        """The current span, or `NO_SPAN` when none is recording."""
        span = trace.get_current_span()
        return _OtelSpan(span) if span.is_recording() else NO_SPAN

    def inject(self, headers: MutableMapping[str, str]) -> None:
        """The current context's `traceparent`/`tracestate` (per `OTEL_PROPAGATORS`)."""
        propagate.inject(headers)

    def force_flush(self) -> bool:
        """Export every finished span now."""
        return self._provider.force_flush()

    def shutdown(self) -> None:
        """Flush and stop."""
        self._provider.shutdown()
