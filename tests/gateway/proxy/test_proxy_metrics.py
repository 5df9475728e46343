"""The proxy's /metrics, scraped from the real proxy in front of the fake provider (issue 25)."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from gateway.calls.entry import CallLogEntry
from gateway.observability.metrics import (
    MAX_MODELS,
    OTHER,
    BudgetFigure,
    BudgetGauges,
    ModelCallMetrics,
)
from gateway.proxy.metrics import REFUSAL_CODES
from tests.fakes.llm_upstream import INPUT_TOKENS, OUTPUT_TOKENS
from tests.gateway.proxy.proxy_helpers import MODEL, PROXY_KEY, Rig, running_proxy

LIMITED = """
call_loop: {max_repeats: 2, window_seconds: 60, pause_seconds: 60}
budgets:
  - {name: agent-daily, per: [agent], limit_usd: 0.5, period: day}
"""
CALL_COST = (INPUT_TOKENS * 1.0 + OUTPUT_TOKENS * 2.0) / 1000

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


async def scrape(rig: Rig) -> Samples:
    """Every sample of the proxy's /metrics, by name and labels."""
    await rig.proxy.settle()
    async with aiohttp.ClientSession() as http, http.get(f"{rig.url}/metrics") as response:
        assert response.status == 200
        assert response.content_type == "text/plain"
        text = await response.text()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of the samples of `name` whose labels include `labels`."""
    wanted = set(labels.items())
    return sum(v for (n, have), v in samples.items() if n == name and wanted <= have)


async def chat(rig: Rig, text: str) -> int:
    """One chat completion through the proxy; its status."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 5}
    headers = {"Authorization": f"Bearer {PROXY_KEY}", "X-Loopwarden-Session": "s1"}
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"{rig.url}/openai/v1/chat/completions", data=json.dumps(body), headers=headers
        ) as response,
    ):
        await response.read()
        return response.status


async def test_issue25_proxy_metrics_count_calls_refusals_tokens_latency_and_money_saved() -> None:
    async with running_proxy(LIMITED) as rig:
        before = await scrape(rig)
        # Fixed label sets are there at zero before any call, for increase().
        for code in REFUSAL_CODES:
            assert (
                before[
                    ("proxy_refusals_total", frozenset({("provider", "gemini"), ("code", code)}))
                ]
                == 0
            )
        assert value(before, "spend_avoided_usd_total", guard="call_loop") == 0
        assert ("spend_anomalies_total", frozenset({("action", "pause")})) in before
        statuses = [await chat(rig, "same") for _ in range(3)]
        assert statuses == [200, 200, 429]
        samples = await scrape(rig)
    openai = {"provider": "openai", "agent": "billing-bot"}
    assert value(samples, "proxy_calls_total", **openai, outcome="forwarded") == 2
    assert value(samples, "proxy_calls_total", **openai, outcome="loop_detected") == 1
    assert value(samples, "proxy_refusals_total", provider="openai", code="loop_detected") == 1
    # The refused call's estimate is the money saved (the request log's cost saved).
    assert value(samples, "spend_avoided_usd_total", guard="call_loop") > 0
    assert value(samples, "spend_avoided_usd_total", guard="spend") == 0
    genai = {"gen_ai_provider_name": "openai", "gen_ai_request_model": MODEL}
    tokens = "gen_ai_client_token_usage"
    assert value(samples, f"{tokens}_count", **genai, gen_ai_token_type="input") == 2
    assert value(samples, f"{tokens}_sum", **genai, gen_ai_token_type="input") == 2 * INPUT_TOKENS
    assert value(samples, f"{tokens}_sum", gen_ai_token_type="output") == 2 * OUTPUT_TOKENS
    duration = "gen_ai_client_operation_duration_seconds_count"
    assert value(samples, duration, **genai, gen_ai_operation_name="chat") == 2
    assert value(samples, "proxy_added_seconds_count", provider="openai") == 2
    assert value(samples, "proxy_upstream_seconds_count", provider="openai") == 2
    # The budget's group against its limit, as the call store holds them.
    group = {"budget": "agent-daily", "group": "agent=billing-bot"}
    assert value(samples, "budget_spend_usd", **group) == pytest.approx(2 * CALL_COST)
    assert value(samples, "budget_limit_usd", **group) == 0.5


async def test_issue25_proxy_metrics_count_upstream_errors_by_reason(tmp_path: Path) -> None:
    state = f"{{backend: sqlite, path: '{tmp_path / 'state.sqlite3'}'}}"
    async with running_proxy(state=state) as rig:
        rig.upstream.fail_next(503)
        assert await chat(rig, "one") == 503
        samples = await scrape(rig)
    reason = {"provider": "openai"}
    assert value(samples, "proxy_upstream_errors_total", **reason, reason="status_5xx") == 1
    assert value(samples, "proxy_upstream_errors_total", **reason, reason="no_answer") == 0
    assert value(samples, "proxy_calls_total", outcome="upstream_error") == 1
    failed = "gen_ai_client_operation_duration_seconds_count"
    assert value(samples, failed, error_type="503") == 1
    assert value(samples, "gen_ai_client_token_usage_count") == 0
    # The proxy's sqlite state is timed: each operation's errors start at zero.
    assert ("state_errors_total", frozenset({("backend", "sqlite"), ("op", "claim")})) in samples


def test_issue25_model_names_past_the_bound_are_other() -> None:
    metrics = ModelCallMetrics(CollectorRegistry())
    for index in range(MAX_MODELS + 5):
        metrics.call_logged(
            CallLogEntry(
                at=0.0,
                provider="openai",
                agent="a",
                session="",
                circuit="a",
                model=f"model-{index}\x1b[2J",
                outcome="forwarded",
                status=200,
                input_tokens=1,
                output_tokens=1,
                cost=None,
                duration_ms=1.0,
            )
        )
    models = {
        sample.labels["gen_ai_request_model"]
        for family in metrics.duration.collect()
        for sample in family.samples
    }
    assert len(models) == MAX_MODELS + 1
    assert OTHER in models


def test_issue25_budget_gauges_show_the_most_spent_groups_only() -> None:
    gauges = BudgetGauges(CollectorRegistry())
    figures = [BudgetFigure("per-user", f"user={n}", float(n), None) for n in range(1000)]
    gauges.update([*figures, BudgetFigure("team", "all", 5000.0, 6000.0)])
    assert len(gauges.spend.values) == 200
    assert gauges.spend.values[("team", "all")] == 5000.0
    assert gauges.limit.values == {("team", "all"): 6000.0}
    assert ("per-user", "user=0") not in gauges.spend.values
    gauges.update([])
    assert gauges.spend.values == {}
