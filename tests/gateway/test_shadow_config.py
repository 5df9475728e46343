"""`mode: enforce | shadow` in the config, channel rules, the proxy's rules and the admin API."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest

from gateway.app.errors import ConfigError
from gateway.app.policies import ResolvedPolicy
from gateway.app.runtime import Gateway
from gateway.config import parse_config, resolve_policy
from guards.call_loop import UniquenessRule
from guards.mode import parse_mode
from tests.gateway.runtime_helpers import FakePlatform, gateway_for, make_config

TOKEN = "adm-9f8e7d6c5b4a"
NEAR_MISSES = [
    "Shadow",
    "ENFORCE",
    "'shadow '",
    "' enforce'",
    "ѕhadow",
    "shadоw",
    "ｓｈａｄｏｗ",
    "'sha\u200bdow'",
    "shadow-mode",
    "true",
    "0",
    "[shadow]",
    "{mode: shadow}",
]
PROXY = """
proxy:
  keys: {lw-demo-key: {agent: billing-bot}}
  upstreams: {openai: {base_url: 'http://127.0.0.1:9/v1'}}
"""


def test_issue13_every_guard_takes_a_mode_and_the_resolved_policy_carries_it() -> None:
    config = parse_config(
        "policy: {bot_loop: {mode: shadow}, call_loop: {mode: shadow}}\n"
        "channels:\n"
        "  - match: {platform: discord, channel: '1100*'}\n"
        "    policy: {bot_loop: {mode: enforce}, tool_loop: {mode: shadow, no_progress_warn: 2}}\n",
        env={},
    )
    default = ResolvedPolicy.derive(resolve_policy(config, "room", "lobby"))
    assert (default.bot_loop_shadow, default.tool_loop_shadow, default.call_loop_shadow) == (
        True,
        False,
        True,
    )
    ruled = ResolvedPolicy.derive(resolve_policy(config, "discord", "1100123"))
    assert (ruled.bot_loop_shadow, ruled.tool_loop_shadow, ruled.call_loop_shadow) == (
        False,
        True,
        True,
    )
    # `mode` is ours, not a LoopGuardConfig field: the guard's config is built without it.
    assert ruled.tool_loop.no_progress_warn == 2
    assert config.policy.bot_loop.mode == "shadow"
    assert parse_config("", env={}).policy.tool_loop.mode == "enforce"


@pytest.mark.parametrize("guard", ["bot_loop", "tool_loop", "call_loop"])
@pytest.mark.parametrize("value", NEAR_MISSES)
def test_issue13_a_mode_that_only_looks_right_is_refused_naming_the_field(
    guard: str, value: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(f"policy: {{{guard}: {{mode: {value}}}}}\n", env={})
    assert caught.value.path == f"policy.{guard}.mode"
    assert "enforce or shadow" in caught.value.reason


@pytest.mark.parametrize("value", NEAR_MISSES)
def test_issue13_a_channel_rule_mode_is_refused_naming_the_rule(value: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(
            "channels:\n  - match: {channel: 'c*'}\n"
            f"    policy: {{bot_loop: {{mode: {value}}}}}\n",
            env={},
        )
    assert caught.value.path == "channels.0.policy.bot_loop.mode"
    assert "enforce or shadow" in caught.value.reason


def test_issue13_proxy_call_loop_and_rules_take_a_mode() -> None:
    config = parse_config(
        PROXY
        + "  call_loop: {mode: shadow}\n"
        + "  rules:\n"
        + "    - {name: one-per-step, fields: [session, step], max_calls: 1, window_seconds: 60,"
        + " mode: shadow}\n"
        + "    - {name: per-customer, fields: [customer], max_calls: 9, window_seconds: 60}\n",
        env={},
    )
    assert config.proxy is not None
    assert config.proxy.call_loop.mode == "shadow"
    assert [rule.mode for rule in config.proxy.rules] == ["shadow", "enforce"]


@pytest.mark.parametrize("value", NEAR_MISSES)
def test_issue13_proxy_modes_that_only_look_right_are_refused(value: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(PROXY + f"  call_loop: {{mode: {value}}}\n", env={})
    assert caught.value.path == "proxy.call_loop.mode"
    rule = f"{{name: r, fields: [session], max_calls: 1, window_seconds: 60, mode: {value}}}"
    with pytest.raises(ConfigError) as caught:
        parse_config(PROXY + f"  rules: [{rule}]\n", env={})
    assert caught.value.path == "proxy.rules"
    assert caught.value.reason.startswith("rule 0: mode ")
    assert "enforce or shadow" in caught.value.reason


def test_issue13_a_rule_built_directly_checks_its_mode() -> None:
    with pytest.raises(ValueError, match="mode must be exactly enforce or shadow"):
        UniquenessRule("r", ("session",), 1, 60.0, mode="Shadow")  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [None, 1, True, b"shadow", ["shadow"], "x" * 5000])
def test_issue13_parse_mode_names_what_it_got_briefly(value: object) -> None:
    with pytest.raises(ValueError, match="must be enforce or shadow") as caught:
        parse_mode(value)
    assert len(str(caught.value)) < 100


@pytest.fixture
async def admin_gateway() -> AsyncIterator[Gateway]:
    gateway = gateway_for(make_config(TOKEN), FakePlatform())
    await gateway.start()
    yield gateway
    await gateway.stop(1.0)


@pytest.mark.parametrize(
    "value", ["Shadow", " shadow", "shadow\t", "ѕhadow", "ｓｈａｄｏｗ", 1, True]
)
async def test_issue13_admin_api_refuses_a_mode_that_only_looks_right(
    admin_gateway: Gateway, value: object
) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    base = f"http://127.0.0.1:{admin_gateway.port}"
    body = {"room": "room:lobby", "field": "tool_loop.mode", "value": value}
    async with aiohttp.ClientSession() as client:
        async with client.post(f"{base}/admin/set", json=body, headers=auth) as response:
            assert response.status == 422
            error = (await response.json())["error"]
        assert error.startswith("Can't set tool_loop.mode:")
        assert await admin_gateway.state.get_overrides("room:lobby") == {}
        body["value"] = "shadow"
        async with client.post(f"{base}/admin/set", json=body, headers=auth) as response:
            assert response.status == 200
        async with client.get(
            f"{base}/admin/status", params={"room": "room:lobby"}, headers=auth
        ) as response:
            status = (await response.json())["result"]
    assert "tool_loop: shadow: would have refused 0" in status.splitlines()
