"""`check-config` reports every error of a config in one run, each naming its field (issue 22)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gateway.app.errors import ConfigError, ConfigErrors
from gateway.cli.main import main
from gateway.config import parse_config

ROOT = Path(__file__).resolve().parents[2]
DEPLOY_CONFIG = ROOT / "deploy" / "loopwarden.yaml"
UNSET = {
    "state.url": "REDIS_PASSWORD",
    "http.admin_token": "LOOPWARDEN_ADMIN_TOKEN",
    "agents.helper.api_key": "OPENAI_API_KEY",
    "bots.0.token": "TELEGRAM_TOKEN",
    "bots.0.webhook_url": "PUBLIC_BASE_URL",
    "bots.0.webhook_secret": "TELEGRAM_WEBHOOK_SECRET",
    "bots.1.bot_token": "SLACK_BOT_TOKEN",
    "bots.1.signing_secret": "SLACK_SIGNING_SECRET",
}
SECRET = "s3cr3t-\x1b[31m-ｔｏｋｅｎ-value"


def check_config(path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`python -m gateway check-config PATH` in a process whose environment is `env` alone."""
    return subprocess.run(
        [sys.executable, "-m", "gateway", "check-config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
        env=env,
    )


def error_lines(stderr: str) -> dict[str, str]:
    """The `config error: path: reason` lines of stderr, reason by path (one per path)."""
    lines = [line.removeprefix("config error: ") for line in stderr.splitlines()[:-1]]
    assert all(": " in line for line in lines), stderr
    found = dict(line.split(": ", 1) for line in lines)
    assert len(found) == len(lines), stderr
    return found


def test_issue22_the_deploy_config_names_every_unset_variable_in_one_run() -> None:
    done = check_config(DEPLOY_CONFIG, {})
    assert (done.returncode, done.stdout) == (2, "")
    found = error_lines(done.stderr)
    assert {path: reason.split()[2] for path, reason in found.items()} == UNSET
    assert done.stderr.splitlines()[-1] == f"8 errors in {DEPLOY_CONFIG}"


def test_issue22_unset_variables_and_refused_fields_come_together(tmp_path: Path) -> None:
    text = DEPLOY_CONFIG.read_text(encoding="utf-8")
    text = text.replace("port: 8787", "port: 99999").replace("drain_seconds: 10", "drain: 10")
    path = tmp_path / "loopwarden.yaml"
    path.write_text(
        text + "  transcript: {ttl: 367d}\nchannels: [{match: {platfrom: x}, policy: {}}]\n",
        encoding="utf-8",
    )
    done = check_config(path, {"LOOPWARDEN_ADMIN_TOKEN": "short", "TELEGRAM_TOKEN": SECRET})
    found = error_lines(done.stderr)
    refused = {
        "http.admin_token",
        "http.port",
        "pipeline.drain",
        "pipeline.transcript.ttl",
        "channels.0.match.platfrom",
    }
    assert set(found) == (set(UNSET) - {"http.admin_token", "bots.0.token"}) | refused
    assert "16 characters" in found["http.admin_token"]
    assert "unknown field" in found["pipeline.drain"]
    assert done.stderr.splitlines()[-1] == f"11 errors in {path}"
    assert done.returncode == 2


@pytest.mark.parametrize(
    "field",
    [
        "http: {port: '${LW_SECRET}'}",
        "state: {backend: '${LW_SECRET}'}",
        "pipeline: {drain_seconds: '${LW_SECRET}'}",
        "agents: {a: {kind: '${LW_SECRET}'}}",
        "bots: [{id: '${LW_SECRET}', platform: room, agent: a}]",
        "policy: {bot_loop: {mode: '${LW_SECRET}', window_seconds: '${LW_SECRET}'}}",
    ],
)
def test_issue22_no_error_echoes_a_secret_value(
    field: str, capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LW_SECRET", SECRET)
    monkeypatch.delenv("LW_UNSET", raising=False)
    path = tmp_path / "loopwarden.yaml"
    path.write_text(
        f"{field}\nhttp_typo: 1\nadmins: {{slack: ['${{LW_UNSET}}']}}\n", encoding="utf-8"
    )
    assert main(["check-config", str(path)]) == 2
    captured = capsys.readouterr()
    found = error_lines(captured.err)
    assert {"http_typo", "admins.slack.0"} < set(found)
    assert len(found) >= 3
    for secret_part in (SECRET, "s3cr3t", "\x1b", "ｔｏｋｅｎ"):
        assert secret_part not in captured.err + captured.out


def test_issue22_config_errors_keep_each_path_the_first_stays_the_error() -> None:
    deep = "agents: {a: {kind: scripted, history: {max_tokens: 1e308, max_messages: -1}}}\n"
    with pytest.raises(ConfigErrors) as caught:
        parse_config(deep + "http: {port: '${NOPE}'}\n", env={})
    error = caught.value
    # The unset variables first, then the fields the models refuse, in their order.
    assert [e.path for e in error.errors] == [
        "http.port",
        "agents.a.history.max_messages",
        "agents.a.history.max_tokens",
    ]
    assert (error.path, error.reason) == (error.errors[0].path, error.errors[0].reason)
    assert str(error).splitlines() == [str(e) for e in error.errors]
    with pytest.raises(ConfigError) as single:
        parse_config("http: {port: 99999}\n", env={})
    assert single.value.errors == (single.value,)


def test_issue22_the_summary_counts_in_the_right_plural(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "loopwarden.yaml"
    path.write_text(
        "agents: {a: {kind: scripted}}\nbots: [{id: r, platform: room, agent: a}]\n",
        encoding="utf-8",
    )
    assert main(["check-config", str(path)]) == 0
    assert capsys.readouterr().out == "ok: 1 bot (room), 1 agent, state=memory\n"
