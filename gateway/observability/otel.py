"""The OpenTelemetry SDK behind `gateway.observability.tracing` (the `[otel]` extra).

Imported only by `setup_tracing` when `telemetry.otlp_endpoint` is set. Spans are posted
as OTLP/HTTP protobuf to `<endpoint>/v1/traces` by the SDK's exporter, which reads the
standard variables (`OTEL_EXPORTER_OTLP_HEADERS`, `..._TIMEOUT`, `..._COMPRESSION`); the
resource reads `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES`, the sampler
`OTEL_TRACES_SAMPLER`/`_ARG`, the attribute limits `OTEL_SPAN_ATTRIBUTE_*`, the
propagators `OTEL_PROPAGATORS`, and the export schedule `OTEL_BSP_*`
(`gateway.observability.otel_batch`).

A span costs the event loop little: it is a slotted record (ids from `random.getrandbits`,
`time.time_ns` times, the attributes as given) made current in one context variable and,
once ended, appended to the export queue. The export thread turns records into the SDK's
`ReadableSpan` (applying the attribute limits) and calls the exporter. The sampler
decides once per trace root (a root, or a span continuing another process's trace); the
spans under it inherit the decision. Outbound HTTP spans (the aiohttp client
instrumentation) are the SDK's own, started under loopwarden's current span, and join
the same queue. The provider is this tracer's own, not the global one, so libraries
that trace through the global API (redis-py 8) stay unrecorded. A failed span records
`error.type` and an ERROR status without a description: an exception's message may quote
a user's text or a secret.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping, Sequence
from contextlib import AbstractContextManager
from contextvars import ContextVar
from random import getrandbits
from time import time_ns
from types import TracebackType

from opentelemetry import propagate, trace
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.instrumentation.aiohttp_client import AioHttpClientInstrumentor
from opentelemetry.sdk.environment_variables import OTEL_SERVICE_NAME
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    DEFAULT_OFF,
    DEFAULT_ON,
    Decision,
    Sampler,
)
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    NonRecordingSpan,
    SpanContext,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
)
from opentelemetry.util import types

from gateway.observability.otel_batch import SpanBatcher
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
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_NOT_SAMPLED = TraceFlags(TraceFlags.DEFAULT)
_NO_STATE = TraceState()
_ROOT = Context()
"""The context a trace root is sampled in: no parent, whatever OpenTelemetry's holds."""
_OK = Status(StatusCode.UNSET)
_FAILED = Status(StatusCode.ERROR)


class _Trace:
    """What the spans of one trace share here: its id, the sampling decision made at its
    root, the `tracestate`, and the queue they end in. `caller` is the root's parent when
    that is another process's span (the proxy's traced caller), else 0."""

    __slots__ = ("caller", "queue", "sampled", "state", "trace_id")

    def __init__(
        self, queue: _Queue, trace_id: int, sampled: bool, state: TraceState, caller: int
    ) -> None:
        self.queue = queue
        self.trace_id = trace_id
        self.sampled = sampled
        self.state = state
        self.caller = caller

    def span_context(self, span_id: int, *, remote: bool = False) -> SpanContext:
        """A span of this trace as OpenTelemetry's API names one."""
        flags = _SAMPLED if self.sampled else _NOT_SAMPLED
        return SpanContext(self.trace_id, span_id, remote, flags, self.state)


class _Record:
    """One span as the hot path records it; `tracing.Span` and its own context manager.

    The attributes are kept as given (`extra` holds those set later), the parent as an id;
    the export thread makes the SDK's `ReadableSpan` of it. Unsampled records record
    nothing and are never queued; they exist so that their trace id and flags propagate.
    """

    __slots__ = (
        "_token",
        "attributes",
        "end",
        "error",
        "extra",
        "kind",
        "name",
        "parent_id",
        "span_id",
        "start",
        "trace",
    )

    def __init__(
        self, name: str, kind: SpanKind, attributes: Attributes, trace: _Trace, parent_id: int
    ) -> None:
        self.name = name
        self.kind = kind
        self.attributes = attributes
        self.extra: dict[str, types.AttributeValue] | None = None
        self.trace = trace
        self.span_id = getrandbits(64) or 1  # 0 is the invalid id; 1 in 2**64 becomes 1
        self.parent_id = parent_id
        self.error = False
        self.end = 0
        self.start = time_ns()

    def set_attribute(self, key: str, value: AttributeValue) -> None:
        """Set one attribute (an ended span keeps what it had, as the SDK's does)."""
        if self.end:
            return
        if self.extra is None:
            self.extra = {key: value}
        else:
            self.extra[key] = value

    def set_error(self, error_type: str) -> None:
        """`error.type` and an ERROR status with no description."""
        self.set_attribute(ERROR_TYPE, error_type)
        self.error = True

    def __enter__(self) -> Span:
        self._token = _current.set(self)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if kind is not None:
            self.set_error(kind.__name__)
        self.end = time_ns()
        _current.reset(self._token)
        del self._token  # freed now, not held in the queue until the export
        trace = self.trace
        if trace.sampled:
            trace.queue.add(self)


_Queue = SpanBatcher[_Record | ReadableSpan]
_current: ContextVar[_Record | None] = ContextVar("loopwarden_span", default=None)


class OtelTracer:
    """Exports spans over OTLP/HTTP protobuf to `traces_url`."""

    enabled = True

    def __init__(self, traces_url: str, *, service: str, capture_content: bool) -> None:
        self.capture_content = capture_content
        attributes: dict[str, AttributeValue] = {}
        if not os.environ.get(OTEL_SERVICE_NAME):
            attributes[SERVICE_NAME] = service
        exporter = OTLPSpanExporter(traces_url)
        self._exporter = exporter
        self._queue: _Queue = SpanBatcher(self._export, exporter.shutdown)
        self._provider = TracerProvider(resource=Resource.create(attributes))
        self._provider.add_span_processor(_Queued(self._queue))
        self._sampler = self._provider.sampler
        self._roots_sampled = _fixed_root_decision(self._sampler)
        self._limits = SpanLimits()
        self._scope = InstrumentationScope("loopwarden", schema_url=SCHEMA_URL)
        # Outbound HTTP (platform APIs, model APIs, MCP over HTTP): a client span under the
        # current span, on our provider (not the global one), for as long as tracing is on.
        self._http = AioHttpClientInstrumentor()
        self._http.instrument(tracer_provider=_UnderCurrentProvider(self._provider))

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
        current = None if root or parent is not None else _current.get()
        if current is not None:
            return _Record(name, kind, attributes, current.trace, current.span_id)
        if parent is None and self._roots_sampled is not None:
            trace_id = getrandbits(128) or 1
            begun = _Trace(self._queue, trace_id, self._roots_sampled, _NO_STATE, 0)
            return _Record(name, kind, attributes, begun, 0)
        return self._root(name, attributes, kind, parent)

    def _root(
        self, name: str, attributes: Attributes, kind: SpanKind, parent: Mapping[str, str] | None
    ) -> _Record:
        """The first span of a trace here, or here of a caller's: the sampler decides."""
        context = _ROOT if parent is None else propagate.extract(parent, _ROOT)
        caller = trace.get_current_span(context).get_span_context()
        caller_id = caller.span_id if caller.is_valid else 0
        trace_id = caller.trace_id if caller.is_valid else getrandbits(128) or 1
        decided = self._sampler.should_sample(context, trace_id, name, _KINDS[kind], attributes)
        sampled = decided.decision is Decision.RECORD_AND_SAMPLE
        begun = _Trace(self._queue, trace_id, sampled, decided.trace_state or _NO_STATE, caller_id)
        record = _Record(name, kind, attributes, begun, caller_id)
        if decided.attributes:
            record.extra = dict(decided.attributes)
        return record

    def instant(self, name: str, attributes: Attributes) -> None:
        """A span that ends as it starts, under the current span (a trace of its own outside)."""
        current = _current.get()
        if current is None:
            with self.span(name, attributes):
                return
        begun = current.trace
        if begun.sampled:
            record = _Record(name, "internal", attributes, begun, current.span_id)
            record.end = record.start
            begun.queue.add(record)

    def current(self) -> Span:
        """The current span, or `NO_SPAN` when none is recording."""
        record = _current.get()
        return record if record is not None and record.trace.sampled else NO_SPAN

    def inject(self, headers: MutableMapping[str, str]) -> None:
        """The current span's `traceparent`/`tracestate` (per `OTEL_PROPAGATORS`)."""
        propagate.inject(headers, _under_current(None))

    def force_flush(self) -> bool:
        """Export every finished span now."""
        return self._queue.flush()

    def shutdown(self) -> None:
        """Flush and stop, and stop tracing outbound HTTP."""
        self._http.uninstrument()
        self._provider.shutdown()

    def _export(self, batch: list[_Record | ReadableSpan]) -> None:
        """Post one batch (on the export thread): records become the SDK's spans first."""
        self._exporter.export(
            [span if isinstance(span, ReadableSpan) else self._readable(span) for span in batch]
        )

    def _readable(self, record: _Record) -> ReadableSpan:
        """The SDK's span of `record`, its attributes held to `OTEL_SPAN_ATTRIBUTE_*_LIMIT`."""
        given: dict[str, types.AttributeValue] = dict(record.attributes)
        if record.extra is not None:
            given.update(record.extra)
        attributes: types.Attributes = given
        limits = self._limits
        if len(given) > (limits.max_span_attributes or 0) or limits.max_span_attribute_length:
            attributes = BoundedAttributes(
                limits.max_span_attributes,
                given,
                immutable=True,
                max_value_len=limits.max_span_attribute_length,
            )
        begun, parent_id = record.trace, record.parent_id
        parent = None
        if parent_id:
            parent = begun.span_context(parent_id, remote=parent_id == begun.caller)
        return ReadableSpan(
            name=record.name,
            context=begun.span_context(record.span_id),
            parent=parent,
            resource=self._provider.resource,
            attributes=attributes,
            kind=_KINDS[record.kind],
            status=_FAILED if record.error else _OK,
            start_time=record.start,
            end_time=record.end,
            instrumentation_scope=self._scope,
        )


def _fixed_root_decision(sampler: Sampler) -> bool | None:
    """The decision `sampler` makes for every trace begun here (None: it varies).

    The SDK's always-on and always-off samplers, plain or parent-based (the default), so
    a root span does not ask the sampler each time what it always answers.
    """
    if sampler is ALWAYS_ON or sampler is DEFAULT_ON:
        return True
    if sampler is ALWAYS_OFF or sampler is DEFAULT_OFF:
        return False
    return None


def _under_current(context: Context | None) -> Context | None:
    """`context`, or one whose span is loopwarden's current span (None: OpenTelemetry's own).

    How OpenTelemetry's API (the propagators, the SDK's tracer) sees loopwarden's span,
    made only when something asks: an outbound request, not every span.
    """
    if context is not None:
        return context
    record = _current.get()
    if record is None:
        return None
    return trace.set_span_in_context(NonRecordingSpan(record.trace.span_context(record.span_id)))


class _UnderCurrentProvider(trace.TracerProvider):
    """The aiohttp client instrumentation's provider: the SDK's tracers, seen through
    `_UnderCurrent`."""

    def __init__(self, provider: TracerProvider) -> None:
        self._provider = provider

    def get_tracer(
        self,
        instrumenting_module_name: str,
        instrumenting_library_version: str | None = None,
        schema_url: str | None = None,
        attributes: types.Attributes = None,
    ) -> trace.Tracer:
        """The SDK's tracer for that library, starting its spans under the current span."""
        return _UnderCurrent(
            self._provider.get_tracer(
                instrumenting_module_name, instrumenting_library_version, schema_url, attributes
            )
        )


class _UnderCurrent(trace.Tracer):
    """An SDK tracer whose spans without a given parent go under loopwarden's current span."""

    def __init__(self, tracer: trace.Tracer) -> None:
        self._tracer = tracer

    def start_span(  # noqa: PLR0917 - the API's signature
        self,
        name: str,
        context: Context | None = None,
        kind: trace.SpanKind = trace.SpanKind.INTERNAL,
        attributes: types.Attributes = None,
        links: Sequence[trace.Link] | None = None,
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
    ) -> trace.Span:
        """The SDK's span, its parent the current span unless `context` names one."""
        return self._tracer.start_span(
            name,
            _under_current(context),
            kind,
            attributes,
            links,
            start_time,
            record_exception,
            set_status_on_exception,
        )

    def start_as_current_span(  # type: ignore[override]  # noqa: PLR0917 - the API's
        self,
        name: str,
        context: Context | None = None,
        kind: trace.SpanKind = trace.SpanKind.INTERNAL,
        attributes: types.Attributes = None,
        links: Sequence[trace.Link] | None = None,
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
        end_on_exit: bool = True,
    ) -> AbstractContextManager[trace.Span]:
        """As `start_span`, current in OpenTelemetry's context inside the block.

        (The API types its result as a private context-manager class, hence the ignore.)
        """
        return self._tracer.start_as_current_span(
            name,
            _under_current(context),
            kind,
            attributes,
            links,
            start_time,
            record_exception,
            set_status_on_exception,
            end_on_exit,
        )


class _Queued(SpanProcessor):
    """Puts the SDK's own finished spans (outbound HTTP) on loopwarden's export queue."""

    def __init__(self, queue: SpanBatcher[_Record | ReadableSpan]) -> None:
        self._queue = queue

    def on_end(self, span: ReadableSpan) -> None:
        """Queue a sampled span."""
        if span.context is not None and span.context.trace_flags.sampled:
            self._queue.add(span)

    def shutdown(self) -> None:
        """Export what is queued and stop (the provider's shutdown, also at exit)."""
        self._queue.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Export what is queued now."""
        return self._queue.flush(timeout_millis / 1000)
