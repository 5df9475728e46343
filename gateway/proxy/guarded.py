"""The guarded model call: one admission for the proxy and the gateway's `openai` agents.

Every model call, a client's through the proxy (`gateway.proxy.app`) or an agent's own
(`gateway.agents.openai`), is admitted here, in the same steps:
- its budgets (when one applies, or the anomaly detector may pause the agent) and the
  call guard decide it in one store step (`CallStore.admit`: one transaction, one Redis
  script call); with neither, the call guard alone (`CallStore.decide`);
- a refusal of a call guard in shadow mode (`ShadowGuards`: the circuit's, a rule's) is
  waived: logged at INFO with `shadow: "true"`, and the call is sent holding its
  estimate like an admitted one, so a guard in shadow never lets calls past a budget
  (issue 20). The pause of an agent the anomaly detector stopped (`AgentPaused`) is a
  spend decision, not a guard's: no guard's shadow mode waives it;
- a budget in shadow mode (an agent's `policy.spend.mode: shadow`) passes a call it
  refuses on to the call guard, holding nothing (its caller charges it afterwards);
- a refusal, a budget's or a guard's, is one request-log entry (`refused`); the caller
  answers it its own way (the proxy in the provider's error format, an agent by ending
  the turn).
After the call its caller logs it (`record`), uncounts a provider failure
(`CallStore.record_outcome`) and charges what it used.

With tracing on, a caller wraps each call in `chat` (one `chat <model>` span: provider,
model, agent, circuit; the proxy's continues the client's `traceparent`): the guard's
refusal or waiver is an `apply_guardrail call_loop` span inside it (a budget's,
`apply_guardrail spend`), a refused call ends with `error.type` its outcome, and the call's
request-log entry (`RequestLog.record`, or `record` here without a log) adds the outcome,
the HTTP status and the token usage (`tracing.call_outcome`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass

from gateway.calls.budgets import ADMITTED_FREE, SpendEvent, SpendVerdict
from gateway.calls.entry import CallLogEntry, CallOutcome
from gateway.calls.store import ENFORCED, CallStore, ShadowGuards
from gateway.observability import tracing
from gateway.proxy.provider import Usage
from gateway.proxy.refusal import refusal_outcome
from gateway.proxy.request_log import LoggedRequest, RequestLog
from guards.call_loop import CallDecision, CallLoopPolicy


@dataclass(frozen=True, slots=True)
class Admitted:
    """A call the budgets let through: the call guard's verdict, and whether it is waived.

    `spend` is the budgets' verdict (a refusal only when a budget in shadow mode let the
    call on); `waived` is True when a guard in shadow mode gave the refusal `decision`,
    and the call is sent all the same.
    """

    decision: CallDecision
    spend: SpendVerdict = ADMITTED_FREE
    waived: bool = False

    @property
    def sent(self) -> bool:
        """True when the call goes to the model."""
        return self.decision.allowed or self.waived


@dataclass(frozen=True, slots=True)
class OverBudget:
    """A call a budget refused: the call guard never counted it."""

    spend: SpendVerdict


def shadow_code(refused: CallDecision) -> str:
    """A waived refusal as it is shown: its code, and a rule's name (`duplicate_call:NAME`)."""
    if refused.code == "duplicate_call":
        return f"{refused.code}:{refused.rule}"
    return refused.code


class GuardedCalls:
    """Admits model calls on one call store and logs them (`log`: whose log lines)."""

    def __init__(
        self, store: CallStore, request_log: RequestLog | None, *, log: logging.Logger
    ) -> None:
        self._store = store
        self.request_log = request_log  # None: the calls are not logged
        self._log = log

    def chat(
        self, call: LoggedRequest, *, parent: Mapping[str, str] | None = None
    ) -> AbstractContextManager[tracing.Span]:
        """The `chat` span of one model call (`parent`: a traced client's request headers)."""
        tracer = tracing.tracer()
        if not tracer.enabled:
            return tracing.NO_SPAN
        attributes: dict[str, tracing.AttributeValue] = {
            tracing.OPERATION_NAME: tracing.CHAT,
            tracing.PROVIDER_NAME: call.provider_name,
            tracing.REQUEST_MODEL: call.model,
            tracing.AGENT_NAME: call.agent,
            tracing.CIRCUIT: call.circuit,
        }
        kind: tracing.SpanKind = "client"
        return tracer.span(f"{tracing.CHAT} {call.model}", attributes, kind=kind, parent=parent)

    async def decide(
        self,
        call: LoggedRequest,
        *,
        rule_fields: Mapping[str, str],
        policy: CallLoopPolicy | None = None,
        shadow: ShadowGuards = ENFORCED,
    ) -> Admitted:
        """Decide a call no budget applies to: the call guard alone.

        `rule_fields` are the fields the store's rules read, `policy` the circuit's
        call-loop policy (None: the store's), `shadow` which guards run in shadow mode.
        """
        decision = await self._store.decide(
            call.circuit, call.fingerprint, rule_fields, policy=policy
        )
        return self._waiver(call, decision, ADMITTED_FREE, shadow)

    async def admit(
        self,
        call: LoggedRequest,
        event: SpendEvent,
        *,
        rule_fields: Mapping[str, str],
        policy: CallLoopPolicy | None = None,
        shadow: ShadowGuards = ENFORCED,
        budget_shadow: bool = False,
    ) -> Admitted | OverBudget:
        """Decide a call on its budgets (`event`) and the call guard, as `decide` does.

        With `budget_shadow` a call the budgets refuse goes on to the call guard.
        """
        store = self._store
        admission = await store.admit(
            call.circuit, call.fingerprint, rule_fields, event, policy=policy, shadow=shadow
        )
        decision = admission.call
        if decision is None and budget_shadow:
            decision = await store.decide(
                call.circuit, call.fingerprint, rule_fields, policy=policy
            )
        if decision is None:
            return OverBudget(admission.spend)
        return self._waiver(call, decision, admission.spend, shadow)

    def _waiver(
        self, call: LoggedRequest, decision: CallDecision, spend: SpendVerdict, shadow: ShadowGuards
    ) -> Admitted:
        """The admission of a decided call: a refusal of a guard in shadow mode is waived."""
        if decision.allowed or not shadow.covers(decision):
            return Admitted(decision, spend)
        _guardrail("call_loop", shadow_code(decision), tracing.SHADOW_REFUSED)
        self._log.info(
            "agent %s: shadow: would have refused the model call (%s) on %s; sent anyway",
            call.agent,
            shadow_code(decision),
            decision.circuit,
            extra={"decision": decision.code, "shadow": "true"},
        )
        return Admitted(decision, spend, waived=True)

    def refused(
        self, call: LoggedRequest, decision: CallDecision | None, *, unavailable: bool = False
    ) -> None:
        """Log a refused call: `budget_exceeded` (no decision; `state_unavailable` when the
        budgets' shared state was unreachable), else the guard's code and rule."""
        if decision is None:
            code: CallOutcome = "state_unavailable" if unavailable else "budget_exceeded"
            _guardrail("spend", code, tracing.REFUSED)
            self.record(call, code, None, None)
        else:
            _guardrail("call_loop", shadow_code(decision), tracing.REFUSED)
            self.record(call, refusal_outcome(decision), None, None, rule=decision.rule)

    def record(
        self,
        call: LoggedRequest,
        outcome: CallOutcome,
        status: int | None,
        usage: Usage | None,
        *,
        rule: str | None = None,
    ) -> CallLogEntry | None:
        """Queue the call's request-log entry (and return it), when there is a request log."""
        if self.request_log is None:
            tracing.call_outcome(outcome, status, usage)
            return None
        return self.request_log.record(call, outcome, status, usage, rule=rule)


def _guardrail(guard: str, code: str, result: str) -> None:
    """An `apply_guardrail` span for the call guard's or a budget's verdict (tracing on)."""
    tracing.guardrail(guard, code, result, shadow=result == tracing.SHADOW_REFUSED)
