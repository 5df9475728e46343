"""The console's Calls and Rules data over HTTP: `/admin/calls*` and `/admin/rules` (issue 12).

The proxy runs for real in front of the fake provider (its SDK calls are logged by the
proxy itself) and the gateway runs for real with no bots; both answer the same routes
from their CallStore. Hostile query values are refused naming the field, and the server
goes on serving.
"""

from __future__ import annotations

import contextlib
import csv
import io
import math
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path
from types import MappingProxyType
from typing import Any
from urllib.parse import quote

import aiohttp
import openai
import pytest

from gateway.calls.entry import CallLogEntry, CallOutcome
from gateway.calls.query import Cursor
from gateway.cli.calls import preview as preview_command
from gateway.config import parse_config
from gateway.proxy.app import ProxyServer
from tests.fakes.llm_upstream import FakeLLM
from tests.gateway.proxy.proxy_helpers import (
    ADMIN_TOKEN,
    MODEL,
    PROXY_KEY,
    Rig,
    proxy_yaml,
    running_proxy,
)
from tests.gateway.runtime_helpers import FakePlatform, gateway_for

AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z
RULES = """
rules:
  - {name: once-per-session, fields: [session], max_calls: 1, window_seconds: 1h}
  - {name: faq-twice, fields: [customer, prompt], max_calls: 2, window_seconds: 10m,
     action: pause, mode: shadow}
"""
SCRIPT = "<script>alert(1)</script>"


def entry(
    n: int, agent: str = "billing-bot", outcome: CallOutcome = "forwarded", **fields: str
) -> CallLogEntry:
    return CallLogEntry(
        at=T0 + n,
        provider="openai",
        agent=agent,
        session=f"run-{n % 2}",
        circuit=f"{agent}/session=run-{n % 2}",
        model=MODEL,
        outcome=outcome,
        status=200 if outcome == "forwarded" else None,
        input_tokens=10,
        output_tokens=5,
        cost=None if n == 3 else 0.25,
        estimated=outcome != "forwarded",
        fingerprint="fp-same",
        fields=MappingProxyType({"customer": "acme", **fields}),
    )


async def get(port: int, path: str, **params: str) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://127.0.0.1:{port}{path}", params=params, headers=AUTH) as response,
    ):
        return response.status, await response.json()


async def ask(port: int, text: str, session: str = "batch-1") -> None:
    """One chat completion through the proxy (a refusal raises the SDK's error)."""
    async with openai.AsyncOpenAI(
        base_url=f"http://127.0.0.1:{port}/openai/v1",
        api_key=PROXY_KEY,
        default_headers={"X-Loopwarden-Session": session},
        max_retries=0,
    ) as sdk:
        await sdk.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": text}])


async def ask_anyway(port: int, text: str, session: str) -> None:
    """One chat completion through the proxy, refused (a 429) or not."""
    with contextlib.suppress(openai.RateLimitError):
        await ask(port, text, session)


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    async with running_proxy() as running:
        yield running


async def test_issue12_the_calls_page_filters_pages_and_totals(rig: Rig) -> None:
    for n in range(10):
        await rig.store.log_call(entry(n, outcome="forwarded" if n % 3 else "loop_detected"))
    await rig.store.log_call(entry(10, agent="support-bot"))
    port = rig.proxy.port

    status, body = await get(port, "/admin/calls", agent="billing-bot", limit="4")
    assert status == 200
    assert [call["at"] for call in body["calls"]] == [T0 + n for n in (9, 8, 7, 6)]
    first = body["calls"][3]  # call 6: a refusal, with an estimated cost
    assert first["iso"] == "2026-01-01T00:00:06.000+00:00"
    assert (first["outcome"], first["refused"], first["estimated"]) == ("loop_detected", True, True)
    assert body["totals"] == {
        "calls": 10,
        "refused": 4,
        "input_tokens": 60,
        "output_tokens": 30,
        "cost": 1.5,  # six sent
        "cost_saved": 0.75,  # four refused, one of them (call 3) unpriced
        "unpriced": 1,
    }
    assert body["result"].startswith("10 calls (4 refused, 1 unpriced): cost 1.500000")
    seen = [call["at"] for call in body["calls"]]
    while body["next_cursor"] is not None:
        status, body = await get(
            port, "/admin/calls", agent="billing-bot", limit="4", cursor=body["next_cursor"]
        )
        seen += [call["at"] for call in body["calls"]]
    assert seen == [T0 + n for n in range(9, -1, -1)]

    status, body = await get(
        port, "/admin/calls", agent="billing-bot", outcome="loop_detected", since=f"{T0 + 1:.0f}"
    )
    assert [call["at"] for call in body["calls"]] == [T0 + 9, T0 + 6, T0 + 3]
    assert body["calls"][2]["cost"] is None
    assert body["calls"][2]["priced"] is False
    assert body["totals"]["cost_saved"] == 0.5
    status, body = await get(port, "/admin/calls", customer="acme", until=f"{T0 + 1:.0f}")
    assert [call["at"] for call in body["calls"]] == [T0]


async def test_issue12_proxied_calls_and_the_refusal_that_saved_money_show_up(rig: Rig) -> None:
    for _ in range(5):
        await ask(rig.proxy.port, "Is the export done?")
    with pytest.raises(openai.RateLimitError):
        await ask(rig.proxy.port, "Is the export done?")
    await rig.proxy.settle()
    status, body = await get(rig.proxy.port, "/admin/calls", session="batch-1")
    assert status == 200
    assert [call["outcome"] for call in body["calls"]] == ["loop_detected"] + ["forwarded"] * 5
    assert {call["agent"] for call in body["calls"]} == {"billing-bot"}
    totals = body["totals"]
    assert (totals["calls"], totals["refused"]) == (6, 1)
    assert totals["cost_saved"] > 0
    assert totals["cost"] > 0


async def test_issue12_a_script_in_an_agent_name_comes_back_verbatim(rig: Rig) -> None:
    await rig.store.log_call(entry(1, agent=SCRIPT))
    status, body = await get(rig.proxy.port, "/admin/calls", agent=SCRIPT)
    assert status == 200
    assert body["calls"][0]["agent"] == SCRIPT


async def test_issue12_the_csv_download_is_the_filtered_log_with_formulas_neutralised(
    rig: Rig,
) -> None:
    hostile = '=HYPERLINK("http://evil.example","x")'
    await rig.store.log_call(entry(1, agent=hostile, user="+1-555", feature="@sum(A1)"))
    await rig.store.log_call(entry(2, agent=hostile, outcome="duplicate_call", user="-2+3"))
    await rig.store.log_call(entry(3, agent="billing-bot"))
    async with (
        aiohttp.ClientSession() as http,
        http.get(
            f"http://127.0.0.1:{rig.proxy.port}/admin/calls.csv",
            params={"agent": hostile},
            headers=AUTH,
        ) as response,
    ):
        assert response.status == 200
        assert response.headers["Content-Disposition"] == "attachment; filename=calls.csv"
        assert response.headers["Content-Type"] == "text/csv; charset=utf-8"
        text = await response.text()
    rows = list(csv.DictReader(io.StringIO(text)))
    assert [row["outcome"] for row in rows] == ["duplicate_call", "forwarded"]
    assert {row["agent"] for row in rows} == {"'" + hostile}
    assert [row["user"] for row in rows] == ["'-2+3", "'+1-555"]
    assert rows[1]["feature"] == "'@sum(A1)"
    assert rows[1]["time"] == "2026-01-01T00:00:01.000+00:00"


async def test_issue12_a_long_csv_is_streamed_in_pages(rig: Rig) -> None:
    for n in range(2_500):
        await rig.store.log_call(entry(n))
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://127.0.0.1:{rig.proxy.port}/admin/calls.csv", headers=AUTH) as response,
    ):
        assert response.headers["Transfer-Encoding"] == "chunked"
        rows = list(csv.DictReader(io.StringIO(await response.text())))
    assert len(rows) == 2_500
    assert rows[0]["time"] > rows[-1]["time"]


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"since": "inf"}, "since"),
        ({"since": "1e308"}, "since"),
        ({"until": "9" * 5_000}, "until"),
        ({"since": "999999999999"}, "since"),
        ({"since": "１７６７２２５６００"}, "since"),  # full-width digits
        ({"since": "-5"}, "since"),
        ({"limit": "-1"}, "limit"),
        ({"limit": "0"}, "limit"),
        ({"limit": "1001"}, "limit"),
        ({"limit": "５０"}, "limit"),
        ({"limit": "5_0"}, "limit"),
        ({"since": "1767225700", "until": "1767225600"}, "until"),
        ({"agent": "billing\x00bot"}, "agent"),
        ({"session": "x" * 257}, "session"),
        ({"outcome": "fоrwarded"}, "outcome"),  # a Cyrillic о
        ({"cursor": "not-a-cursor"}, "cursor"),
        ({"cursor": "inf:0"}, "cursor"),
        ({"cursor": "1e308:0"}, "cursor"),
        ({"page": "2"}, "page"),
    ],
)
async def test_issue12_hostile_filters_are_refused_naming_the_field(
    rig: Rig, params: dict[str, str], field: str
) -> None:
    port = rig.proxy.port
    status, body = await get(port, "/admin/calls", **params)
    assert status == 400
    assert body["ok"] is False
    assert body["error"].startswith(f"{field}:")
    assert len(body["error"]) < 300
    status, _ = await get(port, "/admin/calls")
    assert status == 200


async def test_issue12_the_same_filters_are_checked_by_every_calls_route(rig: Rig) -> None:
    for path in ("/admin/calls.csv", "/admin/calls/series"):
        status, body = await get(rig.proxy.port, path, until="inf")
        assert (status, body["error"].split(":")[0]) == (400, "until")
    status, body = await get(rig.proxy.port, "/admin/calls/series", span="week")
    assert (status, body["error"].split(":")[0]) == (400, "span")


async def test_issue12_a_one_megabyte_query_is_refused_and_the_next_served(rig: Rig) -> None:
    url = f"http://127.0.0.1:{rig.proxy.port}/admin/calls?agent={quote('x' * 1_000_000)}"
    async with aiohttp.ClientSession() as http, http.get(url, headers=AUTH) as response:
        assert response.status == 400
    status, _ = await get(rig.proxy.port, "/admin/calls")
    assert status == 200


async def test_issue12_the_calls_routes_need_the_admin_token(rig: Rig) -> None:
    for path in ("/admin/calls", "/admin/calls.csv", "/admin/calls/series", "/admin/rules"):
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"http://127.0.0.1:{rig.proxy.port}{path}") as response,
        ):
            assert response.status == 401


async def test_issue12_cost_per_minute_and_per_hour(rig: Rig) -> None:
    for n in (0, 30, 61, 3_599, 3_700):
        await rig.store.log_call(entry(n, outcome="forwarded" if n != 61 else "loop_paused"))
    until = f"{T0 + 3_600:.0f}"
    status, body = await get(rig.proxy.port, "/admin/calls/series", span="hour", until=until)
    assert status == 200
    buckets = body["buckets"]
    assert (body["span"], body["bucket_seconds"], len(buckets)) == ("hour", 60.0, 60)
    assert buckets[0]["t"] == T0
    assert buckets[-1]["t"] == T0 + 3_540  # the last minute before `until`
    assert buckets[-1]["iso"] == "2026-01-01T00:59:00.000+00:00"
    assert (buckets[-1]["cost"], buckets[-1]["calls"]) == (0.25, 1)  # the call at 3,599 s
    status, body = await get(
        rig.proxy.port, "/admin/calls/series", span="day", until=f"{T0 + 7_200:.0f}"
    )
    buckets = body["buckets"]
    assert len(buckets) == 24
    assert buckets[-2:] == [
        {"t": T0, "iso": "2026-01-01T00:00:00.000+00:00", "cost": 0.75, "saved": 0.25, "calls": 4},
        {
            "t": T0 + 3_600,
            "iso": "2026-01-01T01:00:00.000+00:00",
            "cost": 0.25,
            "saved": 0.0,
            "calls": 1,
        },
    ]


async def test_issue12_the_rules_page_previews_each_rule_as_the_command_does(
    tmp_path: Path,
) -> None:
    state = f"{{backend: sqlite, path: '{tmp_path / 'state.sqlite3'}'}}"
    async with running_proxy(RULES, state=state) as running:
        for n in range(3):
            await ask_anyway(running.proxy.port, f"question {n}", session="batch-1")
        await ask_anyway(running.proxy.port, "question 9", session="batch-2")
        await running.proxy.settle()
        status, body = await get(running.proxy.port, "/admin/rules")
        config = running.proxy.config
    assert status == 200
    once, faq = body["rules"]
    assert once["name"] == "once-per-session"
    assert (once["fields"], once["window"], once["action"], once["mode"]) == (
        ["session"],
        3_600.0,
        "reject",
        "enforce",
    )
    # The rule is enforced, so the 2nd and 3rd calls of batch-1 were refused by it; the
    # preview replays every logged call, refused ones included.
    assert once["preview"] == {"calls": 4, "applies": 4, "groups": 2, "would_refuse": 2}
    assert (faq["action"], faq["mode"], faq["preview"]["applies"]) == ("pause", "shadow", 0)
    assert body["preview_seconds"] == 7 * 86_400
    out = io.StringIO()
    full = parse_config(proxy_yaml("http://127.0.0.1:9", RULES, state=state), env={})
    assert full.proxy is not None
    assert full.proxy.rules == config.rules
    await preview_command(full, full.proxy.rules[0], 7 * 86_400.0, out)
    assert "would have stopped 2 of 4 logged calls" in out.getvalue()


async def test_issue12_the_gateway_answers_the_calls_and_rules_of_its_state(
    tmp_path: Path,
) -> None:
    state = f"{{backend: sqlite, path: '{tmp_path / 'state.sqlite3'}'}}"
    with_proxy = proxy_yaml("http://127.0.0.1:9", RULES, state=state)
    http = "http: {host: 127.0.0.1, port: 0, admin_token: " + ADMIN_TOKEN + "}\n"
    runs: tuple[tuple[str, list[str], int], ...] = (
        (with_proxy, ["once-per-session", "faq-twice"], 1),
        (f"state: {state}\n", [], 2),
    )
    for text, rules, logged in runs:
        config = parse_config(text + http + "agents: {}\nbots: []\n", env={})
        gateway = gateway_for(config, FakePlatform())
        await gateway.start()
        try:
            await gateway.calls.log_call(entry(logged))
            status, body = await get(gateway.port, "/admin/calls")
            assert (status, body["totals"]["calls"]) == (200, logged)  # the same state file
            status, body = await get(gateway.port, "/admin/rules")
        finally:
            await gateway.stop(1.0)
        assert status == 200
        assert [rule["name"] for rule in body["rules"]] == rules
        if not rules:
            assert body["result"] == "no uniqueness rules configured (proxy.rules)"


@pytest.mark.redis
async def test_issue12_two_proxy_replicas_on_one_redis_show_the_same_calls(
    redis_url: str,
) -> None:
    async with AsyncExitStack() as stack:
        upstream = await stack.enter_async_context(FakeLLM())
        text = proxy_yaml(
            upstream.url, state=f"{{backend: redis, url: '{redis_url}', key_prefix: 'r12:'}}"
        )
        servers = []
        for _ in range(2):
            server = ProxyServer(parse_config(text, env={}))
            await server.start()
            stack.push_async_callback(server.stop)
            servers.append(server)
        for n in range(4):
            await ask(servers[n % 2].port, f"question {n}", session=f"s{n}")
        for server in servers:
            await server.settle()
        answers = [await get(server.port, "/admin/calls", limit="3") for server in servers]
        assert answers[0] == answers[1]
        status, body = answers[0]
        assert (status, body["totals"]["calls"], len(body["calls"])) == (200, 4, 3)
        cursor = Cursor.parse(body["next_cursor"])
        assert math.isfinite(cursor.at)
        rest = [
            await get(server.port, "/admin/calls", limit="3", cursor=body["next_cursor"])
            for server in servers
        ]
        assert rest[0] == rest[1]
        assert len(rest[0][1]["calls"]) == 1
