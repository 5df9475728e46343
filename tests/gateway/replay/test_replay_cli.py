"""`loopwarden replay` on the command line: text, --json, --report, progress, exit codes."""

from __future__ import annotations

import io
import json
import os
import re
from pathlib import Path

import pytest

from gateway.cli.replay import run
from gateway.config import parse_config
from gateway.replay.progress import Progress
from tests.gateway.replay.replay_fixtures import (
    CONFIG,
    discord_author,
    discord_message,
    ping_pong_discord,
    replay_cli,
    slack_export,
    write_config,
    write_discord,
)


class Terminal(io.StringIO):
    """A stderr that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def test_issue13_text_report_per_room_and_pair(tmp_path: Path) -> None:
    export = ping_pong_discord(tmp_path / "general.json")
    code, out, err = replay_cli("--config", str(write_config(tmp_path)), str(export))
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        "discord #general (800): 9 messages, 0 consecutive-turn cuts",
        "  PingBot ↔ PongBot: 7 events, 4 refused, 1 cooldowns opened "
        "(first at 2024-01-01T12:00:05.000+00:00)",
        "    would not have been answered: 1005, 1006, 1007, 1008",
    ]


def test_issue13_html_report_is_self_contained_and_escapes_export_text(tmp_path: Path) -> None:
    hostile = "</script><script>alert(1)</script>"
    bot = discord_author("222", hostile, bot=True)
    other = discord_author("333", "PongBot", bot=True)
    messages = [discord_message(str(i), i, (bot, other)[i % 2], "x") for i in range(8)]
    export = write_discord(tmp_path / "c.json", messages, name=hostile)
    page = tmp_path / "report.html"
    code, out, _ = replay_cli(
        "--config", str(write_config(tmp_path)), str(export), "--report", str(page), "--json"
    )
    assert code == 0
    html = page.read_text(encoding="utf-8")
    assert html.count("</script>") == 3  # the data, uPlot and the page's own script
    assert hostile not in html
    assert "default-src 'none'" in html
    assert not re.search(r"<(script|link|img)[^>]+(src|href)=", html)
    assert "var uPlot=" in html
    data = re.search(r'<script type="application/json" id="replay-data">(.*?)</script>', html, re.S)
    assert data is not None
    embedded = json.loads(data.group(1))
    assert embedded["summary"] == json.loads(out)
    assert embedded["rooms"][0]["name"] == f"#{hostile}"
    assert sum(point[1] for point in embedded["rooms"][0]["timeline"]) == 8


def test_issue13_progress_bar_only_on_a_terminal_and_not_with_json(tmp_path: Path) -> None:
    export = ping_pong_discord(tmp_path / "general.json")
    config = parse_config(CONFIG, env={})
    terminal = Terminal()
    assert run(config, [str(export)], out=io.StringIO(), err=terminal) == 0
    shown = terminal.getvalue()
    assert "\rreplay [" in shown
    assert shown.endswith("\r")  # erased before the report
    quiet = Terminal()
    assert run(config, [str(export)], as_json=True, out=io.StringIO(), err=quiet) == 0
    assert quiet.getvalue() == ""


def test_issue13_progress_redraws_on_its_clock() -> None:
    now = [0.0]
    out = io.StringIO()
    bar = Progress(1_000, out, clock=lambda: now[0], interval=0.5)
    bar.advance(100)
    bar.advance(100)  # same instant: not redrawn
    now[0] = 1.0
    bar.advance(800)
    assert out.getvalue().count("\rreplay [") == 2
    assert "100%" in out.getvalue()


def test_issue13_bad_config_and_usage_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("policy: {bot_loop: {window_seconds: -1}}")
    export = ping_pong_discord(tmp_path / "general.json")
    code, _, err = replay_cli("--config", str(bad), str(export))
    assert code == 2
    assert "config error: policy.bot_loop.window_seconds" in err


def test_issue13_report_that_cannot_be_written_exits_1(tmp_path: Path) -> None:
    export = ping_pong_discord(tmp_path / "general.json")
    code, _, err = replay_cli(
        "--config",
        str(write_config(tmp_path)),
        str(export),
        "--report",
        str(tmp_path / "no/x.html"),
    )
    assert code == 1
    assert "cannot write" in err


HOSTILE_NAMES = {
    "\x1b]0;owned\x07PingBot": "\\x1b]0;owned\\x07PingBot",  # OSC 0: the window title
    "\x1b]52;c;cm0gLXJmIH4=\x1b\\Pong": "\\x1b]52;c;cm0gLXJmIH4=\\x1b\\Pong",  # OSC 52: clipboard
    "\x1b[2J\x1b[HClear": "\\x1b[2J\\x1b[HClear",  # CSI: clear the screen
    "\x9b2JC1\x7f": "\\x9b2JC1\\x7f",  # C1 CSI and DEL
    "tob\u202eRTL": "tob\\u202eRTL",  # a bidi override
    "two\nlines\rback": "two\\nlines\\rback",  # a forged report line
}


def test_issue20_export_text_on_the_terminal_shows_escapes(tmp_path: Path) -> None:
    bots = [
        discord_author(str(300 + index), name, bot=True) for index, name in enumerate(HOSTILE_NAMES)
    ]
    messages = [
        discord_message(f"9\x1b[31m{index}", index, bots[index % len(bots)], "x")
        for index in range(5 * len(bots))
    ]
    export = write_discord(tmp_path / "c.json", messages, name="gen\x1b]0;t\x07eral")
    code, out, err = replay_cli("--config", str(write_config(tmp_path)), str(export))
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert all(line.isprintable() for line in lines)
    assert lines[0].startswith("discord #gen\\x1b]0;t\\x07eral (800): 30 messages")
    for shown in HOSTILE_NAMES.values():
        assert shown in out
    assert "9\\x1b[31m" in out  # the refused message ids
    code, out, err = replay_cli("--config", str(write_config(tmp_path)), str(export), "--json")
    assert (code, err) == (0, "")
    assert out.isascii()
    assert out[:-1].isprintable()
    figures = json.loads(out)
    assert figures["rooms"][0]["pairs"][0]["bots"][0] in HOSTILE_NAMES  # the data, exact


def test_issue20_error_lines_show_escapes_of_export_file_names(tmp_path: Path) -> None:
    export = slack_export()
    folder = export.folder(tmp_path / "slack")
    bad = folder / "x\x1b]0;owned\x07" / "2024-01-01.json"
    bad.parent.mkdir()
    bad.write_text("[1,")
    code, out, err = replay_cli("--config", str(write_config(tmp_path)), str(folder))
    assert (code, out) == (2, "")
    assert "x\\x1b]0;owned\\x07/2024-01-01.json" in err
    assert err[:-1].isprintable()


def test_issue20_report_never_overwrites_an_input(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    export = ping_pong_discord(tmp_path / "general.json")
    before = export.read_bytes()
    config = str(write_config(tmp_path))
    link = tmp_path / "link.html"
    link.symlink_to(export)
    hard = tmp_path / "hard.html"
    os.link(export, hard)
    for given in (str(export), "./general.json", str(link), str(hard)):
        code, out, err = replay_cli("--config", config, "general.json", "--report", given)
        assert (code, out) == (2, "")
        assert err == (
            f"replay error: --report {given}: is the input general.json (or inside it): "
            "refused, it would be overwritten\n"
        )
    assert export.read_bytes() == before
    folder = slack_export().folder(tmp_path / "slack")
    day = folder / "bots" / "2024-01-01.json"
    code, _, err = replay_cli("--config", config, str(folder), "--report", str(day))
    assert code == 2
    assert f"is the input {folder} (or inside it)" in err
    code, _, err = replay_cli("--config", config, str(export), "--report", str(tmp_path / "r.html"))
    assert (code, err) == (0, "")
