"""Uniqueness rules through the proxy's headers, and the alerts a pause raises (issue 6)."""

from __future__ import annotations

import openai
import pytest

from tests.gateway.proxy.proxy_helpers import MODEL, PROXY_KEY, Rig, running_proxy

RULES = """
rules:
  - {name: once-per-step, fields: [session, step], max_calls: 1, window_seconds: 24h}
  - name: same-prompt-per-customer
    fields: [customer, prompt]
    max_calls: 2
    window_seconds: 10m
    action: pause
    filters: {feature: 'inv*'}
"""


def client(rig: Rig, **headers: str) -> openai.AsyncOpenAI:
    named = {f"X-Loopwarden-{name.capitalize()}": value for name, value in headers.items()}
    return openai.AsyncOpenAI(
        base_url=f"{rig.url}/openai/v1", api_key=PROXY_KEY, default_headers=named
    )


async def ask(sdk: openai.AsyncOpenAI, text: str) -> None:
    await sdk.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": text}])


async def test_issue6_a_reject_rule_refuses_a_step_sent_twice() -> None:
    async with running_proxy(RULES) as rig:
        async with client(rig, session="file-9", step="page-3") as page3:
            await ask(page3, "Extract the totals of page 3")
            with pytest.raises(openai.RateLimitError) as caught:
                await ask(page3, "Please extract the totals of page 3 again")
        async with client(rig, session="file-9", step="page-4") as page4:
            await ask(page4, "Extract the totals of page 4")
        entries = await rig.logged()
    error = caught.value
    assert error.code == "duplicate_call"
    assert error.response.headers["x-loopwarden-rule"] == "once-per-step"
    assert error.response.headers["x-should-retry"] == "false"
    assert int(error.response.headers["Retry-After"]) == 86_400
    assert "once-per-step" in error.message
    assert [e.outcome for e in entries] == ["forwarded", "duplicate_call", "forwarded"]
    assert entries[1].rule == "once-per-step"
    assert len(rig.upstream.requests) == 2
    assert rig.alerts.alerts == []  # a reject rule pauses nothing


async def test_issue6_a_pause_rule_pauses_the_customer_and_alerts() -> None:
    async with running_proxy(RULES) as rig:
        for session in ("a", "b"):
            async with client(rig, session=session, customer="acme", feature="invoices") as sdk:
                await ask(sdk, "Where is my refund?")
        async with client(rig, session="c", customer="acme", feature="invoices") as sdk:
            with pytest.raises(openai.RateLimitError) as tripped:
                await ask(sdk, "Where is my refund?")
            with pytest.raises(openai.RateLimitError) as paused:
                await ask(sdk, "Cancel my order instead")
        async with client(rig, session="d", customer="globex", feature="invoices") as sdk:
            await ask(sdk, "Where is my refund?")
        async with client(rig, session="e", customer="acme", feature="billing") as sdk:
            await ask(sdk, "Where is my refund?")
        await rig.proxy.settle()
        group = "rule=same-prompt-per-customer/customer=acme"
        assert [p.circuit for p in await rig.store.paused()] == [group]
    assert tripped.value.code == "duplicate_call"
    assert paused.value.code == "loop_paused"
    (alert,) = rig.alerts.alerts
    assert (alert.agent, alert.session, alert.circuit, alert.count) == (
        "billing-bot",
        "c",
        group,
        3,
    )
    assert "same-prompt-per-customer" in alert.text


async def test_issue6_a_loop_sends_one_alert_per_pause() -> None:
    async with running_proxy() as rig:
        async with client(rig, session="nightly") as sdk:
            for _ in range(5):
                await ask(sdk, "Is the report ready?")
            for _ in range(4):
                with pytest.raises(openai.RateLimitError):
                    await ask(sdk, "Is the report ready?")
        await rig.proxy.settle()
    (alert,) = rig.alerts.alerts
    assert alert.code == "loop_detected"
    assert (alert.agent, alert.session, alert.count) == ("billing-bot", "nightly", 6)
    assert alert.circuit == "billing-bot/session=nightly"
    assert "6 identical calls" in alert.text
    assert "loopwarden circuits reopen 'billing-bot/session=nightly'" in alert.text
