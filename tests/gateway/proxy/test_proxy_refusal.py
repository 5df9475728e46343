"""The answer to a refused call: headers, the log outcome, one alert per pause (issue 10)."""

from __future__ import annotations

import json

import pytest

from gateway.proxy.alerts import Alerter
from gateway.proxy.auth import ProxyClient
from gateway.proxy.calls import ProxiedCall, build_call
from gateway.proxy.gemini import GeminiProvider
from gateway.proxy.openai import OpenAIProvider
from gateway.proxy.provider import GuardedCall, Provider
from gateway.proxy.refusal import Refusals, refusal_headers, refusal_outcome
from guards.call_loop import CallCode, CallDecision
from tests.gateway.proxy.proxy_helpers import MODEL, RecordingChannel

CIRCUIT = "billing-bot/session=run-1"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def refused(
    code: CallCode,
    *,
    retry_after: float = 300.0,
    rule: str | None = None,
    paused_group: str | None = None,
) -> CallDecision:
    return CallDecision(
        allowed=False,
        code=code,
        retry_after=retry_after,
        count=6,
        circuit=CIRCUIT,
        message=f"refused: {code}",
        rule=rule,
        paused_group=paused_group,
    )


def a_call(provider: Provider | None = None) -> ProxiedCall:
    described = GuardedCall(MODEL, [{"role": "user", "content": "hi"}], stream=False)
    client = ProxyClient(agent="billing-bot", root="billing-bot")
    headers = {"X-Loopwarden-Session": "run-1"}
    return build_call(
        provider or OpenAIProvider(), client, headers, described, size=10, started=0.0
    )


@pytest.mark.parametrize(
    ("retry_after", "header"), [(0.2, "1"), (299.0, "299"), (299.01, "300"), (-3.0, "0")]
)
def test_issue10_retry_after_is_whole_seconds_rounded_up_never_negative(
    retry_after: float, header: str
) -> None:
    headers = refusal_headers(refused("loop_paused", retry_after=retry_after))
    assert headers == {
        "Retry-After": header,
        "x-should-retry": "false",
        "x-loopwarden-code": "loop_paused",
    }


def test_issue10_a_rule_refusal_names_its_rule_and_logs_its_code() -> None:
    decision = refused("duplicate_call", rule="once-per-step")
    assert refusal_headers(decision)["x-loopwarden-rule"] == "once-per-step"
    assert refusal_outcome(decision) == "duplicate_call"
    assert refusal_outcome(refused("loop_detected")) == "loop_detected"


async def test_issue10_one_alert_per_pause_from_the_decision_s_paused_group() -> None:
    channel = RecordingChannel()
    alerter = Alerter([channel])
    clock = Clock()
    refusals = Refusals(alerter, clock=clock)
    call = a_call()
    loop = refused("loop_detected", paused_group=CIRCUIT)
    response, answered = refusals.answer(call, loop)
    assert answered is loop
    assert response.status == 429
    assert response.headers["x-loopwarden-code"] == "loop_detected"
    # A quick retry gets the first refusal's code and no second alert.
    clock.now += 2
    _, retried = refusals.answer(call, refused("loop_paused", retry_after=298.0))
    assert (retried.code, retried.retry_after) == ("loop_detected", 298.0)
    # A reject rule paused nothing; a pause rule paused its group.
    refusals.answer(call, refused("duplicate_call", rule="once"))
    group = "rule:per-customer/customer=acme"
    refusals.answer(call, refused("duplicate_call", rule="per-customer", paused_group=group))
    await alerter.drain(1.0)
    assert [(alert.circuit, alert.code) for alert in channel.alerts] == [
        (CIRCUIT, "loop_detected"),
        (group, "duplicate_call"),
    ]
    assert "rule per-customer paused" in channel.alerts[1].text


def test_issue10_a_refusal_is_in_the_provider_s_format_and_names_no_key() -> None:
    refusals = Refusals(Alerter([]))
    response, _ = refusals.answer(a_call(GeminiProvider()), refused("loop_paused"))
    assert response.status == 400  # google-genai retries 429 whatever the body says
    assert response.text is not None
    error = json.loads(response.text)["error"]
    assert error["status"] == "FAILED_PRECONDITION"
    assert "agent billing-bot, session run-1" in error["message"]
