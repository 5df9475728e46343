"""`policy.call_loop`: bounded like every section, settable per channel and by `/loop set`."""

from __future__ import annotations

import pytest

from gateway.app.errors import ConfigError
from gateway.app.policies import PolicyCache
from gateway.config import CallLoopSettings, parse_config
from gateway.config.limits import MAX_COUNT
from guards.call_loop import CallLoopPolicy
from tests.fakes.inmemory import PipelineRig, rig_config

ADMIN = "U_ADMIN"
FIVE_THOUSAND_DIGITS = "9" * 5_000


def test_issue10_call_loop_defaults_and_a_channel_rule() -> None:
    config = parse_config(
        "channels: [{match: {channel: 'C9'}, policy: {call_loop: {max_repeats: 2}}}]", env={}
    )
    cache = PolicyCache(config)
    assert cache.resolve("room", "C1", None, {}).call_loop == CallLoopPolicy()
    strict = cache.resolve("room", "C9", None, {}).call_loop
    assert strict == CallLoopPolicy(max_repeats=2, window_seconds=60.0, pause_seconds=300.0)


HOSTILE_CALL_LOOP = [
    ("{window_seconds: .inf}", "window_seconds"),
    ("{pause_seconds: .nan}", "pause_seconds"),
    ("{window_seconds: 1e308}", "window_seconds"),
    ("{max_repeats: 1e308}", "max_repeats"),
    ("{max_repeats: 2000000}", "max_repeats"),
    ("{max_repeats: 0}", "max_repeats"),
    ("{max_repeats: -3}", "max_repeats"),
    ("{pause_seconds: -1}", "pause_seconds"),
    ("{window_seconds: 0}", "window_seconds"),
    ("{max_repeats: five}", "max_repeats"),
    ("{max_repats: 3}", "max_repats"),
]


@pytest.mark.parametrize(("section", "field"), HOSTILE_CALL_LOOP)
def test_issue10_hostile_call_loop_values_are_refused_naming_the_field(
    section: str, field: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config(f"policy: {{call_loop: {section}}}", env={})
    assert raised.value.path == f"policy.call_loop.{field}"
    with pytest.raises(ConfigError) as in_rule:
        parse_config(f"channels: [{{policy: {{call_loop: {section}}}}}]", env={})
    assert in_rule.value.path == f"channels.0.policy.call_loop.{field}"


@pytest.mark.parametrize(("section", "field"), HOSTILE_CALL_LOOP)
def test_issue21_proxy_call_loop_refuses_what_policy_call_loop_refuses(
    section: str, field: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config(f"proxy: {{call_loop: {section}}}", env={})
    assert raised.value.path == f"proxy.call_loop.{field}"


def test_issue21_policy_and_proxy_call_loop_are_one_model_capped_at_max_count() -> None:
    config = parse_config(
        f"policy: {{call_loop: {{max_repeats: {MAX_COUNT}}}}}\n"
        f"proxy: {{call_loop: {{max_repeats: {MAX_COUNT}}}}}",
        env={},
    )
    assert config.proxy is not None
    assert type(config.proxy.call_loop) is type(config.policy.call_loop) is CallLoopSettings
    assert config.proxy.call_loop.policy() == config.policy.call_loop.policy()
    with pytest.raises(ConfigError) as raised:
        parse_config(f"proxy: {{call_loop: {{max_repeats: {MAX_COUNT + 1}}}}}", env={})
    assert raised.value.path == "proxy.call_loop.max_repeats"


def test_issue10_a_5000_digit_max_repeats_is_refused_by_the_file_bounds() -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config(f"policy: {{call_loop: {{max_repeats: {FIVE_THOUSAND_DIGITS}}}}}", env={})
    assert "digits" in raised.value.reason


async def _admin_says(rig: PipelineRig, text: str) -> str:
    connector = rig.connector()
    await connector.push(connector.message(text, sender_id=ADMIN))
    return connector.texts()[-1]


@pytest.mark.parametrize(
    "value",
    ["inf", "1e308", FIVE_THOUSAND_DIGITS, "-2", "0", "2000000", "[3]", "５"],
)
async def test_issue10_loop_set_call_loop_refuses_hostile_values_and_the_room_still_answers(
    value: str,
) -> None:
    rig = PipelineRig(rig_config(f"admins: {{room: [{ADMIN}]}}"))
    await rig.start()
    answer = await _admin_says(rig, f"/loop set call_loop.max_repeats {value}")
    assert answer.startswith("Can't set call_loop.max_repeats")
    assert await rig.state.get_overrides("room:C1") == {}
    connector = rig.connector()
    await connector.push(connector.message("still there?"))
    assert connector.texts()[-1] == "pong"


async def test_issue10_loop_set_call_loop_fields_and_unknown_keys() -> None:
    rig = PipelineRig(rig_config(f"admins: {{room: [{ADMIN}]}}"))
    await rig.start()
    for field, value in (("max_repeats", 3), ("window_seconds", 120), ("pause_seconds", 30)):
        await _admin_says(rig, f"/loop set call_loop.{field} {value}")
    resolved = await rig.admin.policies.room(rig.state, "room", "C1", None)
    assert resolved.call_loop == CallLoopPolicy(3, 120.0, 30.0)
    unknown = await _admin_says(rig, "/loop set call_loop.max_repats 3")
    assert unknown.startswith("Can't set call_loop.max_repats")
    assert "max_repeats" in unknown
    policy_text = await _admin_says(rig, "/loop policy")
    assert (
        "call_loop: {max_repeats: 3, window_seconds: 120.0, pause_seconds: 30.0, mode: enforce}"
        in policy_text
    )
