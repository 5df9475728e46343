"""The answer to a refused call: the provider's error format, retry headers, the alert.

A refusal is an error in the provider's format (429; 400 on the Gemini routes, see
`gemini`) with `Retry-After` (whole seconds, rounded up), `x-should-retry: false`,
`x-loopwarden-code` and, for a rule, `x-loopwarden-rule`; its message names the agent
and the session, never a key. A client's retry of a refused call within a few seconds
gets the first refusal's code and message, not `loop_paused` (`retries`). A refusal
that paused a circuit or a rule group (`CallDecision.paused_group`, set by the store's
decision) sends one alert; a retry answered from the first refusal sends none.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping

from aiohttp import web

from gateway.calls.entry import CallOutcome
from gateway.proxy import messages
from gateway.proxy.alerts import Alert, Alerter
from gateway.proxy.calls import ProxiedCall
from gateway.proxy.provider import error_response
from gateway.proxy.retries import FirstRefusals
from guards.call_loop import CallDecision

log = logging.getLogger("loopwarden.proxy")

_OUTCOMES: Mapping[str, CallOutcome] = {
    "loop_detected": "loop_detected",
    "loop_paused": "loop_paused",
    "duplicate_call": "duplicate_call",
}


def refusal_outcome(decision: CallDecision) -> CallOutcome:
    """The request-log outcome of a refused call: its code."""
    return _OUTCOMES[decision.code]


def retry_headers(code: str, retry_after: float) -> dict[str, str]:
    """The headers of any refusal: when to retry (whole seconds), that the SDK should not, why."""
    return {
        "Retry-After": str(max(0, math.ceil(retry_after))),
        "x-should-retry": "false",
        "x-loopwarden-code": code,
    }


def refusal_headers(decision: CallDecision) -> dict[str, str]:
    """The headers of a repeat guard's refusal (and, for a rule, which rule)."""
    headers = retry_headers(decision.code, decision.retry_after)
    if decision.rule is not None:
        headers["x-loopwarden-rule"] = decision.rule
    return headers


class Refusals:
    """Answers refused calls, remembers first refusals, alerts when a pause opens."""

    def __init__(self, alerter: Alerter, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._alerter = alerter
        self._first = FirstRefusals(clock=clock)

    def answer(self, call: ProxiedCall, refused: CallDecision) -> tuple[web.Response, CallDecision]:
        """The response to a refused call and the decision it gives (a retry: the first's)."""
        agent = call.client.agent
        decision = self._first.answer(call.circuit, call.fingerprint, refused)
        if decision is not refused:
            # A retry answered from the first refusal: that one sent the alert, if any.
            log.info("agent %s: retry on %s answered as %s", agent, refused.circuit, decision.code)
        elif refused.paused_group is None:
            log.info("agent %s: %s on %s", agent, decision.code, decision.circuit)
        else:
            self._alert(call, decision, refused.paused_group)
        text = messages.refusal(
            decision.message, code=decision.code, agent=agent, session=call.session
        )
        response = error_response(
            call.provider, "refused", decision.code, text, refusal_headers(decision)
        )
        return response, decision

    def _alert(self, call: ProxiedCall, decision: CallDecision, paused: str) -> None:
        """Log the pause and send its alert (a loop, or a `pause` rule's group)."""
        agent = call.client.agent
        if decision.rule is None:
            log.warning(
                "agent %s: loop detected on %s (%d identical calls); paused %.0f s",
                agent,
                paused,
                decision.count,
                decision.retry_after,
            )
            text = messages.loop_alert(
                agent=agent,
                session=call.session,
                circuit=paused,
                count=decision.count,
                pause=decision.retry_after,
            )
        else:
            log.warning("agent %s: rule %s paused %s", agent, decision.rule, paused)
            text = messages.rule_alert(
                agent=agent,
                session=call.session,
                group=paused,
                rule=decision.rule,
                count=decision.count,
                pause=decision.retry_after,
            )
        self._alerter.notify(
            Alert(
                agent=agent,
                session=call.session,
                circuit=paused,
                count=decision.count,
                code=decision.code,
                subject=messages.alert_subject(agent, decision.code),
                text=text,
            )
        )
