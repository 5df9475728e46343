"""Prometheus counters of one gateway, on a registry of its own.

A dedicated `CollectorRegistry` (not the process-global one) lets tests and several
gateways share a process without "duplicated timeseries" errors. The counters sit on the
per-message hot path, where a prometheus-client `Counter` child costs a lock and a few
calls per increment; so counts are kept in plain dicts (every increment happens on the
event loop's thread) and turned into counter families only when `/metrics` is scraped,
by a collector registered on that registry. Histograms are kept the same way (bucket
counts in a list per label set, `Histogram`).

Beside the gateway's counters this module holds what the LLM-call proxy's registry
shares with it (`gateway.proxy.metrics`): the GenAI client metrics of every guarded model
call and the money its refusals saved (`ModelCallMetrics`, fed by the request log, the
one place every guarded call ends), the state backend's operation latency and errors
(`StateMetrics`, fed by `gateway.state.timed`), and the budget gauges (`BudgetGauges`).

Decisions where DESIGN.md is silent:
- Label values that come from traffic are bounded (`BoundedValues`): the first
  `MAX_ROOMS` rooms keep their name in `loops_cut_total`, later ones are `other`; the first
  `MAX_MODELS` model names (a client chooses them) keep theirs in the GenAI metrics; at
  most `MAX_BUDGET_GROUPS` budget groups (the most spent) get gauges.
- Label sets fixed in advance start at zero (`spend_avoided_usd_total` per guard, the state
  errors per backend and operation), so `increase()` sees their first event.
- The GenAI metrics follow OpenTelemetry's GenAI semantic conventions at the version
  `gateway.observability.semconv` pins (their names, attributes and advised bucket
  boundaries come from there): `gen_ai.client.token.usage` (`gen_ai_client_token_usage`,
  the tokens the provider reported, by `gen_ai_token_type` input or output; estimated
  counts are not recorded) and `gen_ai.client.operation.duration`
  (`gen_ai_client_operation_duration_seconds`, from the call's start to its answer's end,
  with `error_type` the HTTP status or `no_answer` for a failed call). `call_logged`
  decides what a call records, once; with OTLP export on, the same values go to the OTLP
  histograms too (`ModelCallMetrics.also_record`, `gateway.observability.otel_metrics`).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from gateway.observability import semconv

if TYPE_CHECKING:  # the request log's entry, read by ModelCallMetrics
    from gateway.calls.entry import CallLogEntry

MAX_ROOMS = 500
"""Rooms named in `loops_cut_total`; the cuts of any later room are counted as `other`."""
MAX_MODELS = 100
"""Model names in the GenAI metrics; calls to any later one are counted as `other`."""
MAX_BUDGET_GROUPS = 200
"""Budget groups with gauges: the ones that spent most (`BudgetGauges`)."""
OTHER = "other"
"""The label value of everything past a bound."""

TOKEN_USAGE_FAMILY = semconv.prometheus_name(semconv.TOKEN_USAGE)
"""`gen_ai.client.token.usage` as Prometheus names it."""
DURATION_FAMILY = f"{semconv.prometheus_name(semconv.OPERATION_DURATION)}_seconds"
"""`gen_ai.client.operation.duration` as Prometheus names it (the unit as a suffix)."""
STATE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5)
"""State operations: from an in-memory step (~µs) to a slow Redis round trip."""
SAVING_GUARDS = {"budget_exceeded": "spend"}
"""The guard a refused model call's outcome names; every other refusal is `call_loop`'s."""


@dataclass(frozen=True, slots=True)
class _Family:
    """One counter's exposition name (without `_total`), help text and label names."""

    name: str
    documentation: str
    labels: tuple[str, ...]


_FAMILIES = (
    _Family("messages_in", "Inbound messages handed to the pipeline", ("platform",)),
    _Family("replies_out", "Replies delivered to a platform", ("platform",)),
    _Family("refusals", "Messages a stage refused to answer", ("stage", "reason")),
    _Family(
        "guard_decisions",
        'Guard verdicts by guard and code; shadow="true" for a guard in shadow mode',
        ("guard", "code", "shadow"),
    ),
    _Family("delivery_retries", "Sends retried after a transient failure", ("platform",)),
    _Family("delivery_failures", "Replies that could not be delivered", ("platform",)),
    _Family("errors", "Unexpected errors, by the stage they escaped from", ("stage",)),
    _Family(
        "transcript_records_skipped",
        "Transcript records that could not be read, skipped from an agent's history",
        (),
    ),
    _Family(
        "loops_cut",
        "Loops a guard cut (a bot message refused, an agent's turn halted), by guard and"
        f" room (the first {MAX_ROOMS} rooms; later ones are counted as other)",
        ("guard", "room"),
    ),
    _Family(
        "events_dropped",
        "Inbound events a connector dropped, by platform and reason (connectors/skips.py)",
        ("platform", "reason"),
    ),
)


class _Counts(Collector):
    """The counts of every family, exposed as counters at scrape time."""

    def __init__(self) -> None:
        self.values: dict[str, dict[tuple[str, ...], int]] = {f.name: {} for f in _FAMILIES}

    def collect(self) -> Iterator[Metric]:
        for family in _FAMILIES:
            metric = CounterMetricFamily(
                family.name, family.documentation, labels=list(family.labels)
            )
            for labels, value in list(self.values[family.name].items()):
                metric.add_metric(list(labels), value)
            yield metric


@runtime_checkable
class ReportsOutages(Protocol):
    """A state backend that can be unreachable (Redis) and says so."""

    @property
    def degraded(self) -> bool: ...

    @property
    def unavailable_calls(self) -> int: ...


class _StateHealth(Collector):
    """The state backend's outage flag and unreachable-call count, read at scrape time."""

    def __init__(self, store: ReportsOutages) -> None:
        self._store = store

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "state_degraded",
            "1 while the state backend is unreachable: with state.on_error allow, budgets,"
            " cooldowns and dedupe are local to this process until it is back",
            value=1.0 if self._store.degraded else 0.0,
        )
        yield CounterMetricFamily(
            "state_unavailable_calls",
            "State calls that could not reach the backend",
            value=self._store.unavailable_calls,
        )


def watch_outages(registry: CollectorRegistry, store: object) -> None:
    """Expose a state backend's outage flag and count on `registry`, when it reports them."""
    if isinstance(store, ReportsOutages):
        registry.register(_StateHealth(store))


@runtime_checkable
class ReportsPendingWrites(Protocol):
    """A call store that keeps the writes Redis missed (gateway.calls.redis_pending)."""

    @property
    def pending_writes(self) -> int: ...

    @property
    def pending_dropped(self) -> int: ...

    @property
    def replica_waits_short(self) -> int: ...


class _PendingWrites(Collector):
    """A call store's kept writes and short replica waits, read at scrape time."""

    def __init__(self, store: ReportsPendingWrites) -> None:
        self._store = store

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "state_pending_writes",
            "Budget charges and request-log entries kept in this process until Redis answers",
            value=self._store.pending_writes,
        )
        yield CounterMetricFamily(
            "state_pending_dropped",
            "Budget charges and request-log entries dropped: too many were kept already",
            value=self._store.pending_dropped,
        )
        yield CounterMetricFamily(
            "state_replica_waits_short",
            "Budget writes fewer replicas than state.wait_replicas confirmed in time",
            value=self._store.replica_waits_short,
        )


def watch_pending(registry: CollectorRegistry, store: object) -> None:
    """Expose a call store's kept writes and short replica waits, when it reports them."""
    if isinstance(store, ReportsPendingWrites):
        registry.register(_PendingWrites(store))


class BoundedValues:
    """A label's values as seen: the first `limit` keep their name, any later one is `other`."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._seen: set[str] = set()

    def label(self, value: str) -> str:
        """`value` when it is known or there is room for it, else `other`."""
        seen = self._seen
        if value in seen:
            return value
        if len(seen) < self._limit:
            seen.add(value)
            return value
        return OTHER


class Counter(Collector):
    """A counter family kept in a plain dict (see the module's docstring)."""

    def __init__(self, name: str, documentation: str, labels: tuple[str, ...]) -> None:
        self._name = name
        self._documentation = documentation
        self._labels = list(labels)
        self.values: dict[tuple[str, ...], float] = {}

    def inc(self, key: tuple[str, ...], amount: float = 1) -> None:
        """Add `amount` to the series of these label values."""
        self.values[key] = self.values.get(key, 0) + amount

    def zero(self, keys: Iterable[tuple[str, ...]]) -> None:
        """Show these label sets at 0 before their first event (for `increase()`)."""
        for key in keys:
            self.values.setdefault(key, 0)

    def collect(self) -> Iterator[Metric]:
        metric = CounterMetricFamily(self._name, self._documentation, labels=self._labels)
        for key, value in list(self.values.items()):
            metric.add_metric(list(key), value)
        yield metric


class Gauge(Collector):
    """A gauge family whose series are replaced as a whole (`replace`)."""

    def __init__(self, name: str, documentation: str, labels: tuple[str, ...]) -> None:
        self._name = name
        self._documentation = documentation
        self._labels = list(labels)
        self.values: dict[tuple[str, ...], float] = {}

    def replace(self, values: dict[tuple[str, ...], float]) -> None:
        """These series and no others (a group whose period ended disappears)."""
        self.values = values

    def collect(self) -> Iterator[Metric]:
        metric = GaugeMetricFamily(self._name, self._documentation, labels=self._labels)
        for key, value in list(self.values.items()):
            metric.add_metric(list(key), value)
        yield metric


class Histogram(Collector):
    """A histogram family: per label set, a count per bucket and the sum of the values."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labels: tuple[str, ...],
        buckets: tuple[float, ...],
    ) -> None:
        self._name = name
        self._documentation = documentation
        self._labels = list(labels)
        self._bounds = buckets
        self._series: dict[tuple[str, ...], list[float]] = {}

    def observe(self, key: tuple[str, ...], value: float) -> None:
        """Count one value in the series of these label values."""
        series = self._series.get(key)
        if series is None:
            # One count per bound, one for +Inf, then the sum.
            series = self._series[key] = [0.0] * (len(self._bounds) + 2)
        series[bisect_left(self._bounds, value)] += 1
        series[-1] += value

    def recorder(self, key: tuple[str, ...]) -> Callable[[float], None]:
        """`observe` bound to one label set, for a hot path (no lookup per value).

        The series shows once its first value is recorded.
        """
        bounds = self._bounds
        all_series = self._series
        series = all_series.get(key) or [0.0] * (len(bounds) + 2)

        def record(value: float) -> None:
            if key not in all_series:
                all_series[key] = series
            series[bisect_left(bounds, value)] += 1
            series[-1] += value

        return record

    def collect(self) -> Iterator[Metric]:
        metric = HistogramMetricFamily(self._name, self._documentation, labels=self._labels)
        bounds = [*(str(float(bound)) for bound in self._bounds), "+Inf"]
        for key, series in list(self._series.items()):
            cumulative, running = [], 0.0
            for bound, count in zip(bounds, series, strict=False):
                running += count
                cumulative.append((bound, running))
            metric.add_metric(list(key), cumulative, series[-1])
        yield metric


class GenAiRecorder(Protocol):
    """Where a model call's GenAI client metrics go beside Prometheus (the OTLP histograms).

    Each key holds the values of `semconv.TOKEN_USAGE_ATTRIBUTES` or
    `semconv.OPERATION_DURATION_ATTRIBUTES`, in that order (`error.type` "" when none).
    """

    def token_usage(self, key: tuple[str, ...], tokens: float) -> None:
        """Record one `gen_ai.client.token.usage` value."""

    def operation_duration(self, key: tuple[str, ...], seconds: float) -> None:
        """Record one `gen_ai.client.operation.duration` value."""


class ModelCallMetrics:
    """Every guarded model call's GenAI client metrics, and the money its refusal saved.

    The request log calls `call_logged` once per call (`gateway.proxy.request_log`), on
    the proxy and in the gateway's `openai` agents alike.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self._models = BoundedValues(MAX_MODELS)
        self.tokens = Histogram(
            TOKEN_USAGE_FAMILY,
            f"{semconv.TOKEN_USAGE}: tokens a model call used, as its provider reported them",
            tuple(map(semconv.prometheus_name, semconv.TOKEN_USAGE_ATTRIBUTES)),
            semconv.TOKEN_BUCKETS,
        )
        self.duration = Histogram(
            DURATION_FAMILY,
            f"{semconv.OPERATION_DURATION}: a model call's duration, sent to answered",
            tuple(map(semconv.prometheus_name, semconv.OPERATION_DURATION_ATTRIBUTES)),
            semconv.DURATION_BUCKETS,
        )
        self._token_sinks: list[Callable[[tuple[str, ...], float], None]] = [self.tokens.observe]
        self._duration_sinks: list[Callable[[tuple[str, ...], float], None]] = [
            self.duration.observe
        ]
        self.saved = Counter(
            "spend_avoided_usd",
            "Estimated cost of the model calls a guard refused (the request log's cost saved)",
            ("guard",),
        )
        self.saved.zero([("call_loop",), ("spend",)])
        for family in (self.tokens, self.duration, self.saved):
            registry.register(family)

    def also_record(self, recorder: GenAiRecorder) -> Callable[[], None]:
        """Send every later call's GenAI values to `recorder` too; returns how to stop."""
        tokens, duration = recorder.token_usage, recorder.operation_duration
        self._token_sinks.append(tokens)
        self._duration_sinks.append(duration)

        def stop() -> None:
            self._token_sinks.remove(tokens)
            self._duration_sinks.remove(duration)

        return stop

    def call_logged(self, entry: CallLogEntry) -> None:
        """Count one call as its request-log entry states it."""
        outcome = entry.outcome
        if outcome not in ("forwarded", "upstream_error"):
            self.saved.inc((SAVING_GUARDS.get(outcome, "call_loop"),), entry.cost or 0.0)
            return
        provider, model = entry.provider, self._models.label(entry.model)
        failed = outcome == "upstream_error"
        error = "" if not failed else str(entry.status) if entry.status else "no_answer"
        seconds = entry.duration_ms / 1000
        for duration in self._duration_sinks:
            duration((semconv.CHAT, provider, model, error), seconds)
        if entry.estimated:
            return
        for tokens in self._token_sinks:
            tokens((semconv.CHAT, provider, model, semconv.TOKEN_INPUT), entry.input_tokens or 0)
            tokens((semconv.CHAT, provider, model, semconv.TOKEN_OUTPUT), entry.output_tokens or 0)


class StateMetrics:
    """The state backend's operations: their latency and the errors they raised.

    `gateway.state.timed` calls `observe` and `failed` around every StateStore call.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.seconds = Histogram(
            "state_operation_seconds",
            "State backend calls' latency, by backend and operation",
            ("backend", "op"),
            STATE_BUCKETS,
        )
        self.errors = Counter(
            "state_errors",
            "State backend calls that raised, by backend and operation",
            ("backend", "op"),
        )
        registry.register(self.seconds)
        registry.register(self.errors)

    def known(self, backend: str, ops: Iterable[str]) -> None:
        """Show each operation's error count at 0 from the start."""
        self.errors.zero((backend, op) for op in ops)

    def observe(self, backend: str, op: str, seconds: float) -> None:
        """Count one call's latency."""
        self.seconds.observe((backend, op), seconds)

    def recorder(self, backend: str, op: str) -> Callable[[float], None]:
        """`observe` bound to one backend and operation (the timing wrapper's)."""
        return self.seconds.recorder((backend, op))

    def failed(self, backend: str, op: str) -> None:
        """Count one call that raised."""
        self.errors.inc((backend, op))


@dataclass(frozen=True, slots=True)
class BudgetFigure:
    """One budget group's spend this period and its dollar limit (None: none set)."""

    budget: str
    group: str
    spent_usd: float
    limit_usd: float | None


class BudgetGauges:
    """`budget_spend_usd` and `budget_limit_usd` per budget group, replaced on each update.

    At most `MAX_BUDGET_GROUPS` groups are shown, those that spent most: a budget `per`
    user may hold a group per user, and a series per group would grow without bound.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        labels = ("budget", "group")
        self.spend = Gauge(
            "budget_spend_usd", "A budget group's spend this period, in US dollars", labels
        )
        self.limit = Gauge(
            "budget_limit_usd",
            "A budget group's dollar limit this period (an admin's override included)",
            labels,
        )
        registry.register(self.spend)
        registry.register(self.limit)

    def update(self, figures: Iterable[BudgetFigure]) -> None:
        """Show these groups' figures (the most spent, up to the bound), and no others."""
        top = sorted(figures, key=lambda figure: figure.spent_usd, reverse=True)
        shown = top[:MAX_BUDGET_GROUPS]
        self.spend.replace({(f.budget, f.group): f.spent_usd for f in shown})
        self.limit.replace(
            {(f.budget, f.group): f.limit_usd for f in shown if f.limit_usd is not None}
        )


class Metrics:
    """The gateway's counters; the runtime serves `render()` (or the registry) at `/metrics`."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self._counts = _Counts()
        self.registry.register(self._counts)
        values = self._counts.values
        self._messages_in = values["messages_in"]
        self._replies_out = values["replies_out"]
        self._refusals = values["refusals"]
        self._guard_decisions = values["guard_decisions"]
        self._delivery_retries = values["delivery_retries"]
        self._delivery_failures = values["delivery_failures"]
        self._errors = values["errors"]
        self._events_dropped = values["events_dropped"]
        self._transcript_skipped = values["transcript_records_skipped"]
        self._loops_cut = values["loops_cut"]
        self._rooms = BoundedValues(MAX_ROOMS)
        self.model_calls = ModelCallMetrics(self.registry)
        self.state = StateMetrics(self.registry)

    def message_in(self, platform: str) -> None:
        """Count one inbound message."""
        key = (platform,)
        self._messages_in[key] = self._messages_in.get(key, 0) + 1

    def reply_out(self, platform: str) -> None:
        """Count one reply delivered (all of its chunks)."""
        key = (platform,)
        self._replies_out[key] = self._replies_out.get(key, 0) + 1

    def refusal(self, stage: str, reason: str) -> None:
        """Count one message a stage refused."""
        key = (stage, reason)
        self._refusals[key] = self._refusals.get(key, 0) + 1

    def guard_decision(self, guard: str, code: str, *, shadow: bool = False) -> None:
        """Count one guard verdict, admitted or not (`shadow`: the guard is in shadow mode)."""
        key = (guard, code, "true" if shadow else "false")
        self._guard_decisions[key] = self._guard_decisions.get(key, 0) + 1

    def delivery_retry(self, platform: str) -> None:
        """Count one retried send."""
        key = (platform,)
        self._delivery_retries[key] = self._delivery_retries.get(key, 0) + 1

    def delivery_failure(self, platform: str) -> None:
        """Count one reply given up on."""
        key = (platform,)
        self._delivery_failures[key] = self._delivery_failures.get(key, 0) + 1

    def error(self, stage: str) -> None:
        """Count one unexpected error."""
        key = (stage,)
        self._errors[key] = self._errors.get(key, 0) + 1

    def loop_cut(self, guard: str, room: str) -> None:
        """Count one loop a guard cut in a room (`other` past `MAX_ROOMS` rooms)."""
        key = (guard, self._rooms.label(room))
        self._loops_cut[key] = self._loops_cut.get(key, 0) + 1

    def event_dropped(self, platform: str, reason: str) -> None:
        """Count one inbound event a connector dropped."""
        key = (platform, reason)
        self._events_dropped[key] = self._events_dropped.get(key, 0) + 1

    def transcript_skipped(self, count: int) -> None:
        """Count transcript records skipped because they could not be read."""
        self._transcript_skipped[()] = self._transcript_skipped.get((), 0) + count

    def watch_state(self, store: object) -> None:
        """Expose a state backend's outage flag and count, when it reports them."""
        watch_outages(self.registry, store)

    def value(self, name: str, **labels: str) -> float:
        """The sum of the samples of `name` whose labels include `labels`, 0 when none does.

        So `value("guard_decisions_total", guard="bot_loop", code="ok")` counts both modes.
        """
        wanted = labels.items()
        return sum(
            (
                sample.value
                for metric in self.registry.collect()
                for sample in metric.samples
                if sample.name == name and wanted <= sample.labels.items()
            ),
            0.0,
        )

    def render(self) -> bytes:
        """The text exposition format, for `/metrics`."""
        return generate_latest(self.registry)
