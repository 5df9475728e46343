"""The proxy's Prometheus metrics, served at `/metrics` on its port.

On a registry of its own (`ProxyMetrics.registry`):
- `proxy_calls_total{provider,agent,outcome}`: every guarded call, by the request-log
  outcome (`forwarded`, a refusal's code, `upstream_error`); the agent is the proxy key's,
  so the label is bounded by the config's keys;
- `proxy_refusals_total{provider,code}`: the refused calls, by code;
- `proxy_upstream_errors_total{provider,reason}`: sent calls that failed: `no_answer`
  (timeout, connection failure), `status_4xx`, `status_5xx`, or `broken_off` (a stream
  cut midway, an answer in an encoding that cannot be read);
- `proxy_upstream_seconds{provider}`: from forwarding a call to its answer's end;
- `proxy_added_seconds{provider}`: what the proxy adds before forwarding (authentication,
  the path, the body's reading, admission by the call guard and the budgets);
- `spend_anomalies_total{action}`: the anomaly detector's findings (`alert`, `pause`);
- `budget_spend_usd{budget,group}` and `budget_limit_usd{budget,group}`: read from the
  call store at each scrape (so they are the spend every replica charged, and a group
  whose period ended disappears), at most `MAX_BUDGET_GROUPS` groups;
- the GenAI client metrics and `spend_avoided_usd_total{guard}` (`ModelCallMetrics`), the
  state backend's latency and errors (`StateMetrics`) and its outage gauge, as the
  gateway has them (gateway.observability.metrics).
Label sets fixed by the config start at zero: refusals and upstream errors for each
configured provider, anomalies for both actions.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from gateway.calls.entry import CallLogEntry
from gateway.observability.metrics import (
    BudgetFigure,
    BudgetGauges,
    Counter,
    Histogram,
    ModelCallMetrics,
    StateMetrics,
    watch_outages,
    watch_pending,
)

REFUSAL_CODES = (
    "loop_detected",
    "loop_paused",
    "duplicate_call",
    "budget_exceeded",
    "state_unavailable",
)
"""The outcomes of a refused call (`gateway.calls.entry.CallOutcome`)."""
UPSTREAM_ERRORS = ("no_answer", "status_4xx", "status_5xx", "broken_off")
ANOMALY_ACTIONS = ("alert", "pause")
UPSTREAM_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
"""A model's answer: from a cached short completion to a long stream."""
ADDED_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1)
"""The proxy's own time per call: tens of microseconds, a Redis round trip, a slow store."""


class ProxyMetrics:
    """The proxy's counters, histograms and gauges; `render()` is the `/metrics` body."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, providers: Iterable[str], registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        providers = tuple(providers)
        self.calls = Counter(
            "proxy_calls",
            "Guarded model calls, by provider, agent and outcome",
            ("provider", "agent", "outcome"),
        )
        self.refusals = Counter(
            "proxy_refusals",
            "Model calls the proxy refused, by provider and code",
            ("provider", "code"),
        )
        self.refusals.zero((provider, code) for provider in providers for code in REFUSAL_CODES)
        self.upstream_errors = Counter(
            "proxy_upstream_errors",
            "Forwarded calls the upstream failed, by provider and reason",
            ("provider", "reason"),
        )
        self.upstream_errors.zero(
            (provider, reason) for provider in providers for reason in UPSTREAM_ERRORS
        )
        self.upstream_seconds = Histogram(
            "proxy_upstream_seconds",
            "From forwarding a call to its answer's end",
            ("provider",),
            UPSTREAM_BUCKETS,
        )
        self.added_seconds = Histogram(
            "proxy_added_seconds",
            "The proxy's own time before forwarding a call",
            ("provider",),
            ADDED_BUCKETS,
        )
        self.anomalies = Counter(
            "spend_anomalies",
            "Spend anomalies the detector found, by what it did",
            ("action",),
        )
        self.anomalies.zero((action,) for action in ANOMALY_ACTIONS)
        for family in (
            self.calls,
            self.refusals,
            self.upstream_errors,
            self.upstream_seconds,
            self.added_seconds,
            self.anomalies,
        ):
            self.registry.register(family)
        self.model_calls = ModelCallMetrics(self.registry)
        self.state = StateMetrics(self.registry)
        self.budgets = BudgetGauges(self.registry)

    def call_logged(self, entry: CallLogEntry) -> None:
        """Count one guarded call from its request-log entry (`RequestLog`'s observer)."""
        provider, outcome = entry.provider, entry.outcome
        self.calls.inc((provider, entry.agent, outcome))
        if outcome in REFUSAL_CODES:
            self.refusals.inc((provider, outcome))
        elif outcome == "upstream_error":
            self.upstream_errors.inc((provider, _upstream_error(entry.status)))
        self.model_calls.call_logged(entry)

    def forwarded(self, provider: str, *, added: float, upstream: float) -> None:
        """Count one forwarded call's time before forwarding and its time upstream."""
        self.added_seconds.observe((provider,), added)
        self.upstream_seconds.observe((provider,), upstream)

    def anomaly(self, *, paused: bool) -> None:
        """Count one spend anomaly (`paused`: the detector paused the agent)."""
        self.anomalies.inc(("pause" if paused else "alert",))

    def budget_figures(self, figures: Iterable[BudgetFigure]) -> None:
        """Show the budget groups' spend and limits (`BudgetGauges.update`)."""
        self.budgets.update(figures)

    def watch_state(self, store: object) -> None:
        """Expose a state backend's outage flag and count, when it reports them."""
        watch_outages(self.registry, store)

    def watch_calls(self, store: object) -> None:
        """Expose a call store's kept writes and short replica waits, when it reports them."""
        watch_pending(self.registry, store)

    def render(self) -> bytes:
        """The text exposition format, for `/metrics`."""
        return generate_latest(self.registry)


def _upstream_error(status: int | None) -> str:
    """Why a sent call failed, from its status (None: no answer)."""
    if status is None:
        return "no_answer"
    if status >= 500:
        return "status_5xx"
    if status >= 400:
        return "status_4xx"
    return "broken_off"
