"""`mcp_servers` on `openai` agents: what check-config says about each bad entry (issue 11)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gateway.agents.openai import OpenAIAgent
from gateway.app.errors import ConfigError
from gateway.cli.main import main
from gateway.config import OpenAIAgentConfig, parse_config

AGENT = "agents:\n  helper:\n    kind: openai\n    model: m\n"
SERVERS = AGENT + "    mcp_servers:\n"


def _error(entries: str, head: str = SERVERS) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        parse_config(head + entries, env={})
    return caught.value


@pytest.mark.parametrize(
    ("entries", "field", "reason"),
    [
        ("      - {name: a}\n", "mcp_servers.0.command", "give command"),
        (
            "      - {name: a, command: [x], url: 'http://127.0.0.1/mcp'}\n",
            "mcp_servers.0.url",
            "not both",
        ),
        ("      - {name: a, command: []}\n", "mcp_servers.0.command", "the program to run"),
        ("      - {name: a, command: ['  ']}\n", "mcp_servers.0.command", "the program to run"),
        ("      - {name: a, command: [python, 1]}\n", "mcp_servers.0.command.1", "string"),
        ("      - {name: a, url: 'ftp://h/x'}\n", "mcp_servers.0.url", "http:// or https://"),
        ("      - {name: a, url: 'http://h:99999/x'}\n", "mcp_servers.0.url", "port"),
        ("      - {name: a, url: 'http://h /x'}\n", "mcp_servers.0.url", "spaces"),
        ("      - {name: a, url: 'https://u:pw@h/x'}\n", "mcp_servers.0.url", "headers"),
        (
            "      - {name: a, command: [x]}\n      - {name: a, command: [y]}\n",
            "mcp_servers.1.name",
            "duplicate MCP server name 'a'",
        ),
        ("      - {name: a__b, command: [x]}\n", "mcp_servers.0.name", "'__'"),
        ("      - {name: a_, command: [x]}\n", "mcp_servers.0.name", "'__'"),
        ("      - {name: 'a.b', command: [x]}\n", "mcp_servers.0.name", "ASCII letters"),
        ("      - {name: 'fіles', command: [x]}\n", "mcp_servers.0.name", "ASCII letters"),
        (f"      - {{name: {'n' * 33}, command: [x]}}\n", "mcp_servers.0.name", "1 to 32"),
        ("      - {name: a, url: 'http://h/x', env: {A: b}}\n", "mcp_servers.0.env", "stdio"),
        ("      - {name: a, command: [x], headers: {A: b}}\n", "mcp_servers.0.headers", "HTTP"),
        ("      - {name: a, command: [x], env: {'1A': b}}\n", "mcp_servers.0.env", "variable"),
        (
            '      - {name: a, url: "http://h/x", headers: {X-Key: "k\\r\\nX-Evil: 1"}}\n',
            "mcp_servers.0.headers",
            "line breaks",
        ),
        ("      - {name: a, command: [x], cwd: /tmp}\n", "mcp_servers.0.cwd", "unknown field"),
    ],
)
def test_issue11_check_config_names_the_bad_mcp_field(
    entries: str, field: str, reason: str
) -> None:
    error = _error(entries)
    assert error.path == f"agents.helper.{field}"
    assert reason in error.reason


def test_issue11_a_python_tool_cannot_take_an_mcp_servers_prefix() -> None:
    head = AGENT + "    tools: ['tools_mod:search_orders', 'tools_mod:orders__list']\n"
    error = _error("    mcp_servers: [{name: orders, command: [x]}]\n", head)
    assert error.path == "agents.helper.tools.1"
    assert "MCP server 'orders'" in error.reason
    ok = parse_config(head + "    mcp_servers: [{name: search, command: [x]}]\n", env={})
    assert ok.agents["helper"]


def test_issue11_secret_values_are_secret_and_checked_by_the_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = parse_config(
        SERVERS + "      - {name: fs, command: [x], env: {TOKEN: s3cret-env}}\n"
        "      - {name: web, url: 'https://h/mcp', headers: {Authorization: Bearer s3cret-h}}\n",
        env={},
    )
    agent = config.agents["helper"]
    assert isinstance(agent, OpenAIAgentConfig)
    assert "s3cret" not in repr(agent)
    path = tmp_path / "bad.yaml"
    path.write_text(SERVERS + "      - {name: web, url: 'ftp://h', headers: {A: s3cret}}\n")
    assert main(["check-config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("config error: agents.helper.mcp_servers.0.url: ")
    assert "s3cret" not in err


def test_issue11_mcp_servers_without_the_sdk_is_a_config_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without the `mcp` extra the gateway still imports; only an agent that needs it fails."""
    config = parse_config(SERVERS + "      - {name: fs, command: [x]}\n", env={}).agents["helper"]
    assert isinstance(config, OpenAIAgentConfig)
    monkeypatch.delitem(sys.modules, "gateway.agents.mcp", raising=False)
    monkeypatch.setitem(sys.modules, "mcp", None)
    with pytest.raises(ConfigError) as caught:
        OpenAIAgent("helper", config)
    assert caught.value.path == "agents.helper.mcp_servers"
    assert "pip install 'loopwarden[mcp]'" in caught.value.reason
    plain = OpenAIAgent("plain", config.model_copy(update={"mcp_servers": ()}))
    assert plain.tools == {}
