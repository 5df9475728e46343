"""The config contract: interpolation, field paths of every error, check-config exit codes."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

import gateway.config as config_package
from gateway.app.errors import ConfigError
from gateway.cli.main import main
from gateway.config import Config, load_config, parse_config, resolve_policy

SECRET = "123456:SECRET-token-value"
AGENT = "agents: {parrot: {kind: scripted, default: 'echo: {text}'}}\n"


def error_of(text: str, env: dict[str, str] | None = None) -> ConfigError:
    """The ConfigError that parsing `text` raises."""
    with pytest.raises(ConfigError) as caught:
        parse_config(text, env=env or {})
    return caught.value


def test_variable_is_filled_from_the_environment() -> None:
    config = parse_config(
        AGENT + "bots:\n  - {id: a, platform: telegram, token: '${TG}', agent: parrot}\n",
        env={"TG": SECRET},
    )
    token = config.bots[0].token  # type: ignore[union-attr]
    assert token.get_secret_value() == SECRET


def test_default_used_when_variable_unset_or_empty() -> None:
    text = "http: {host: '${HOST:-0.0.0.0}', port: ${PORT:-9000}}\n"
    assert parse_config(text, env={}).http.port == 9000
    assert parse_config(text, env={"HOST": ""}).http.host == "0.0.0.0"
    assert parse_config(text, env={"HOST": "10.0.0.1"}).http.host == "10.0.0.1"


def test_variables_inside_flow_mappings() -> None:
    config = parse_config("http: {admin_token: ${X:-}, port: ${P:-0}}\n", env={})
    assert config.http.admin_token is None
    assert config.http.port == 0
    config = parse_config(
        "http: {admin_token: ${X:-}, port: ${P:-0}}\n", env={"X": "adm-0123456789abcdef"}
    )
    assert config.http.admin_token is not None
    assert config.http.admin_token.get_secret_value() == "adm-0123456789abcdef"


def test_default_may_contain_colons_and_sit_inside_text() -> None:
    config = parse_config("http: {host: 'x${H:-a:b}z'}\n", env={})
    assert config.http.host == "xa:bz"


def test_missing_variable_names_the_field_and_the_variable() -> None:
    error = error_of(
        AGENT + "bots:\n  - {id: a, platform: discord, token: '${DISCORD_TOKEN}', agent: parrot}\n"
    )
    assert error.path == "bots.0.token"
    assert "DISCORD_TOKEN" in error.reason


def test_malformed_yaml_gives_line_and_column() -> None:
    error = error_of("agents:\n  parrot: {kind: scripted\nbots: []\n")
    assert error.path == ""
    assert "line 3, column 5" in error.reason


def test_top_level_must_be_a_mapping() -> None:
    assert "mapping" in error_of("- a\n- b\n").reason


def test_empty_file_is_the_default_config() -> None:
    assert parse_config("", env={}) == Config()


def test_unknown_agent_name() -> None:
    error = error_of(AGENT + "bots:\n  - {id: a, platform: room, agent: nobody}\n")
    assert error.path == "bots.0.agent"
    assert "nobody" in error.reason
    assert "parrot" in error.reason


def test_duplicate_bot_id() -> None:
    error = error_of(
        AGENT + "bots:\n  - {id: a, platform: room, agent: parrot}\n"
        "  - {id: a, platform: room, agent: parrot}\n"
    )
    assert error.path == "bots.1.id"
    assert "duplicate" in error.reason


@pytest.mark.parametrize(
    ("bot", "path"),
    [
        ("{id: a, platform: discord, agent: parrot}", "bots.0.token"),
        ("{id: a, platform: telegram, token: '${TG:-}', agent: parrot}", "bots.0.token"),
        (
            "{id: a, platform: slack, bot_token: '', signing_secret: s, agent: parrot}",
            "bots.0.bot_token",
        ),
    ],
)
def test_missing_or_empty_token(bot: str, path: str) -> None:
    error = error_of(AGENT + f"bots:\n  - {bot}\n")
    assert error.path == path


def test_unknown_platform_and_missing_kind_name_the_tag_field() -> None:
    error = error_of(AGENT + "bots:\n  - {id: a, platform: irc, agent: parrot}\n")
    assert error.path == "bots.0.platform"
    assert "irc" in error.reason
    assert "discord" in error.reason
    assert error_of("agents: {parrot: {default: x}}\n").path == "agents.parrot.kind"


def test_nested_errors_keep_names_that_look_like_platform_tags() -> None:
    assert error_of("agents: {openai: {kind: openai}}\n").path == "agents.openai.model"
    assert error_of("admins: {discord: 5}\n").path == "admins.discord"


@pytest.mark.parametrize(
    ("bot", "path"),
    [
        ("{id: a, platform: slack, bot_token: xoxb-1, agent: parrot}", "bots.0.signing_secret"),
        (
            "{id: a, platform: telegram, token: '1:x', mode: webhook, agent: parrot}",
            "bots.0.webhook_secret",
        ),
    ],
)
def test_cross_field_rules_of_a_bot_name_their_field(bot: str, path: str) -> None:
    assert error_of(AGENT + f"bots:\n  - {bot}\n").path == path


def test_empty_optional_secret_means_not_set() -> None:
    config = parse_config(
        AGENT + "bots:\n  - {id: a, platform: slack, bot_token: xoxb-1, signing_secret: s, "
        "app_token: '${SLACK_APP_TOKEN:-}', agent: parrot}\n",
        env={},
    )
    assert config.bots[0].app_token is None  # type: ignore[union-attr]


def test_bad_channel_rule_value_names_the_rule_field() -> None:
    error = error_of(
        "channels:\n  - match: {platform: discord, channel: '1100*'}\n"
        "    policy: {bot_loop: {max_events_per_window: 0}}\n"
    )
    assert error.path == "channels.0.policy.bot_loop.max_events_per_window"


def test_unknown_field_is_refused_with_its_path() -> None:
    error = error_of("http: {admin_tokn: x}\n")
    assert error.path == "http.admin_tokn"
    assert "unknown field" in error.reason


def test_channel_rule_deep_merges_over_the_defaults() -> None:
    config = parse_config(
        "policy: {bot_loop: {window_seconds: 90}}\n"
        "channels:\n  - match: {platform: discord, channel: '1100*'}\n"
        "    policy: {bot_loop: {max_events_per_window: 6}}\n",
        env={},
    )
    matched = resolve_policy(config, "discord", "1100123")
    assert matched.bot_loop.max_events_per_window == 6
    assert matched.bot_loop.window_seconds == 90
    assert resolve_policy(config, "discord", "999").bot_loop.max_events_per_window == 20
    assert resolve_policy(config, "slack", "1100123").bot_loop.max_events_per_window == 20


def test_secrets_never_appear_in_errors() -> None:
    leaks = [
        error_of("http: {admin_token: " + SECRET + ", port: 70000}\n"),
        error_of(f"agents: {{a: {{kind: openai, api_key: '{SECRET}'}}}}\n"),
        error_of(
            AGENT
            + "bots:\n  - {id: 'bad id', platform: telegram, token: '${TG}', agent: parrot}\n",
            env={"TG": SECRET},
        ),
        error_of(f"bots:\n  - {{id: a, platform: discord, token: [{SECRET}], agent: p}}\n"),
    ]
    for error in leaks:
        assert SECRET not in str(error)
    text = f"bots:\n  - {{id: a, platform: discord, token: {SECRET}, agent: [p\n"
    assert SECRET not in str(error_of(text))


def test_secrets_are_not_shown_by_the_model() -> None:
    config = parse_config("http: {admin_token: " + SECRET + "}\n", env={})
    assert SECRET not in repr(config)
    assert SECRET not in str(config.model_dump())


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "absent.yaml")


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "loopwarden.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_check_config_ok(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(
        tmp_path,
        AGENT + "bots:\n  - {id: a, platform: room, agent: parrot}\n"
        "  - {id: b, platform: room, agent: parrot}\n",
    )
    assert main(["check-config", str(path)]) == 0
    assert capsys.readouterr().out.strip() == "ok: 2 bots (room), 1 agent, state=memory"


def test_check_config_invalid(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LW_TEST_TOKEN", SECRET)
    path = write(
        tmp_path,
        AGENT
        + "bots:\n  - {id: a, platform: telegram, token: '${LW_TEST_TOKEN}', agent: nobody}\n",
    )
    assert main(["check-config", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("config error: bots.0.agent: unknown agent 'nobody'")
    assert SECRET not in captured.err + captured.out


def test_check_config_as_a_process(tmp_path: Path) -> None:
    good = write(tmp_path, AGENT)
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "check-config", str(good)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stdout.strip()) == (
        0,
        "ok: 0 bots (none), 1 agent, state=memory",
    )
    bad = tmp_path / "bad.yaml"
    bad.write_text("bots:\n  - {id: a, platform: discord, agent: parrot}\n", encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "check-config", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.startswith("config error: bots.0.token: ")


@pytest.mark.parametrize(
    ("text", "path", "reason"),
    [
        ("policy: {bot_loop: {window_seconds: .inf}}", "policy.bot_loop.window_seconds", "finite"),
        (
            "policy: {bot_loop: {cooldown_seconds: .inf}}",
            "policy.bot_loop.cooldown_seconds",
            "finite",
        ),
        ("policy: {bot_loop: {window_seconds: .nan}}", "policy.bot_loop.window_seconds", "finite"),
        ("policy: {silence: {tokens: ['']}}", "policy.silence.tokens", "silence tokens"),
        ("policy: {silence: {tokens: ['***']}}", "policy.silence.tokens", "silence tokens"),
        (
            "channels: [{match: {channel: '*'}, policy: {bot_loop: {window_seconds: .inf}}}]",
            "channels.0.policy.bot_loop.window_seconds",
            "finite",
        ),
        (
            "channels: [{policy: {silence: {tokens: ['***']}}}]",
            "channels.0.policy.silence.tokens",
            "silence tokens",
        ),
        (
            "policy: {tool_loop: {idempotent_warn_threshold: '５'}}",
            "policy.tool_loop.idempotent_warn_threshold",
            "valid integer",
        ),
        (
            "policy: {tool_loop: {max_time_per_turn: .inf}}",
            "policy.tool_loop.max_time_per_turn",
            "finite",
        ),
        (
            "policy: {bot_loop: {max_events_per_window: 99999999999999999999999}}",
            "policy.bot_loop.max_events_per_window",
            "less than or equal to 1000000",
        ),
        (
            "policy: {bot_loop: {max_consecutive_bot_turns: 10000001}}",
            "policy.bot_loop.max_consecutive_bot_turns",
            "less than or equal to 1000000",
        ),
    ],
)
def test_issue9_config_refuses_what_the_guards_cannot_run_with(
    text: str, path: str, reason: str
) -> None:
    error = error_of(text + "\n")
    assert error.path == path
    assert reason in error.reason


@pytest.mark.parametrize(
    ("text", "path"),
    [
        ("policy: {bot_loop: {window_seconds: 1e308}}", "policy.bot_loop.window_seconds"),
        ("policy: {bot_loop: {cooldown_seconds: 1.0e+300}}", "policy.bot_loop.cooldown_seconds"),
        ("policy: {tool_loop: {max_time_per_turn: 1e300}}", "policy.tool_loop.max_time_per_turn"),
        ("pipeline: {dedupe_ttl_seconds: 99999999999}", "pipeline.dedupe_ttl_seconds"),
        ("pipeline: {turn_timeout_seconds: 31622401}", "pipeline.turn_timeout_seconds"),
        ("proxy: {call_loop: {pause_seconds: 1e308}}", "proxy.call_loop.pause_seconds"),
        ("proxy: {call_loop: {window_seconds: .inf}}", "proxy.call_loop.window_seconds"),
    ],
)
def test_issue9_durations_are_at_most_366_days(text: str, path: str) -> None:
    error = error_of(text + "\n")
    assert error.path == path
    assert "366 days" in error.reason or "finite" in error.reason


def test_issue9_a_duration_of_366_days_is_accepted() -> None:
    config = parse_config(
        "policy: {bot_loop: {cooldown_seconds: 31622400}}\n"
        "proxy: {call_loop: {pause_seconds: 31622400}}\n",
        env={},
    )
    assert config.policy.bot_loop.cooldown_seconds == 31_622_400
    assert config.policy.bot_loop.guard_policy().cooldown_seconds == 31_622_400


def test_issue9_tool_loop_refuses_unknown_keys_in_policy_and_channel_rules() -> None:
    error = error_of("policy: {tool_loop: {idempotent_warn_treshold: 3}}\n")
    assert error.path == "policy.tool_loop.idempotent_warn_treshold"
    assert "unknown field" in error.reason
    error = error_of("channels: [{policy: {tool_loop: {idempotent_warn_treshold: 3}}}]\n")
    assert error.path == "channels.0.policy.tool_loop.idempotent_warn_treshold"
    config = parse_config("policy: {tool_loop: {idempotent_warn_threshold: 2}}\n", env={})
    assert config.policy.tool_loop.guard_config().idempotent_warn_threshold == 2


@pytest.mark.parametrize(
    ("text", "path"),
    [
        ("http: {admin_token: x}", "http.admin_token"),
        ("http: {admin_token: short-token-15c}", "http.admin_token"),
        ("proxy: {admin_token: x}", "proxy.admin_token"),
        (
            AGENT + "bots: [{id: t, platform: telegram, token: '1:a', agent: parrot, "
            "mode: webhook, webhook_secret: x}]",
            "bots.0.webhook_secret",
        ),
    ],
)
def test_issue9_chosen_secrets_need_16_characters(text: str, path: str) -> None:
    error = error_of(text + "\n")
    assert error.path == path
    assert "16 characters" in error.reason
    assert "short-token-15c" not in str(error)


def test_empty_chosen_secrets_and_short_platform_tokens_stay_allowed() -> None:
    config = parse_config(
        AGENT + "http: {admin_token: '${X:-}'}\nproxy: {admin_token: ''}\n"
        "bots: [{id: d, platform: discord, token: t, agent: parrot}]\n",
        env={},
    )
    assert config.http.admin_token is None
    assert config.proxy is not None
    assert config.proxy.admin_token is None
    config = parse_config("http: {admin_token: 0123456789abcdef}\n", env={})
    assert config.http.admin_token is not None


BOMB = "".join(
    f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True)
)


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"http: {host: \xff\xfe}\n", "is not UTF-8"),
        (b"[" * 10_000, "nested deeper than 64"),
        (b"a: " + b"[" * 10_000 + b"]" * 10_000 + b"\n", "nested deeper than 64"),
        (("a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + BOMB).encode(), "aliases"),
        (b"a: &a [*a]\n", "alias refers to the node that contains it"),
        (b"http: {port: " + b"9" * 5_000 + b"}\n", "too many digits"),
    ],
)
def test_issue9_unreadable_config_file_exits_2_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, reason: str
) -> None:
    path = tmp_path / "hostile.yaml"
    path.write_bytes(content)
    assert main(["check-config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"config error: config file {path}")
    assert reason in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "text",
    [
        "policy: {bot_loop: {window_seconds: .inf}}\n",
        "policy: {silence: {tokens: ['***']}}\n",
        "policy: {tool_loop: {idempotent_warn_treshold: 3}}\n",
        "http: {admin_token: x}\n",
        "pipeline: {dedupe_ttl_seconds: 1e300}\n",
    ],
)
def test_issue9_check_config_exits_2_for_a_value_the_guards_cannot_run_with(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str
) -> None:
    assert main(["check-config", str(write(tmp_path, text))]) == 2
    assert capsys.readouterr().err.startswith("config error: ")


def test_issue9_a_stored_override_the_policy_refuses_is_ignored_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = parse_config("", env={})
    overrides = {
        "bot_loop.window_seconds": "inf",
        "bot_loop.max_events_per_window": 6,
        "silence.tokens": ["***"],
    }
    with caplog.at_level("WARNING", logger="loopwarden.config"):
        policy = resolve_policy(config, "room", "C1", None, overrides)
    assert policy.bot_loop.window_seconds == 60
    assert policy.bot_loop.max_events_per_window == 6
    assert policy.silence.tokens == ("NO_REPLY",)
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert "bot_loop.window_seconds" in warned
    assert "silence.tokens" in warned
    assert "room:C1" in warned


def test_issue11_room_memory_defaults_and_a_ttl_written_as_days() -> None:
    config = parse_config(AGENT, env={})
    assert (config.pipeline.transcript.max_messages, config.pipeline.transcript.ttl) == (
        200,
        7 * 86_400,
    )
    assert config.agents["parrot"].history.max_messages == 40
    assert config.agents["parrot"].history.max_tokens == 6_000
    config = parse_config(
        AGENT + "pipeline: {transcript: {max_messages: 0, ttl: 12h}}\n"
        "agents: {p: {kind: python, function: 'm:f', history: {max_messages: 5}}}\n",
        env={},
    )
    assert (config.pipeline.transcript.max_messages, config.pipeline.transcript.ttl) == (0, 43_200)
    assert (
        parse_config("pipeline: {transcript: {ttl: 3600}}\n", env={}).pipeline.transcript.ttl
        == 3_600
    )


@pytest.mark.parametrize(
    ("text", "path"),
    [
        ("pipeline: {transcript: {ttl: 7 days}}", "pipeline.transcript.ttl"),
        ("pipeline: {transcript: {ttl: ７d}}", "pipeline.transcript.ttl"),
        ("pipeline: {transcript: {ttl: 367d}}", "pipeline.transcript.ttl"),
        ("pipeline: {transcript: {ttl: 0s}}", "pipeline.transcript.ttl"),
        ("pipeline: {transcript: {ttl: 1e308}}", "pipeline.transcript.ttl"),
        ("pipeline: {transcript: {ttl: .inf}}", "pipeline.transcript.ttl"),
        (f"pipeline: {{transcript: {{ttl: '{'9' * 5000}d'}}}}", "pipeline.transcript.ttl"),
        ("pipeline: {transcript: {max_messages: -1}}", "pipeline.transcript.max_messages"),
        ("pipeline: {transcript: {max_messages: 10001}}", "pipeline.transcript.max_messages"),
        ("pipeline: {transcript: {size: 3}}", "pipeline.transcript.size"),
        (
            "agents: {a: {kind: scripted, history: {max_tokens: 1e308}}}",
            "agents.a.history.max_tokens",
        ),
        (
            "agents: {a: {kind: scripted, history: {max_messages: 100000}}}",
            "agents.a.history.max_messages",
        ),
    ],
)
def test_issue11_room_memory_bounds_are_refused_naming_the_field(text: str, path: str) -> None:
    error = error_of(text + "\n")
    assert error.path == path


def test_issue21_the_schema_is_split_by_section_and_the_package_names_it_all() -> None:
    assert importlib.util.find_spec("gateway.config.schema") is None
    homes = {
        "StateConfig": "gateway.config.state",
        "HttpConfig": "gateway.config.http",
        "OpenAIAgentConfig": "gateway.config.agents",
        "TelegramBotConfig": "gateway.config.bots",
        "Policy": "gateway.config.policy",
        "CallLoopSettings": "gateway.config.call_loop",
        "PipelineConfig": "gateway.config.pipeline",
        "ProxyConfig": "gateway.config.proxy",
        "Config": "gateway.config.root",
        "parse_config": "gateway.config.loader",
        "load_config": "gateway.config.loader",
    }
    assert {name: getattr(config_package, name).__module__ for name in homes} == homes
    assert set(config_package.__all__) <= set(vars(config_package))
