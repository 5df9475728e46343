"""The config contract: interpolation, field paths of every error, check-config exit codes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gateway.cli import main
from gateway.config import Config, load_config, parse_config, resolve_policy
from gateway.errors import ConfigError

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
    config = parse_config("http: {admin_token: ${X:-}, port: ${P:-0}}\n", env={"X": "adm"})
    assert config.http.admin_token is not None
    assert config.http.admin_token.get_secret_value() == "adm"


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
    assert capsys.readouterr().out.strip() == "ok: 2 bots (room), 1 agents, state=memory"


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
        "ok: 0 bots (none), 1 agents, state=memory",
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
