"""Spend limits in the proxy: each call's budget groups and estimate, the refusal, the charge.

Before forwarding, `ProxyBudgets.admit` builds the call's `SpendEvent` (every budget of
`proxy.budgets` whose filters it passes, in the group of its `per` values, a missing one
`(none)`; its estimated cost from `pricing`) and has the call store decide it with the
repeat guard in one atomic step (`CallStore.admit`: one script call on Redis), through
the guarded call's admission (`gateway.proxy.guarded`, the gateway's agents' too). A refusal
is `budget_exceeded` in the provider's own error format (429; on the Gemini routes 400
`FAILED_PRECONDITION`, as every other refusal there, since Google's clients retry a 429
whatever the body says), with `Retry-After` to the period's end, `x-should-retry: false`,
`x-loopwarden-code` and `x-loopwarden-budget`. While Redis is unreachable under
`state.on_error: deny` a call a budget applies to is refused `state_unavailable`
instead: 503 in the provider's error format (Gemini's `UNAVAILABLE`), the same headers
but `x-should-retry: true` (nothing was sent, so the SDK may retry after `Retry-After`).
After the call, `settle` replaces the
estimate it held with what the request log says it used, and alerts go out through
`proxy.alerts` when a group crosses 50, 80 or 100 percent of its limit.

The anomaly detector (`proxy.anomaly`, gateway.calls.anomaly) is stepped with the same
charge, in the same store transaction or script call (`CallStore.settle`): its state
lives in the call store beside the budgets' (memory, SQLite, or Redis, where replicas
share it); an anomaly sends one alert per window with the figures and the agent's top
sessions, and under `action: pause` the store pauses the agent there and then; its next
calls are refused by the same admission that checks the budgets.

Decisions where DESIGN.md is silent:
- What a call is charged: the tokens the upstream reported (and their price); when it
  reported none, its estimate if the upstream answered below 400 (a client that hung up
  is charged too: the provider did the work), nothing for a provider failure (429, 408,
  5xx, no answer, a stream broken off) or another error answer. A usage block with a
  count missing or malformed (negative, fractional, absurd) is logged and the missing
  count charged by the estimate.
- A model without a price is charged its tokens and no money; with `unpriced: refuse`,
  a call to it that falls in a budget with `limit_usd` is refused `budget_exceeded`.
- A call the repeat guard refuses holds nothing; one it refuses in shadow mode is
  forwarded, so it holds its estimate like an admitted call (`ShadowGuards`; issue 20)
  and is refused `budget_exceeded` like one when the budget has no room for it.
- Periods are worked out on this process's wall clock in `budget_timezone` (cached until
  the period ends), the same way on every replica.
- The charge runs in the background (`ProxyServer.settle` and `stop` wait for it), so a
  keep-alive connection's next request never waits on the charge's write: on Redis one
  script call decides a call before it is forwarded (agent pause, budgets, circuit and
  rules together) and one more charges it afterwards (budgets and anomaly together). A
  charge Redis does not answer is kept and written once it answers
  (gateway.calls.redis_pending); one that fails otherwise is logged: the call was
  already served.
- Without budgets or a pausing detector the admission is the plain repeat-guard decision.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from datetime import datetime
from zoneinfo import ZoneInfo

from aiohttp import web

from gateway.calls.anomaly import AnomalyAlert, AnomalyCharge, AnomalyEvent, anomaly_key
from gateway.calls.budgets import (
    Amount,
    Budget,
    Period,
    PeriodSpan,
    SpendAlert,
    SpendEvent,
    SpendGroup,
    SpendHold,
    SpendVerdict,
    group_key,
    limit_key,
    nano,
    period_span,
)
from gateway.calls.entry import CallLogEntry
from gateway.calls.store import ENFORCED, CallStore, ShadowGuards
from gateway.config.proxy import ProxyConfig
from gateway.proxy import background, messages
from gateway.proxy.alerts import Alert, Alerter
from gateway.proxy.calls import ProxiedCall
from gateway.proxy.guarded import Admitted, GuardedCalls, OverBudget
from gateway.proxy.metrics import ProxyMetrics
from gateway.proxy.pricing import PriceTable
from gateway.proxy.provider import Usage, error_response
from gateway.proxy.refusal import retry_headers
from guards.call_loop import is_provider_failure

log = logging.getLogger("loopwarden.proxy")

CODE = "budget_exceeded"
UNAVAILABLE_CODE = "state_unavailable"
BUDGET_HEADER = "x-loopwarden-budget"
NO_HOLD = SpendHold((), Amount())
"""What a call no budget applies to holds: its charge steps the anomaly detector only."""


class Periods:
    """The current period of each kind in one time zone, worked out once per period."""

    def __init__(self, zone: ZoneInfo) -> None:
        self.zone = zone
        self._spans: dict[Period, PeriodSpan] = {}

    def span(self, period: Period, now: float) -> PeriodSpan:
        """The period of this kind holding `now`."""
        span = self._spans.get(period)
        if span is None or span.ends_at <= now:
            span = self._spans[period] = period_span(period, self.zone, now)
        return span

    def show(self, at: float) -> str:
        """An instant as people read it in this zone: `2026-01-02 00:00 UTC`."""
        return datetime.fromtimestamp(at, self.zone).strftime("%Y-%m-%d %H:%M %Z")


class ProxyBudgets:
    """The proxy's budgets: admission with the call store, refusals, charges and alerts."""

    def __init__(
        self,
        config: ProxyConfig,
        store: CallStore,
        prices: PriceTable,
        alerter: Alerter,
        *,
        guarded: GuardedCalls,
        shadow: ShadowGuards = ENFORCED,
        wall_clock: Callable[[], float] = time.time,
        metrics: ProxyMetrics | None = None,
    ) -> None:
        self._metrics = metrics
        self.budgets: tuple[Budget, ...] = tuple(b.budget() for b in config.budgets)
        self._shadow = shadow
        self.anomaly = config.anomaly.policy()
        self._pauses = self.anomaly is not None and self.anomaly.action == "pause"
        self.periods = Periods(ZoneInfo(config.budget_timezone))
        self._refuse_unpriced = config.unpriced == "refuse"
        self._store = store
        self._guarded = guarded
        self._prices = prices
        self._alerter = alerter
        self._wall_clock = wall_clock
        self._charges: set[asyncio.Task[None]] = set()

    def event(self, call: ProxiedCall, now: float) -> SpendEvent:
        """The call's budget groups in their current periods, and its estimated cost."""
        fields = call.fields
        groups = []
        for budget in self.budgets:
            if not budget.matches(fields):
                continue
            span = self.periods.span(budget.period, now)
            groups.append(
                SpendGroup(
                    budget.name,
                    budget.group(fields),
                    group_key(budget.name, span.label, budget.values(fields)),
                    limit_key(budget.name, span.label),
                    budget.limits,
                    span.ends_at,
                )
            )
        model, provider = call.call.model, call.provider.name
        tokens_in, tokens_out = self._prices.estimate(
            model, call.request_bytes, call.call.max_output
        )
        cost = self._prices.cost(model, tokens_in, tokens_out, provider) if groups else None
        agent_hold = anomaly_key(call.client.root) if self._pauses else None
        return SpendEvent(
            tuple(groups), Amount(nano(cost or 0.0), tokens_in + tokens_out), agent_hold
        )

    async def admit(self, call: ProxiedCall) -> Admitted | OverBudget:
        """The agent's pause, the budgets' and the repeat guard's verdicts, decided together."""
        guarded = self._guarded
        if not self.budgets and not self._pauses:
            return await guarded.decide(call, rule_fields=call.fields, shadow=self._shadow)
        now = self._wall_clock()
        event = self.event(call, now)
        unpriced = self._unpriced(call, event)
        if unpriced is not None:
            verdict = SpendVerdict(
                False, refused=unpriced, limits=unpriced.limits, retry_after=unpriced.ends_at - now
            )
            call.spend = verdict
            return OverBudget(verdict)
        admitted = await guarded.admit(call, event, rule_fields=call.fields, shadow=self._shadow)
        call.spend = admitted.spend
        if admitted.spend.alert is not None:
            self._alert(call, admitted.spend.alert)
        return admitted

    def _unpriced(self, call: ProxiedCall, event: SpendEvent) -> SpendGroup | None:
        """With `unpriced: refuse`, the dollar budget group a call to an unpriced model is in."""
        if not self._refuse_unpriced:
            return None
        dollars = [group for group in event.groups if group.limits.nano_usd is not None]
        if not dollars or self._prices.price(call.call.model, call.provider.name) is not None:
            return None
        return dollars[0]

    def refusal(self, call: ProxiedCall, verdict: SpendVerdict) -> web.Response:
        """The `budget_exceeded` answer, in the provider's format."""
        group = verdict.refused
        if group is None:
            raise ValueError("a refusal names the group it would pass")
        if verdict.unavailable:
            return self._unavailable(call, group, verdict.retry_after)
        limits = verdict.limits or group.limits
        dollars = limits.nano_usd is not None
        unpriced = call.call.model if dollars and self._is_unpriced(call) else None
        log.info(
            "agent %s: budget_exceeded on %s: budget %s, group %s",
            call.client.agent,
            call.circuit,
            group.budget,
            group.group,
        )
        text = messages.budget_refusal(
            budget=group.budget,
            group=group.group,
            limit=messages.money(limits.nano_usd, limits.tokens),
            ends=self.periods.show(group.ends_at),
            unpriced=unpriced,
        )
        headers = retry_headers(CODE, verdict.retry_after)
        headers[BUDGET_HEADER] = group.budget
        return error_response(call.provider, "refused", CODE, text, headers)

    def _unavailable(self, call: ProxiedCall, group: SpendGroup, retry: float) -> web.Response:
        """The `state_unavailable` answer: the budget could not be checked, nothing was sent."""
        log.info(
            "agent %s: %s on %s: budget %s",
            call.client.agent,
            UNAVAILABLE_CODE,
            call.circuit,
            group.budget,
        )
        headers = retry_headers(UNAVAILABLE_CODE, retry)
        headers["x-should-retry"] = "true"
        headers[BUDGET_HEADER] = group.budget
        text = messages.state_unavailable(budget=group.budget, seconds=math.ceil(retry))
        return error_response(call.provider, "unavailable", UNAVAILABLE_CODE, text, headers)

    def _is_unpriced(self, call: ProxiedCall) -> bool:
        return (
            self._refuse_unpriced
            and self._prices.price(call.call.model, call.provider.name) is None
        )

    async def settle(
        self,
        call: ProxiedCall,
        entry: CallLogEntry,
        usage: Usage | None,
        *,
        status: int | None,
        error: str | None = None,
    ) -> None:
        """Start charging what the call used to its budgets and the anomaly detector (`wait`)."""
        verdict = call.spend
        hold = verdict.hold if verdict is not None else None
        if hold is None and self.anomaly is None:
            return
        reported = usage is not None and (
            usage.input_tokens is not None or usage.output_tokens is not None
        )
        if usage is not None and entry.estimated:
            log.warning(
                "%s upstream reported a usage block without valid token counts for %s; "
                "the missing counts are charged by the estimate",
                call.provider.name,
                call.circuit,
            )
        failed = is_provider_failure(status, error) or status is None or status >= 400
        used: Amount | None = None
        if reported or not failed:
            tokens = (entry.input_tokens or 0) + (entry.output_tokens or 0)
            used = Amount(nano(entry.cost or 0.0), tokens)
        anomaly = None
        if self.anomaly is not None and used is not None:
            root = call.client.root
            event = AnomalyEvent(root, anomaly_key(root), call.session, used.nano_usd)
            anomaly = AnomalyCharge(event, self.anomaly)
        if hold is None and anomaly is None:
            return
        task = asyncio.create_task(self._charge(call, hold or NO_HOLD, used, anomaly))
        self._charges.add(task)
        task.add_done_callback(self._charges.discard)

    async def _charge(
        self, call: ProxiedCall, hold: SpendHold, used: Amount | None, anomaly: AnomalyCharge | None
    ) -> None:
        """One charge in the store, then the alerts it calls for."""
        try:
            settled = await self._store.settle(hold, used, anomaly)
        except Exception:  # the call was served; a lost charge must not take the proxy down
            log.exception("charging the spend of %s failed", call.circuit)
            return
        for alert in settled.alerts:
            self._alert(call, alert)
        if settled.anomaly is not None:
            self._anomaly_alert(call, settled.anomaly)

    async def wait(self) -> None:
        """Wait for the charges started so far."""
        while self._charges:
            await asyncio.wait(set(self._charges))

    async def drain(self, seconds: float) -> None:
        """Let the charges in flight finish for up to `seconds`; the rest are cancelled, logged."""
        late = await background.drain(self._charges, seconds)
        if late:
            log.warning("%d spend charges not written at shutdown", late)

    def _anomaly_alert(self, call: ProxiedCall, alert: AnomalyAlert) -> None:
        """Count one anomaly, and send its alert through `proxy.alerts`."""
        if self._metrics is not None:
            self._metrics.anomaly(paused=alert.paused is not None)
        log.warning(
            "spend anomaly for agent %s: %s in the window from %s",
            alert.agent,
            messages.money(alert.spent, None),
            self.periods.show(alert.window_start),
        )
        sessions = ", ".join(
            f"{name} {messages.money(spent, None)}" for name, spent in alert.sessions
        )
        window = f"{self.periods.show(alert.window_start)} to {self.periods.show(alert.window_end)}"
        text = messages.anomaly_alert(
            agent=alert.agent,
            spent=messages.money(alert.spent, None),
            window=window,
            median=None if alert.new_agent else messages.money(round(alert.median), None),
            factor=alert.factor,
            min_usd=messages.money(alert.min_nano, None),
            sessions=sessions or "-",
            paused=alert.paused,
        )
        self._alerter.notify(
            Alert(
                agent=alert.agent,
                session=alert.sessions[0][0] if alert.sessions else "",
                circuit=alert.paused or anomaly_key(alert.agent),
                count=1,
                code="spend_anomaly",
                subject=messages.anomaly_alert_subject(alert.agent),
                text=text,
            )
        )

    def _alert(self, call: ProxiedCall, alert: SpendAlert) -> None:
        """Send one threshold alert through `proxy.alerts`."""
        limits = alert.limits
        ends = self.periods.show(alert.ends_at)
        log.warning(
            "budget %s for %s reached %d%% of its limit", alert.budget, alert.group, alert.threshold
        )
        text = messages.spend_alert(
            budget=alert.budget,
            group=alert.group,
            threshold=alert.threshold,
            spent=messages.money(
                alert.spent.nano_usd if limits.nano_usd is not None else None,
                alert.spent.tokens if limits.tokens is not None else None,
            ),
            limit=messages.money(limits.nano_usd, limits.tokens),
            ends=ends,
        )
        self._alerter.notify(
            Alert(
                agent=call.client.agent,
                session=call.session,
                circuit=f"{alert.budget} {alert.group}",
                count=alert.threshold,
                code="spend_alert",
                subject=messages.spend_alert_subject(alert.budget, alert.group, alert.threshold),
                text=text,
            )
        )
