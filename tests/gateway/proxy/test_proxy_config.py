"""The `proxy:` config section, what the providers read from requests, prices and secrets."""

from __future__ import annotations

import json

import pytest

from gateway.app.errors import ConfigError
from gateway.app.jsonbody import JsonBodyError
from gateway.config import parse_config
from gateway.observability.logs import secret_values
from gateway.proxy.anthropic import AnthropicProvider
from gateway.proxy.auth import client_table
from gateway.proxy.gemini import GeminiProvider
from gateway.proxy.openai import OpenAIProvider
from gateway.proxy.pricing import PriceTable
from gateway.proxy.provider import forward_headers, response_headers

FULL = """
proxy:
  keys:
    lw-demo-key: {agent: billing-bot}
  upstreams:
    openai: {base_url: 'https://api.openai.com/v1/', api_key: sk-openai-1}
    anthropic: {base_url: 'https://api.anthropic.com', api_key: sk-ant-2}
  admin_token: adm-3-0123456789
  rules:
    - {name: once, fields: [session, step], max_calls: 1, window_seconds: 24h}
  alerts:
    webhook: https://hooks.slack.com/services/T0/B0/hooksecret4
    telegram: {bot_token: '12:tg-secret-5', chat_id: -100}
    email: {host: smtp.example.com, from: a@example.com, to: b@example.com, username: u,
            password: smtp-secret-6}
"""


def test_the_full_section_parses() -> None:
    proxy = parse_config(FULL, env={}).proxy
    assert proxy is not None
    assert proxy.keys[0].agent == "billing-bot"
    assert proxy.upstreams.openai is not None
    assert proxy.upstreams.openai.base_url == "https://api.openai.com/v1"
    assert proxy.rules[0].window_seconds == 86_400
    assert proxy.alerts.telegram is not None
    assert proxy.alerts.telegram.chat_id == "-100"
    assert proxy.alerts.email is not None
    assert proxy.alerts.email.to == ("b@example.com",)
    assert proxy.call_loop.policy().max_repeats == 5


def test_keys_may_be_a_list_with_values_from_the_environment() -> None:
    text = "proxy: {keys: [{key: '${LW_KEY}', agent: bot}]}"
    proxy = parse_config(text, env={"LW_KEY": "lw-from-env"}).proxy
    assert proxy is not None
    assert proxy.keys[0].key.get_secret_value() == "lw-from-env"


def test_every_proxy_secret_is_redacted_from_logs() -> None:
    secrets = secret_values(parse_config(FULL, env={}))
    for secret in ("lw-demo-key", "sk-openai-1", "sk-ant-2", "adm-3-0123456789", "12:tg-secret-5"):
        assert secret in secrets
    assert "smtp-secret-6" in secrets
    assert "/services/T0/B0/hooksecret4" in secrets
    assert "https://hooks.slack.com/services/T0/B0/hooksecret4" in secrets


@pytest.mark.parametrize(
    ("text", "path"),
    [
        (
            "proxy: {rules: [{name: x, fields: [tenant], max_calls: 1, window_seconds: 1}]}",
            "proxy.rules",
        ),
        (
            "proxy: {rules: [{name: x, fields: [session], max_calls: 1, window_seconds: 60},"
            " {name: x, fields: [step], max_calls: 1, window_seconds: 60}]}",
            "proxy.rules",
        ),
        ("proxy: {keys: {lw-key-1: {agent: 'a b'}}}", "proxy.keys.0.agent"),
        ("proxy: {keys: [{key: lw-key-1, agent: x}, {key: lw-key-1, agent: y}]}", "proxy.keys"),
        ("proxy: {keys: {short: {agent: x}}}", "proxy.keys.0.key"),
        ("proxy: {upstreams: {openai: {base_url: 'ftp://x'}}}", "proxy.upstreams.openai.base_url"),
        ("proxy: {call_loop: {max_repeats: 0}}", "proxy.call_loop.max_repeats"),
        ("proxy: {prices: {'gpt*': {input_per_1k: -1, output_per_1k: 0}}}", "proxy.prices"),
        ("proxy: {alerts: {email: {host: h, from: a@b, to: []}}}", "proxy.alerts.email.to"),
        ("proxy: {listen: 1}", "proxy.listen"),
    ],
)
def test_errors_name_the_field(text: str, path: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(text, env={})
    assert caught.value.path.startswith(path)
    assert "lw-" not in str(caught.value)


def test_rule_errors_name_the_rule() -> None:
    with pytest.raises(ConfigError, match="rule 0: window_seconds"):
        parse_config(
            "proxy: {rules: [{name: x, fields: [session], max_calls: 1, window_seconds: 0.5}]}",
            env={},
        )


def test_agents_with_several_keys_get_a_key_id_in_their_root() -> None:
    proxy = parse_config(
        "proxy: {keys: {lw-key-1: {agent: solo}, lw-key-2: {agent: twin},"
        " lw-key-3: {agent: twin}}}",
        env={},
    ).proxy
    assert proxy is not None
    roots = sorted(client.root for client in client_table(proxy.keys).values())
    assert roots[0] == "solo"
    assert roots[1].startswith("twin~")
    assert roots[2].startswith("twin~")
    assert roots[1] != roots[2]
    assert all("lw-key" not in root for root in roots)


def test_which_requests_are_guarded_calls() -> None:
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}]}).encode()
    openai = OpenAIProvider()
    assert openai.describe("POST", "chat/completions", body) is not None
    assert openai.describe("GET", "models", b"") is None
    assert openai.describe("POST", "embeddings", body) is None
    with pytest.raises(JsonBodyError):
        openai.describe("POST", "chat/completions", b"not json")
    assert openai.describe("POST", "chat/completions", b"[1]") is None
    responses = openai.describe(
        "POST", "responses", b'{"model": "m", "input": "hi", "stream": true}'
    )
    assert responses is not None
    assert responses.stream
    assert responses.messages == [{"role": "user", "content": "hi"}]
    assert AnthropicProvider().describe("POST", "v1/messages/count_tokens", body) is None
    gemini = GeminiProvider().describe(
        "POST", "v1beta/models/gemini-2.0-flash:streamGenerateContent", b'{"contents": []}'
    )
    assert gemini is not None
    assert (gemini.model, gemini.stream) == ("gemini-2.0-flash", True)


def test_credentials_and_our_headers_never_go_upstream() -> None:
    headers = {
        "Authorization": "Bearer lw-demo-key",
        "x-api-key": "lw-demo-key",
        "X-Loopwarden-Session": "s",
        "Content-Type": "application/json",
        "Accept-Encoding": "gzip",
        "Connection": "keep-alive",
    }
    forwarded = forward_headers(headers)
    assert dict(forwarded) == {"Content-Type": "application/json", "Accept-Encoding": "identity"}


def test_response_headers_holding_a_key_are_dropped() -> None:
    kept = response_headers(
        {"x-request-id": "r1", "x-debug": "key=sk-1", "Set-Cookie": "a=b", "Content-Length": "3"},
        ["sk-1"],
    )
    assert dict(kept) == {"x-request-id": "r1"}


def test_prices_first_matching_glob_and_estimates() -> None:
    proxy = parse_config(
        "proxy: {prices: {'gpt-4o-mini*': {input_per_1k: 0.1, output_per_1k: 0.2},"
        " 'gpt-4o*': {input_per_1k: 1, output_per_1k: 2}}}",
        env={},
    ).proxy
    assert proxy is not None
    table = PriceTable(proxy.prices, default_output_tokens=100)
    assert table.cost("gpt-4o-mini-2024", 1000, 1000) == pytest.approx(0.3)
    assert table.cost("gpt-4o", 1000, 1000) == pytest.approx(3.0)
    assert table.cost("llama3", 1000, 1000) is None
    assert table.estimate("gpt-4o", 401) == (101, 100)
    table.observe("gpt-4o", 10)
    table.observe("gpt-4o", 20)
    assert table.estimate("gpt-4o", 4) == (1, 15)


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ("''", "customer"),
        ("'acme\\x00'", "customer"),
        ("'a b'", "user"),
        ("'" + "x" * 5000 + "'", "feature"),
        ("{name: acme}", "customer"),
    ],
)
def test_issue20_a_key_s_bound_fields_are_checked_by_name(value: str, field: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(f"proxy: {{keys: {{lw-key-1234: {{agent: a, {field}: {value}}}}}}}", env={})
    assert caught.value.path == f"proxy.keys.0.{field}"
    assert "lw-key" not in str(caught.value)


def test_issue20_a_key_binds_its_agent_and_the_fields_it_sets() -> None:
    config = parse_config(
        "proxy: {keys: {lw-key-1234: {agent: a, customer: acme, feature: inv-1}}}", env={}
    )
    assert config.proxy is not None
    assert config.proxy.keys[0].bound() == (("customer", "acme"), ("feature", "inv-1"))
