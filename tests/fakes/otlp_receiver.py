"""A real OTLP/HTTP receiver on loopback: what the gateway's exporters send, decoded.

`OtlpReceiver` serves `POST /v1/traces` and `POST /v1/metrics`, decodes each body as an
`ExportTraceServiceRequest` or `ExportMetricsServiceRequest` protobuf (`opentelemetry-proto`,
as a collector does) and keeps every span as a `ReceivedSpan` and every metric data point
as a `ReceivedPoint`; helpers group spans into traces and walk their tree.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from types import TracebackType

from aiohttp import web
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import Metric
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


@dataclass(frozen=True)
class ReceivedPoint:
    """One metric data point as the receiver decoded it.

    `kind` is the OTLP data type (`sum`, `gauge`, `histogram`); `value` a sum's or a
    gauge's value, or a histogram's sum; `count` a histogram's count (0 otherwise).
    """

    name: str
    unit: str
    kind: str
    monotonic: bool
    attributes: dict[str, Value]
    value: float
    count: int
    bounds: tuple[float, ...]
    service: str
    schema_url: str


@dataclass
class OtlpReceiver:
    """The receiver: `endpoint` is the base URL to configure as `telemetry.otlp_endpoint`."""

    spans: list[ReceivedSpan] = field(default_factory=list)
    metric_exports: list[list[ReceivedPoint]] = field(default_factory=list)
    metrics_posted: asyncio.Event = field(default_factory=asyncio.Event)
    """Set by every metrics export received."""
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
        app.router.add_post("/v1/metrics", self._metrics)
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

    async def _metrics(self, request: web.Request) -> web.Response:
        self.content_types.append(request.content_type)
        export = ExportMetricsServiceRequest()
        export.ParseFromString(await request.read())
        points: list[ReceivedPoint] = []
        for resource_metrics in export.resource_metrics:
            resource = _attributes(resource_metrics.resource.attributes)
            service = str(resource.get("service.name", ""))
            for scope_metrics in resource_metrics.scope_metrics:
                for metric in scope_metrics.metrics:
                    points.extend(_points(metric, service, scope_metrics.schema_url))
        self.metric_exports.append(points)
        self.metrics_posted.set()
        body = ExportMetricsServiceResponse().SerializeToString()
        return web.Response(body=body, content_type="application/x-protobuf")

    def latest(self, name: str) -> list[ReceivedPoint]:
        """The data points of metric `name` in the last export that held it."""
        for points in reversed(self.metric_exports):
            named = [point for point in points if point.name == name]
            if named:
                return named
        return []

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


def _points(metric: Metric, service: str, schema_url: str) -> Iterator[ReceivedPoint]:
    kind = metric.WhichOneof("data") or ""

    def point(
        attributes: Iterable[KeyValue],
        value: float,
        *,
        monotonic: bool,
        count: int = 0,
        bounds: Iterable[float] = (),
    ) -> ReceivedPoint:
        return ReceivedPoint(
            metric.name,
            metric.unit,
            kind,
            monotonic,
            _attributes(attributes),
            value,
            count,
            tuple(bounds),
            service,
            schema_url,
        )

    if kind == "histogram":
        for bucketed in metric.histogram.data_points:
            yield point(
                bucketed.attributes,
                bucketed.sum,
                monotonic=True,
                count=bucketed.count,
                bounds=bucketed.explicit_bounds,
            )
    elif kind in ("sum", "gauge"):
        data = metric.sum if kind == "sum" else metric.gauge
        monotonic = kind == "sum" and metric.sum.is_monotonic
        for number in data.data_points:
            value = number.as_double if number.HasField("as_double") else number.as_int
            yield point(number.attributes, float(value), monotonic=monotonic)


def _attributes(attributes: Iterable[KeyValue]) -> dict[str, Value]:
    return {a.key: _value(a.value) for a in attributes}


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
