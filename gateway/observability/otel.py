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
from collections.abc import Mapping, MutableMapping
from contextlib import AbstractContextManager
from types import TracebackType

from opentelemetry import context as context_api
from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.instrumentation.aiohttp_client import AioHttpClientInstrumentor
from opentelemetry.sdk.environment_variables import (
    OTEL_BSP_MAX_EXPORT_BATCH_SIZE,
    OTEL_BSP_MAX_QUEUE_SIZE,
)
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

EXPORT_BATCH = 2048
"""Spans an export posts at most: the SDK's 512 wakes its export thread 4 times as often."""

_KINDS = {
    "internal": trace.SpanKind.INTERNAL,
    "server": trace.SpanKind.SERVER,
    "client": trace.SpanKind.CLIENT,
}


def _export_batch_size() -> int | None:
    """`EXPORT_BATCH`, at most `OTEL_BSP_MAX_QUEUE_SIZE`; None: `OTEL_BSP_MAX_EXPORT_BATCH_SIZE`."""
    if os.environ.get(OTEL_BSP_MAX_EXPORT_BATCH_SIZE):
        return None
    queue = os.environ.get(OTEL_BSP_MAX_QUEUE_SIZE, "").strip()
    if queue.isdigit() and int(queue) > 0:
        return min(EXPORT_BATCH, int(queue))
    return EXPORT_BATCH


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


class _Current(_OtelSpan):
    """A started span made current for a `with` block, and ended when the block ends.

    One slotted object instead of `start_as_current_span`'s two generator context
    managers: the SDK's context attach/detach and `end` are all that is left per span.
    An exception leaving the block marks the span failed with its type's name.
    """

    __slots__ = ("_token",)

    def __enter__(self) -> Span:
        self._token = context_api.attach(trace.set_span_in_context(self._span))
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if kind is not None:
            self.set_error(kind.__name__)
        self._span.end()
        context_api.detach(self._token)


class OtelTracer:
    """Exports spans over OTLP/HTTP protobuf to `traces_url`."""

    enabled = True

    def __init__(self, traces_url: str, *, service: str, capture_content: bool) -> None:
        self.capture_content = capture_content
        attributes: dict[str, AttributeValue] = {}
        if not os.environ.get("OTEL_SERVICE_NAME"):
            attributes[SERVICE_NAME] = service
        self._provider = TracerProvider(resource=Resource.create(attributes))
        processor = BatchSpanProcessor(
            OTLPSpanExporter(traces_url), max_export_batch_size=_export_batch_size()
        )
        self._provider.add_span_processor(processor)
        self._tracer = self._provider.get_tracer("loopwarden", schema_url=SCHEMA_URL)
        # Outbound HTTP (platform APIs, model APIs, MCP over HTTP): a client span under the
        # current span, on our provider (not the global one), for as long as tracing is on.
        self._http = AioHttpClientInstrumentor()
        self._http.instrument(tracer_provider=self._provider)

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
        started = self._tracer.start_span(
            name,
            context,
            _KINDS[kind],
            attributes,
            record_exception=False,
            set_status_on_exception=False,
        )
        return _Current(started)

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
        """Flush and stop, and stop tracing outbound HTTP."""
        self._http.uninstrument()
        self._provider.shutdown()
