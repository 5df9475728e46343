"""The command line: subcommands, exit codes, and `run` as a real process with signals."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import inspect
import os
import re
import signal
import sys
from pathlib import Path

import aiohttp
import pytest

import connectors
import gateway.cli.main
import gateway.demo.room
import gateway.state
from gateway import __version__
from gateway.cli.main import SUBCOMMANDS, build_parser, main
from tests.gateway.runtime_helpers import shadow_package

ADMIN_SECRET = "lw-admin-secret-5e6f"
RUN_CONFIG = """
http: {host: 127.0.0.1, port: 0, admin_token: '${LW_TEST_ADMIN}'}
agents: {parrot: {kind: scripted, default: 'echo: {text}'}}
bots:
  - {id: parrot-room, platform: room, agent: parrot}
pipeline: {drain_seconds: 5}
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "loopwarden.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["--version"])
    assert caught.value.code == 0
    assert capsys.readouterr().out.strip() == f"loopwarden {__version__}"


def test_help_lists_the_subcommands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["--help"])
    assert caught.value.code == 0
    out = capsys.readouterr().out
    for command in ("run", "check-config", "demo"):
        assert command in out


def subcommand_parsers(
    parser: argparse.ArgumentParser,
) -> dict[str, argparse.ArgumentParser]:
    """The parsers of `parser`'s subcommands, by name."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def test_issue21_each_subcommand_is_a_module_of_its_own() -> None:
    commands = subcommand_parsers(build_parser())
    assert set(commands) == {
        "run",
        "check-config",
        "demo",
        "proxy",
        "circuits",
        "calls",
        "spend",
        "replay",
        "console-link",
    }
    modules = [
        importlib.import_module(f"gateway.cli.{name.replace('-', '_')}") for name in commands
    ]
    assert list(SUBCOMMANDS) == [module.add for module in modules]
    own = {
        name
        for name, value in vars(gateway.cli.main).items()
        if inspect.isfunction(value) and value.__module__ == gateway.cli.main.__name__
    }
    assert own == {"build_parser", "main"}


def help_of(capsys: pytest.CaptureFixture[str], words: list[str]) -> str:
    """`loopwarden WORDS --help`, its whitespace folded (argparse wraps lines anywhere)."""
    with pytest.raises(SystemExit) as caught:
        main([*words, "--help"])
    assert caught.value.code == 0
    return " ".join(capsys.readouterr().out.split())


def defaults_of(parser: argparse.ArgumentParser) -> dict[str, object]:
    """The options of `parser` that have a default worth naming (not off, not none), by flag."""
    return {
        action.option_strings[-1]: action.default
        for action in parser._actions
        if action.option_strings and action.default not in (None, False, [], argparse.SUPPRESS)
    }


def test_issue22_every_help_names_every_default(capsys: pytest.CaptureFixture[str]) -> None:
    pages: list[tuple[list[str], argparse.ArgumentParser]] = []
    for name, parser in subcommand_parsers(build_parser()).items():
        actions = subcommand_parsers(parser)
        pages += [([name, action], sub) for action, sub in actions.items()] or [([name], parser)]
    demo = argparse.ArgumentParser()
    gateway.demo.room.add_arguments(demo)
    pages = [(words, demo if words == ["demo"] else p) for words, p in pages]
    named = 0
    for words, parser in pages:
        text = help_of(capsys, words)
        for flag, default in defaults_of(parser).items():
            assert f"(default: {default})" in text, (words, flag)
            named += 1
    assert named >= 7  # --loop twice, --since twice, --format, demo's --host, --port, --delay
    assert "(default: 7d)" in help_of(capsys, ["calls", "export"])
    assert "(default: $LOOPWARDEN_LOG_LEVEL or INFO)" in help_of(capsys, ["run"])
    assert "(default: WARNING)" in help_of(capsys, ["demo"])


def test_a_subcommand_is_required() -> None:
    with pytest.raises(SystemExit) as caught:
        main([])
    assert caught.value.code == 2


def test_run_with_an_invalid_config_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, "http: {port: 99999}\n")
    assert main(["run", "--config", str(path)]) == 2
    assert capsys.readouterr().err.startswith("config error: http.port: ")
    assert main(["run", "--config", str(tmp_path / "absent.yaml")]) == 2


def test_run_with_a_missing_platform_extra_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    shadow_package(connectors, "slack", "import lw_absent_slack_sdk\n", tmp_path, monkeypatch)
    path = write(
        tmp_path,
        "agents: {p: {kind: scripted}}\n"
        "bots: [{id: s, platform: slack, bot_token: xoxb-1, signing_secret: y, agent: p}]\n",
    )
    assert main(["check-config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("config error: bots.0.platform: ")
    assert "pip install 'loopwarden[slack]'" in err
    assert "xoxb-1" not in err


@pytest.mark.usefixtures("restore_logging")
def test_run_logs_a_broken_connector_without_its_secret(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    body = (
        "def create(bot, services):\n"
        "    raise RuntimeError('rejected ' + bot.bot_token.get_secret_value())\n"
    )
    shadow_package(connectors, "slack", body, tmp_path, monkeypatch)
    path = write(
        tmp_path,
        "agents: {p: {kind: scripted}}\n"
        "bots: [{id: s, platform: slack, bot_token: xoxb-secret-77, signing_secret: sign-0a1b,"
        " agent: p}]\n",
    )
    assert main(["run", "--config", str(path)]) == 1
    err = capsys.readouterr().err
    assert "the gateway could not be built" in err
    assert "RuntimeError: rejected ***" in err
    assert "xoxb-secret-77" not in err


def test_check_config_reports_an_unavailable_state_backend(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    shadow_package(gateway.state, "redis", "import lw_absent_redis\n", tmp_path, monkeypatch)
    path = write(tmp_path, "state: {backend: redis}\n")
    assert main(["check-config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("config error: state.backend: ")
    assert "pip install 'loopwarden[redis]'" in err


def test_demo_hands_its_arguments_over(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str] | None] = []

    def fake_demo(argv: list[str] | None = None) -> int:
        seen.append(argv)
        return 0

    monkeypatch.setattr(gateway.demo.room, "main", fake_demo)
    assert main(["demo", "--port", "0", "--no-browser", "--exit-after", "1"]) == 0
    assert main(["demo"]) == 0
    assert seen == [["--port", "0", "--no-browser", "--exit-after", "1"], []]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
async def test_run_serves_until_a_signal_then_exits_0(
    tmp_path: Path, signum: signal.Signals
) -> None:
    path = write(tmp_path, RUN_CONFIG)
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gateway",
        "run",
        "--config",
        str(path),
        "--log-level",
        "debug",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "LW_TEST_ADMIN": ADMIN_SECRET},
    )
    assert process.stderr is not None
    try:
        lines: list[str] = []
        port = await asyncio.wait_for(_served_port(process.stderr, lines), 30)
        # Keep reading the log so a chatty DEBUG run can never fill the pipe and block.
        draining = asyncio.create_task(_collect(process.stderr, lines))
        async with aiohttp.ClientSession() as client:
            async with client.get(f"http://127.0.0.1:{port}/healthz") as response:
                assert response.status == 200
            await asyncio.wait_for(_until_ready(client, port), 30)
        process.send_signal(signum)
        code = await asyncio.wait_for(process.wait(), 10)
        await draining
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    out, _ = await process.communicate()
    output = "".join(lines) + out.decode()
    assert code == 0, output
    assert ADMIN_SECRET not in output
    assert ", on uvloop" in output  # issue10: served on uvloop by default
    assert "gateway stopped" in output


async def _served_port(stream: asyncio.StreamReader, lines: list[str]) -> int:
    """Read the process's log until it says which port it serves on."""
    while True:
        line = (await stream.readline()).decode()
        if not line:
            raise AssertionError("process ended before serving: " + "".join(lines))
        lines.append(line)
        found = re.search(r"http server on [\d.]+:(\d+)", line)
        if found:
            return int(found.group(1))


async def _collect(stream: asyncio.StreamReader, lines: list[str]) -> None:
    """Read the rest of the process's log into `lines`."""
    while line := await stream.readline():
        lines.append(line.decode())


async def _until_ready(client: aiohttp.ClientSession, port: int) -> None:
    """Poll /readyz until every bot is connected."""
    while True:
        async with client.get(f"http://127.0.0.1:{port}/readyz") as response:
            if response.status == 200:
                return
        await asyncio.sleep(0.05)


@pytest.mark.parametrize(
    "case",
    [
        ("http: {port: 8787}\n", [], 2, "config error: http.admin_token: not set"),
        (f"http: {{port: 0, admin_token: {ADMIN_SECRET}}}\n", [], 2, "config error: http.port: 0"),
        (f"http: {{admin_token: {ADMIN_SECRET}}}\n", ["--proxy"], 2, "config error: proxy: req"),
        (f"http: {{port: 8787, admin_token: {ADMIN_SECRET}}}\n", [], 1, "error: no console has"),
    ],
)
def test_issue20_console_link_says_why_it_cannot_make_a_link(
    case: tuple[str, list[str], int, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    config, extra, code, reason = case
    monkeypatch.setenv("LOOPWARDEN_RUNTIME_DIR", str(tmp_path / "run"))
    path = write(tmp_path, config)
    assert main(["console-link", "--config", str(path), *extra]) == code
    printed = capsys.readouterr()
    assert printed.out == ""
    assert printed.err.startswith(reason)
    assert ADMIN_SECRET not in printed.err


def test_issue20_console_link_for_the_proxy_starts_at_its_public_url(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("LOOPWARDEN_RUNTIME_DIR", str(tmp_path / "run"))
    (tmp_path / "run" / "console-proxy-8788").mkdir(mode=0o700, parents=True)
    path = write(
        tmp_path,
        f"proxy: {{admin_token: {ADMIN_SECRET}, public_url: 'https://lw.example.com/x', "
        "keys: {}, upstreams: {}}\n",
    )
    assert main(["console-link", "--proxy", "--config", str(path)]) == 0
    link = capsys.readouterr().out.strip()
    assert re.fullmatch(r"https://lw\.example\.com/console/login\?code=[\w-]{43}", link)
