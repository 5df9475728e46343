"""The OpenTelemetry SDK behind `gateway.observability.tracing` (the `[otel]` extra).

Imported only by `setup_tracing` when `telemetry.otlp_endpoint` is set. Spans are posted
as OTLP/HTTP protobuf to `<endpoint>/v1/traces` by the SDK's exporter, which reads the
standard variables (`OTEL_EXPORTER_OTLP_HEADERS`, `..._TIMEOUT`, `..._COMPRESSION`); the
resource reads `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES`, the sampler
`OTEL_TRACES_SAMPLER`/`_ARG`, the attribute limits `OTEL_SPAN_ATTRIBUTE_*`, the
propagators `OTEL_PROPAGATORS`, and the export schedule `OTEL_BSP_*`
(`gateway.observability.otel_batch`).

A span costs the event loop little: it is a slotted record (`time.time_ns` times, the
attributes as given, its parent's record) made current in one context variable and, once
ended, appended to the export queue; a zero-length span (`instant`) is a tuple with one
clock reading. Ids are drawn when first asked for, by the export thread or by an
outbound request carrying the span's context, never on the hot path. The export thread
turns records into the SDK's `ReadableSpan` (applying the attribute limits only when
they can cut anything) and calls the exporter. The sampler
decides once per trace root (a root, or a span continuing another process's trace); the
spans under it inherit the decision. Outbound HTTP spans (the aiohttp client
instrumentation) are the SDK's own, started under loopwarden's current span, and join
the same queue. The provider is this tracer's own, not the global one, so libraries
that trace through the global API (redis-py 8) stay unrecorded. A failed span records
`error.type` and an ERROR status without a description: an exception's message may quote
a user's text or a secret.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, MutableMapping, Sequence
from contextlib import AbstractContextManager
from contextvars import ContextVar, Token
from random import getrandbits
from time import time_ns
from types import TracebackType

from opentelemetry import propagate, trace
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.instrumentation.aiohttp_client import AioHttpClientInstrumentor
from opentelemetry.sdk.resources import Resource
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
from gateway.observability.otel_resource import service_resource
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
_FAILED = Status(StatusCode.ERROR)
_IDS = threading.Lock()
"""Held while an id is drawn for a span or trace that has none yet: the event loop (an
outbound request) and the export thread may both ask for the same one first."""


class _Decision:
    """What every span of a trace shares here: the sampling decision made at its root, the
    `tracestate`, the queue the spans end in and, for a trace the sampler was asked about,
    its id and the caller's span id when it continues another process's trace (0: none).
    Traces begun here under a sampler whose answer is fixed share one (`trace_id` 0: each
    draws its own when asked)."""

    __slots__ = ("caller", "queue", "sampled", "state", "trace_id")

    def __init__(  # noqa: PLR0913, PLR0917 - a trace's fields
        self, queue: _Queue, sampled: bool, state: TraceState, trace_id: int, caller: int
    ) -> None:
        self.queue = queue
        self.sampled = sampled
        self.state = state
        self.trace_id = trace_id
        self.caller = caller


class _Record:
    """One span as the hot path records it; `tracing.Span` and its own context manager.

    The attributes are kept as given (`extra` holds those set later), the parent as its
    record (None for the first span here of a trace). Its ids are drawn only when asked
    for (`_span_context`): by the export thread, or by an outbound request carrying the
    span's context. The export thread makes the SDK's `ReadableSpan` of it. Unsampled
    records record nothing and are never queued; they exist so that their trace id and
    flags propagate.
    """

    __slots__ = (
        "_token",
        "attributes",
        "context",
        "decision",
        "ended",
        "error",
        "extra",
        "kind",
        "name",
        "parent",
        "start",
    )

    name: str
    kind: SpanKind
    attributes: Attributes
    parent: _Record | None
    decision: _Decision
    extra: dict[str, types.AttributeValue] | None
    context: SpanContext | None
    error: bool
    ended: int
    start: int
    _token: Token[_Record | None]

    def set_attribute(self, key: str, value: AttributeValue) -> None:
        """Set one attribute (an ended span keeps what it had, as the SDK's does)."""
        if self.ended:
            return
        if self.extra is None:
            self.extra = {key: value}
        else:
            self.extra[key] = value

    def set_error(self, error_type: str) -> None:
        """`error.type` and an ERROR status with no description."""
        self.set_attribute(ERROR_TYPE, error_type)
        self.error = True

    def end(self) -> None:
        """End it (once): its parent current again and, sampled, queued for export."""
        self.ended = time_ns()
        _current.reset(self._token)
        del self._token  # freed now, not held in the queue until the export
        decision = self.decision
        if decision.sampled:  # `SpanBatcher.add` written out: a call less a span
            queue = decision.queue
            queue.items.append(self)
            if len(queue.items) >= queue.check_at:
                queue.check()

    def __enter__(self) -> Span:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if kind is not None:
            self.set_error(kind.__name__)
        self.end()


_Instant = tuple[str, Attributes, _Record, int]
"""A zero-length span as `OtelTracer.instant` queues it: name, attributes, parent, time."""
_Queue = SpanBatcher[_Record | _Instant | ReadableSpan]
_current: ContextVar[_Record | None] = ContextVar("loopwarden_span", default=None)


def _span_context(record: _Record) -> SpanContext:
    """`record` as OpenTelemetry's API names a span: its ids, drawn the first time asked.

    Made once, for the span and its children; the lock keeps the one drawn first when the
    event loop (an outbound request) and the export thread ask at once.
    """
    context = record.context
    if context is not None:
        return context
    decision, parent = record.decision, record.parent
    if parent is not None:
        trace_id = _span_context(parent).trace_id
    else:
        trace_id = decision.trace_id or getrandbits(128) or 1  # 0 is the invalid id
    flags = _SAMPLED if decision.sampled else _NOT_SAMPLED
    drawn = SpanContext(trace_id, getrandbits(64) or 1, False, flags, decision.state)
    with _IDS:
        if record.context is None:
            record.context = drawn
        return record.context


class OtelTracer:
    """Exports spans over OTLP/HTTP protobuf to `traces_url`."""

    enabled = True

    def __init__(self, traces_url: str, *, service: str, capture_content: bool) -> None:
        self.capture_content = capture_content
        exporter = OTLPSpanExporter(traces_url)
        self._exporter = exporter
        self._queue: _Queue = SpanBatcher(self._export, exporter.shutdown)
        self._resource = _Resource(service_resource(service))
        self._provider = TracerProvider(resource=self._resource)
        self._provider.add_span_processor(_Queued(self._queue))
        self._sampler = self._provider.sampler
        fixed = _fixed_root_decision(self._sampler)
        self._fixed = None if fixed is None else _Decision(self._queue, fixed, _NO_STATE, 0, 0)
        """The decision every trace begun here shares, when the sampler's answer is fixed."""
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
    ) -> _Record:
        """A span current from now until it ends; see `tracing.Tracer.span`.

        The record is made here, field by field, for every span: a helper's call, or
        calling the class with the fields, costs a traced message more than the fields.
        """
        current = None if root or parent is not None else _current.get()
        extra = None
        if current is not None:
            decision = current.decision
        elif parent is None and self._fixed is not None:
            decision = self._fixed
        else:
            decision, extra = self._root(name, attributes, kind, parent)
        record = _Record()
        record.name = name
        record.kind = kind
        record.attributes = attributes
        record.parent = current
        record.decision = decision
        record.extra = extra
        record.context = None
        record.error = False
        record.ended = 0
        record.start = time_ns()
        record._token = _current.set(record)  # noqa: SLF001 - the record's own slot
        return record

    def _root(
        self, name: str, attributes: Attributes, kind: SpanKind, parent: Mapping[str, str] | None
    ) -> tuple[_Decision, dict[str, types.AttributeValue] | None]:
        """The decision of a trace's first span here, or here of a caller's: the sampler's,
        and the attributes it adds (None: none)."""
        context = _ROOT if parent is None else propagate.extract(parent, _ROOT)
        caller = trace.get_current_span(context).get_span_context()
        caller_id = caller.span_id if caller.is_valid else 0
        trace_id = caller.trace_id if caller.is_valid else getrandbits(128) or 1
        decided = self._sampler.should_sample(context, trace_id, name, _KINDS[kind], attributes)
        sampled = decided.decision is Decision.RECORD_AND_SAMPLE
        state = decided.trace_state or _NO_STATE
        begun = _Decision(self._queue, sampled, state, trace_id, caller_id)
        return begun, dict(decided.attributes) if decided.attributes else None

    def instant(self, name: str, attributes: Attributes) -> None:
        """A span that ends as it starts, under the current span (a trace of its own outside).

        Queued as a tuple with one clock read: it is never current, so it needs no record.
        """
        current = _current.get()
        if current is None:
            with self.span(name, attributes):
                return
        decision = current.decision
        if decision.sampled:  # `SpanBatcher.add` written out, as `_Record.end` does
            queue = decision.queue
            queue.items.append((name, attributes, current, time_ns()))
            if len(queue.items) >= queue.check_at:
                queue.check()

    def current(self) -> Span:
        """The current span, or `NO_SPAN` when none is recording."""
        record = _current.get()
        return record if record is not None and record.decision.sampled else NO_SPAN

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

    def _export(self, batch: list[_Record | _Instant | ReadableSpan]) -> None:
        """Post one batch (on the export thread): records become the SDK's spans first."""
        readable = self._readable
        self._exporter.export(
            [span if isinstance(span, ReadableSpan) else readable(span) for span in batch]
        )

    def _readable(self, span: _Record | _Instant) -> ReadableSpan:
        """The SDK's span of a record or an instant, its attributes held to the limits."""
        if isinstance(span, tuple):
            name, attributes, parent, start = span
            under = _span_context(parent)
            context = SpanContext(
                under.trace_id, getrandbits(64) or 1, False, _SAMPLED, parent.decision.state
            )
            return self._made(name, "internal", context, under, attributes, start, start)
        record = span
        decision = record.decision
        context = _span_context(record)
        above = None
        if record.parent is not None:
            above = _span_context(record.parent)
        elif decision.caller:
            above = SpanContext(context.trace_id, decision.caller, True, _SAMPLED, decision.state)
        given: Mapping[str, types.AttributeValue] = record.attributes
        if record.extra is not None:
            given = {**given, **record.extra}
        return self._made(
            record.name,
            record.kind,
            context,
            above,
            given,
            record.start,
            record.ended,
            record.error,
        )

    def _made(  # noqa: PLR0913, PLR0917 - a span's fields
        self,
        name: str,
        kind: SpanKind,
        context: SpanContext,
        parent: SpanContext | None,
        attributes: Mapping[str, types.AttributeValue],
        start: int,
        end: int,
        error: bool = False,
    ) -> ReadableSpan:
        """A `ReadableSpan`; the attributes bounded only when a limit can cut them."""
        limits = self._limits
        exported: types.Attributes = attributes
        if len(attributes) > (limits.max_span_attributes or 0) or limits.max_span_attribute_length:
            exported = BoundedAttributes(
                limits.max_span_attributes,
                attributes,
                immutable=True,
                max_value_len=limits.max_span_attribute_length,
            )
        exported_span = _Exported()
        exported_span.name = name
        exported_span._context = context  # noqa: SLF001 - the slot `get_span_context` reads
        exported_span.parent = parent
        exported_span.resource = self._resource
        exported_span.attributes = exported
        exported_span.dropped_attributes = (
            exported.dropped if isinstance(exported, BoundedAttributes) else 0
        )
        exported_span.kind = _KINDS[kind]
        exported_span.status = _FAILED if error else None  # UNSET: the encoder writes none
        exported_span.start_time = start
        exported_span.end_time = end
        exported_span.instrumentation_scope = self._scope
        return exported_span


class _Exported(ReadableSpan):
    """The SDK's span as its OTLP encoder reads it, each field a plain slot.

    `ReadableSpan` serves its fields through properties (the attributes wrapped in a new
    `MappingProxyType`, events and links copied into tuples, the dropped counts worked
    out), some read twice a span; a slot is read without a call. A loopwarden span has no
    events or links. Only the fields the exporter reads are set (`_made`).
    """

    __slots__ = (
        "_context",
        "attributes",
        "dropped_attributes",
        "end_time",
        "instrumentation_scope",
        "kind",
        "name",
        "parent",
        "resource",
        "start_time",
        "status",
    )
    _context: SpanContext
    attributes: types.Attributes
    dropped_attributes: int
    end_time: int
    instrumentation_scope: InstrumentationScope
    kind: trace.SpanKind
    name: str
    parent: SpanContext | None
    resource: Resource
    start_time: int
    status: Status | None  # type: ignore[assignment]  # None: UNSET, left out of the encoding
    events = ()
    links = ()
    dropped_events = 0
    dropped_links = 0

    def __init__(self) -> None:
        """Empty: `_made` sets the fields (the base's constructor sets them as others)."""


class _Resource(Resource):
    """A resource whose hash is computed once: the SDK's encoder groups a batch by each
    span's resource, and `Resource.__hash__` makes a JSON dump of its attributes each time."""

    def __init__(self, resource: Resource) -> None:
        super().__init__(resource.attributes, resource.schema_url)
        self._hash = super().__hash__()

    def __hash__(self) -> int:
        return self._hash


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
    return trace.set_span_in_context(NonRecordingSpan(_span_context(record)))


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

    def __init__(self, queue: _Queue) -> None:
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
