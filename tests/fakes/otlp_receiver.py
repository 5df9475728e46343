"""A real OTLP/HTTP trace receiver on loopback: what the gateway's exporter sends, decoded.

`OtlpReceiver` serves `POST /v1/traces`, decodes each body as an
`ExportTraceServiceRequest` protobuf (`opentelemetry-proto`, as a collector does) and keeps
every span as a `ReceivedSpan`; helpers group them into traces and walk their tree.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from types import TracebackType

from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from tests.fakes.loopback import LOOPBACK_HOST, serve_loopback

Value = str | bool | int | float


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as the receiver decoded it (ids in lowercase hex, as `traceparent` writes them)."""

    trace_id: str
    span_id: str
    parent_id: str
    name: str
    kind: int
    attributes: dict[str, Value]
    error: bool
    service: str

    @property
    def is_root(self) -> bool:
        """True when the span has no parent."""
        return not self.parent_id


@dataclass
class OtlpReceiver:
    """The receiver: `endpoint` is the base URL to configure as `telemetry.otlp_endpoint`."""

    spans: list[ReceivedSpan] = field(default_factory=list)
    content_types: list[str] = field(default_factory=list)
    _runner: web.AppRunner | None = None
    port: int = 0

    @property
    def endpoint(self) -> str:
        """`http://127.0.0.1:<port>`."""
        return f"http://{LOOPBACK_HOST}:{self.port}"

    async def __aenter__(self) -> OtlpReceiver:
        app = web.Application()
        app.router.add_post("/v1/traces", self._traces)
        self._runner = web.AppRunner(app)
        self.port = await serve_loopback(self._runner)
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _traces(self, request: web.Request) -> web.Response:
        self.content_types.append(request.content_type)
        export = ExportTraceServiceRequest()
        export.ParseFromString(await request.read())
        for resource_spans in export.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            service = str(resource.get("service.name", ""))
            for scope_spans in resource_spans.scope_spans:
                self.spans.extend(_span(span, service) for span in scope_spans.spans)
        body = ExportTraceServiceResponse().SerializeToString()
        return web.Response(body=body, content_type="application/x-protobuf")

    def traces(self) -> dict[str, list[ReceivedSpan]]:
        """The spans by trace id, in the order received."""
        grouped: dict[str, list[ReceivedSpan]] = {}
        for span in self.spans:
            grouped.setdefault(span.trace_id, []).append(span)
        return grouped

    def named(self, prefix: str) -> list[ReceivedSpan]:
        """The spans whose name starts with `prefix`."""
        return [span for span in self.spans if span.name.startswith(prefix)]


def children(spans: list[ReceivedSpan], parent: ReceivedSpan) -> list[ReceivedSpan]:
    """The spans directly under `parent`."""
    return [span for span in spans if span.parent_id == parent.span_id]


def tree(spans: list[ReceivedSpan], parent: ReceivedSpan, depth: int = 0) -> Iterator[str]:
    """`parent` and its descendants as indented names (for readable assertions)."""
    yield "  " * depth + parent.name
    for child in children(spans, parent):
        yield from tree(spans, child, depth + 1)


def root_of(spans: list[ReceivedSpan]) -> ReceivedSpan:
    """The one span of a trace without a parent in it."""
    ids = {span.span_id for span in spans}
    roots = [span for span in spans if span.parent_id not in ids]
    assert len(roots) == 1, [span.name for span in roots]
    return roots[0]


def _span(span: Span, service: str) -> ReceivedSpan:
    return ReceivedSpan(
        trace_id=span.trace_id.hex(),
        span_id=span.span_id.hex(),
        parent_id=span.parent_span_id.hex(),
        name=span.name,
        kind=span.kind,
        attributes={a.key: _value(a.value) for a in span.attributes},
        error=span.status.code == Status.STATUS_CODE_ERROR,
        service=service,
    )


def _value(value: AnyValue) -> Value:
    kind = value.WhichOneof("value")
    if kind == "string_value":
        return value.string_value
    if kind == "bool_value":
        return value.bool_value
    if kind == "int_value":
        return value.int_value
    if kind == "double_value":
        return value.double_value
    return str(value)
