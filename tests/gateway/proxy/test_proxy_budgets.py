"""Spend limits in the proxy: refusals in provider formats, charging, alerts, admin (issue 14).

A real proxy in front of the fake provider; the OpenAI SDK where a client's retry rules
matter. The fake answers 11 input and 7 output tokens; `gpt-4o*` costs $1 / $2 per 1,000
tokens in the test config, so one call costs $0.025.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from pathlib import Path
from zoneinfo import ZoneInfo

import aiohttp
import openai
import pytest

from gateway.app.errors import ConfigError
from gateway.calls.budgets import Amount, nano, period_span
from gateway.cli.main import main
from gateway.config import parse_config
from tests.fakes.llm_upstream import INPUT_TOKENS, OUTPUT_TOKENS, FakeLLM
from tests.gateway.proxy.proxy_helpers import (
    ADMIN_TOKEN,
    MODEL,
    PROXY_KEY,
    Rig,
    proxy_yaml,
    running_proxy,
)

CALL_TOKENS = INPUT_TOKENS + OUTPUT_TOKENS
CALL_COST = (INPUT_TOKENS * 1.0 + OUTPUT_TOKENS * 2.0) / 1000
TOKENS_BUDGET = """
budgets:
  - {name: agent-tokens, per: [agent], limit_tokens: 40, period: day}
"""
ROOMY_BUDGET = """
budgets:
  - {name: agent-tokens, per: [agent], limit_tokens: 10000, period: day}
"""
DOLLAR_BUDGET = """
budgets:
  - {name: agent-daily, per: [agent], limit_usd: 0.05, period: day}
"""


def body(text: str = "hi", *, model: str = MODEL, stream: bool = False, **extra: object) -> bytes:
    data: dict[str, object] = {
        "model": model,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": 5,
    }
    data.update(extra)
    if stream:
        data["stream"] = True
        data["stream_options"] = {"include_usage": True}
    return json.dumps(data).encode()


async def post(
    rig: Rig, path: str, data: bytes, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    sent = {"Authorization": f"Bearer {PROXY_KEY}", "Content-Type": "application/json"}
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{rig.url}{path}", data=data, headers={**sent, **(headers or {})}) as answer,
    ):
        return answer.status, dict(answer.headers), await answer.read()


async def chat(
    rig: Rig,
    text: str = "hi",
    *,
    model: str = MODEL,
    stream: bool = False,
    max_tokens: int = 5,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, str], bytes]:
    data = body(text, model=model, stream=stream, max_tokens=max_tokens)
    return await post(rig, "/openai/v1/chat/completions", data, headers)


async def spent(rig: Rig) -> dict[str, Amount]:
    """The spend of each live group, by its shown budget and values."""
    await rig.proxy.settle()
    groups = await rig.store.spend_groups()
    return {key.split("\x1f")[0] + " " + key.split("\x1f")[2]: g.spent for key, g in groups}


def seconds_to_day_end() -> float:
    return period_span("day", ZoneInfo("UTC"), time.time()).ends_at - time.time()


async def test_issue14_openai_sdk_gets_budget_exceeded_once_with_retry_after_to_the_day_end() -> (
    None
):
    async with running_proxy(TOKENS_BUDGET) as rig:
        sdk = openai.AsyncOpenAI(base_url=f"{rig.url}/openai/v1", api_key=PROXY_KEY)
        async with sdk:
            await sdk.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "one"}], max_tokens=5
            )
            with pytest.raises(openai.RateLimitError) as caught:
                await sdk.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": "two"}], max_tokens=5
                )
        # max_retries=2 by default, yet the refusal was not retried.
        assert rig.served == ["/openai/v1/chat/completions"] * 2
        assert len(rig.upstream.calls("/v1/chat/completions")) == 1
        error = caught.value
        assert error.code == "budget_exceeded"
        headers = error.response.headers
        assert headers["x-should-retry"] == "false"
        assert headers["x-loopwarden-budget"] == "agent-tokens"
        assert abs(int(headers["Retry-After"]) - seconds_to_day_end()) <= 2
        assert "agent-tokens" in error.message
        assert "agent=billing-bot" in error.message
        assert "40 tokens" in error.message
        refused = (await rig.logged())[-1]
        # Logged with what it would have cost: its own estimate, never charged.
        assert (refused.outcome, refused.estimated) == ("budget_exceeded", True)
        assert refused.output_tokens == 5
        assert refused.cost is not None
        charged = Amount(nano(CALL_COST), CALL_TOKENS)
        assert await spent(rig) == {'agent-tokens ["billing-bot"]': charged}


async def test_issue14_anthropic_and_gemini_refusals_are_in_their_own_formats() -> None:
    budget = "budgets: [{name: none-left, per: [], limit_tokens: 0, period: month}]"
    async with running_proxy(budget) as rig:
        anthropic = json.dumps(
            {"model": "claude-x", "max_tokens": 5, "messages": [{"role": "user", "content": "q"}]}
        ).encode()
        status, headers, raw = await post(rig, "/anthropic/v1/messages", anthropic)
        assert status == 429
        error = json.loads(raw)["error"]
        assert error["type"] == "rate_limit_error"
        assert error["details"]["error_code"] == "budget_exceeded"
        assert headers["x-should-retry"] == "false"
        gemini = json.dumps({"contents": [{"parts": [{"text": "q"}]}]}).encode()
        status, headers, raw = await post(
            rig, "/gemini/v1beta/models/gemini-2.0-flash:generateContent", gemini
        )
        # As every refusal on the Gemini routes: 400, outside google-genai's retry list.
        assert status == 400
        error = json.loads(raw)["error"]
        assert error["status"] == "FAILED_PRECONDITION"
        assert error["details"][0]["reason"] == "BUDGET_EXCEEDED"
        assert int(headers["Retry-After"]) > 0
        assert rig.upstream.requests == []


async def test_issue14_a_call_without_the_per_header_counts_in_the_none_group() -> None:
    budget = "budgets: [{name: per-customer, per: [customer], limit_tokens: 40, period: week}]"
    async with running_proxy(budget) as rig:
        assert (await chat(rig, "a"))[0] == 200
        # Leaving the header out never escapes the budget: (none) is one group.
        assert (await chat(rig, "b"))[0] == 429
        acme = {"X-Loopwarden-Customer": "acme"}
        assert (await chat(rig, "c", headers=acme))[0] == 200
        status, _, raw = await chat(rig, "d", headers=acme)
        assert status == 429
        # The refusal names this group, and no other customer's figures.
        message = json.loads(raw)["error"]["message"]
        assert "customer=acme" in message
        assert "(none)" not in message
        assert set(await spent(rig)) == {
            'per-customer ["(none)"]',
            'per-customer ["acme"]',
        }


async def test_issue14_provider_failures_cost_nothing_and_streams_charge_the_final_chunk() -> None:
    async with running_proxy(DOLLAR_BUDGET) as rig:
        rig.upstream.fail_next(503)
        assert (await chat(rig, "fails"))[0] == 503
        group = 'agent-daily ["billing-bot"]'
        assert (await spent(rig)).get(group, Amount()) == Amount()
        status, _, raw = await chat(rig, "streamed", stream=True)
        assert status == 200
        assert b'"usage"' in raw
        assert await spent(rig) == {group: Amount(nano(CALL_COST), CALL_TOKENS)}
        ((_, record),) = await rig.store.spend_groups()
        assert record.held == Amount()


async def test_issue14_a_malformed_usage_block_is_logged_and_charged_by_the_estimate(
    caplog: pytest.LogCaptureFixture,
) -> None:
    usage = {"prompt_tokens": -5, "completion_tokens": 7.5, "total_tokens": "x"}
    chunk = {"id": "c", "object": "chat.completion.chunk", "choices": [], "usage": usage}
    fake = FakeLLM()
    fake.stream_bodies.append(f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode())
    async with running_proxy(ROOMY_BUDGET, upstream=fake) as rig:
        caplog.set_level(logging.WARNING, "loopwarden.proxy")
        data = body("x", stream=True)
        status, _, _ = await post(rig, "/openai/v1/chat/completions", data)
        assert status == 200
        (entry,) = await rig.logged()
        assert entry.estimated
        tokens_in = math.ceil(len(data) / 4)
        cost = (tokens_in * 1.0 + 5 * 2.0) / 1000
        estimate = Amount(nano(cost), tokens_in + 5)
        assert await spent(rig) == {'agent-tokens ["billing-bot"]': estimate}
        assert any("without valid token counts" in r.getMessage() for r in caplog.records)
        # The next request is served.
        assert (await chat(rig, "next"))[0] == 200


async def test_issue14_an_unpriced_model_is_charged_by_tokens_and_warned_about_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with running_proxy(DOLLAR_BUDGET) as rig:
        caplog.set_level(logging.WARNING, "loopwarden.proxy")
        for text in ("a", "b"):
            assert (await chat(rig, text, model="llama-local-7b"))[0] == 200
        (record,) = (await spent(rig)).values()
        assert record == Amount(0, 2 * CALL_TOKENS)
        warnings = [r for r in caplog.records if "has no price" in r.getMessage()]
        assert len(warnings) == 1
        assert all(entry.cost is None for entry in await rig.logged())
    async with running_proxy(DOLLAR_BUDGET + "unpriced: refuse\n") as rig:
        status, _, raw = await chat(rig, "c", model="llama-local-7b")
        assert status == 429
        assert "no price" in json.loads(raw)["error"]["message"]
        assert rig.upstream.requests == []
        assert (await chat(rig, "priced"))[0] == 200


async def test_issue14_alerts_at_50_and_100_percent_once_per_group_and_period() -> None:
    async with running_proxy(DOLLAR_BUDGET) as rig:
        # $0.025 a call against $0.05: the first reaches 50%, the second 100% exactly.
        for text in ("one", "two"):
            status, _, _ = await chat(rig, text, max_tokens=0)
            assert status == 200
        for text in ("three", "four"):
            assert (await chat(rig, text, max_tokens=0))[0] == 429
        await rig.proxy.settle()
        texts = [alert.text for alert in rig.alerts.alerts]
        assert len(texts) == 2
        assert "reached 50%" in texts[0]
        assert "reached 100%" in texts[1]
        assert "spent $0.0500 of $0.0500" in texts[1]
        assert "POST /admin/spend/limit" in texts[1]


async def test_issue14_admin_spend_routes_show_raise_and_reset_audited() -> None:
    async with running_proxy(DOLLAR_BUDGET) as rig, aiohttp.ClientSession() as http:
        auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        for text in ("one", "two"):
            await chat(rig, text, max_tokens=0)
        assert (await chat(rig, "three", max_tokens=0))[0] == 429
        async with http.get(f"{rig.url}/admin/spend", headers=auth) as answer:
            table = (await answer.json())["result"]
        assert "agent-daily" in table
        assert "agent=billing-bot" in table
        assert "$0.0500" in table
        assert "100.0" in table
        hostile = [
            ({"budget": "agent-daily", "limit_usd": 1e308}, "limit_usd"),
            ({"budget": "agent-daily"}, "limit_usd, limit_tokens"),
            ({"budget": "agent-daily", "limit_tokens": 10**50}, "limit_tokens"),
        ]
        for data, named in hostile:
            url = f"{rig.url}/admin/spend/limit"
            async with http.post(url, json=data, headers=auth) as answer:
                assert answer.status == 400
                assert named in (await answer.json())["error"]
        raise_it = {"budget": "agent-daily", "limit_usd": 1.0}
        url = f"{rig.url}/admin/spend/limit"
        async with http.post(url, json=raise_it, headers=auth) as answer:
            assert answer.status == 200
        # Raised: the next call goes through.
        assert (await chat(rig, "four", max_tokens=0))[0] == 200
        reset = {"budget": "agent-daily", "group": "agent=billing-bot"}
        async with http.post(f"{rig.url}/admin/spend/reset", json=reset, headers=auth) as answer:
            assert "reset the spend" in (await answer.json())["result"]
        assert await rig.store.spend_groups() == []
        unknown = {"budget": "nope", "group": "agent=x"}
        async with http.post(f"{rig.url}/admin/spend/reset", json=unknown, headers=auth) as answer:
            assert answer.status == 422
        commands = [entry.command for entry in await rig.proxy.state.recent_audit(10)]
        assert any(c.startswith("POST /admin/spend/reset") for c in commands)


async def test_issue14_spend_command_prints_the_table_from_sqlite(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = f"{{backend: sqlite, path: '{tmp_path}/state.db'}}"
    async with running_proxy(DOLLAR_BUDGET, state=state) as rig:
        await chat(rig, "one", max_tokens=0)
        await rig.proxy.settle()
        path = tmp_path / "config.yaml"
        path.write_text(proxy_yaml(rig.upstream.url, DOLLAR_BUDGET, state=state))
        assert await asyncio.to_thread(main, ["spend", "--config", str(path)]) == 0
        assert await asyncio.to_thread(main, ["spend", "--config", str(path), "--by", "model"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["BUDGET", "GROUP", "SPENT", "HELD", "LIMIT", "%", "PERIOD", "END"]
    assert lines[1].split()[:6] == [
        "agent-daily",
        "agent=billing-bot",
        "$0.0250",
        "$0.0000",
        "$0.0500",
        "50.0",
    ]
    assert lines[2] == "no budget has spent anything this period"


@pytest.mark.parametrize(
    ("budget", "path"),
    [
        ("{name: b, per: [agnt], limit_usd: 1}", "proxy.budgets.0.per.0"),
        ("{name: b, limit_usd: -1}", "proxy.budgets.0.limit_usd"),
        ("{name: b, per: [agent]}", "proxy.budgets.0"),
        ("{name: b, limit_usd: 1, period: year}", "proxy.budgets.0.period"),
        ("{name: b, limit_usd: 1e308}", "proxy.budgets.0.limit_usd"),
        ("{name: b, limit_usd: .inf}", "proxy.budgets.0.limit_usd"),
        ("{name: b, limit_usd: 1, filters: {colour: red}}", "proxy.budgets.0.filters"),
    ],
)
def test_issue14_check_config_names_the_budget_field(budget: str, path: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(f"proxy: {{budgets: [{budget}]}}", env={})
    assert caught.value.path.startswith(path)


def test_issue14_a_5000_digit_limit_is_refused_with_its_line() -> None:
    with pytest.raises(ConfigError, match="too many digits"):
        parse_config("proxy: {budgets: [{name: b, limit_tokens: " + "9" * 5000 + "}]}", env={})


def test_issue14_an_unknown_time_zone_is_named() -> None:
    with pytest.raises(ConfigError, match="unknown time zone") as caught:
        parse_config("proxy: {budget_timezone: Mars/Olympus}", env={})
    assert caught.value.path == "proxy.budget_timezone"


async def test_issue14_a_client_hanging_up_mid_stream_is_one_info_line_and_still_charged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gate = asyncio.Event()
    async with running_proxy(ROOMY_BUDGET, upstream=FakeLLM(gate=gate)) as rig:
        caplog.set_level(logging.INFO)
        data = body("hang up", stream=True)
        reader, writer = await asyncio.open_connection("127.0.0.1", rig.proxy.port)
        writer.write(
            b"POST /openai/v1/chat/completions HTTP/1.1\r\nHost: proxy\r\n"
            + f"Authorization: Bearer {PROXY_KEY}\r\nContent-Type: application/json\r\n".encode()
            + f"Content-Length: {len(data)}\r\n\r\n".encode()
            + data
        )
        await writer.drain()
        await reader.read(64)
        writer.transport.abort()
        await rig.upstream.first_chunk_sent.wait()
        gate.set()
        for _ in range(100):
            if any("disconnected" in r.getMessage() for r in caplog.records):
                break
            await asyncio.sleep(0.02)
        charged = Amount(nano(CALL_COST), CALL_TOKENS)
        assert await spent(rig) == {'agent-tokens ["billing-bot"]': charged}
    lines = [r for r in caplog.records if "disconnected" in r.getMessage()]
    assert [(r.levelno, r.getMessage()) for r in lines] == [
        (logging.INFO, "openai client disconnected during the response on billing-bot")
    ]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


BOUND_KEY = "lw-acme-key-0123"
ACME_BUDGETS = """
budgets:
  - {name: agent-daily, per: [agent], limit_usd: 0.05, period: day}
  - {name: per-customer, per: [customer], limit_tokens: 1000, period: day}
"""


async def test_issue20_budgets_are_bound_to_the_key_not_to_the_agent_header() -> None:
    keys = f"{BOUND_KEY}: {{agent: acme-bot, customer: acme}}"
    async with running_proxy(ACME_BUDGETS, keys=keys) as rig, aiohttp.ClientSession() as http:
        for text in ("one", "two"):
            assert (await chat(rig, text, max_tokens=0))[0] == 200
        assert (await chat(rig, "three", max_tokens=0))[0] == 429
        # Refused for its budget, the client names another agent, or a made-up one: refused
        # before anything is counted, forwarded or charged.
        for agent in ("not-me-1", "support-bot", "Billing-bot"):
            status, _, raw = await chat(
                rig, "four", max_tokens=0, headers={"X-Loopwarden-Agent": agent}
            )
            assert status == 400
            error = json.loads(raw)["error"]
            assert error["code"] == "invalid_field"
            assert "X-Loopwarden-Agent" in error["message"]
        # Its own name is accepted, and refused for the budget as before.
        own = {"X-Loopwarden-Agent": "billing-bot"}
        assert (await chat(rig, "five", max_tokens=0, headers=own))[0] == 429
        assert len(rig.upstream.calls("/v1/chat/completions")) == 2
        # A key that sets the customer: the header may not move its calls to another one.
        acme = {"Authorization": f"Bearer {BOUND_KEY}", "X-Loopwarden-Customer": "globex"}
        status, _, _ = await chat(rig, "six", max_tokens=0, headers=acme)
        assert status == 400
        acme["X-Loopwarden-Customer"] = "acme"
        assert (await chat(rig, "seven", max_tokens=0, headers=acme))[0] == 200
        # Another key's open customer field is still the header's.
        globex = {"X-Loopwarden-Customer": "globex"}
        assert (await chat(rig, "eight", max_tokens=0, headers=globex))[0] == 429
        async with http.get(
            f"{rig.url}/admin/spend", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
        ) as answer:
            table = (await answer.json())["result"]
        assert set(await spent(rig)) == {
            'agent-daily ["billing-bot"]',
            'agent-daily ["acme-bot"]',
            'per-customer ["(none)"]',
            'per-customer ["acme"]',
        }
        assert "not-me" not in table
        assert "support-bot" not in table
