"""`loopwarden console-link` against a running gateway: past a lockout, once, for 10 minutes."""

from __future__ import annotations

import os
import stat
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest

from gateway.admin.console.links import ConsoleLinks, LinkFolderError
from gateway.app.runtime import Gateway
from gateway.cli.main import main
from gateway.config import load_config
from tests.fakes.redis_server import free_port
from tests.gateway.console.console_helpers import TOKEN, Browser, Clock, session_cookie
from tests.gateway.runtime_helpers import FakePlatform

WRONG = "adm-console-guess-5e6f7a8b"


@asynccontextmanager
async def running_gateway(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock: Clock
) -> AsyncIterator[tuple[Path, Browser]]:
    """A gateway serving its console on a fixed port, its config file, and a browser."""
    monkeypatch.setenv("LOOPWARDEN_RUNTIME_DIR", str(tmp_path / "run"))
    monkeypatch.setenv("LW_TEST_ADMIN", TOKEN)
    port = free_port()
    path = tmp_path / "loopwarden.yaml"
    path.write_text(
        f"http: {{host: 0.0.0.0, port: {port}, admin_token: '${{LW_TEST_ADMIN}}'}}\n"
        "agents: {parrot: {kind: scripted, default: 'echo: {text}'}}\n"
        "bots: [{id: bot-a, platform: room, agent: parrot}]\n",
        encoding="utf-8",
    )
    gateway = Gateway(load_config(str(path)), connector_factory=FakePlatform(), wall_clock=clock)
    await gateway.start()
    try:
        async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as http:
            yield path, Browser(http, f"http://127.0.0.1:{port}")
    finally:
        await gateway.stop(1.0)


def console_link(path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """Run `loopwarden console-link`; the link's path and query."""
    assert main(["console-link", "--config", str(path)]) == 0
    printed = capsys.readouterr()
    assert "valid once, for 10 minutes" in printed.err
    link = printed.out.strip()
    base, _, rest = link.partition("/console/login?code=")
    assert base.startswith("http://127.0.0.1:")
    assert len(rest) >= 40
    return f"/console/login?code={rest}"


async def test_issue20_console_link_signs_in_past_a_lockout_once_and_not_after_10_minutes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    clock = Clock()
    async with running_gateway(tmp_path, monkeypatch, clock) as (path, browser):
        for _ in range(10):
            await browser.request("POST", "/console/login", data=f"token={WRONG}")
        locked, _ = await browser.request("POST", "/console/login", data=f"token={TOKEN}")
        assert locked.status == 429

        link = console_link(path, capsys)
        clock.now = time.time()  # the server reads the host's clock after the command wrote
        signed_in, _ = await browser.request("GET", link)
        assert (signed_in.status, signed_in.headers["Location"]) == (303, "/console/")
        cookie = session_cookie(signed_in)
        page, _ = await browser.request("GET", "/console/", cookie=cookie)
        assert page.status == 200
        again, _ = await browser.request("GET", link)
        assert again.status == 429
        assert session_cookie(again) is None

        late = console_link(path, capsys)
        # The command wrote its expiry on the host's clock: the server's reads 10 min later.
        clock.now = time.time() + 600
        expired, _ = await browser.request("GET", late)
        assert expired.status == 429
        assert session_cookie(expired) is None
        folder = tmp_path / "run" / f"console-gateway-{browser.base.rpartition(':')[2]}"
        assert list(folder.iterdir()) == []


async def test_issue20_console_link_files_are_the_users_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    async with running_gateway(tmp_path, monkeypatch, Clock()) as (path, browser):
        console_link(path, capsys)
        [folder] = (tmp_path / "run").iterdir()
        [pending] = folder.iterdir()
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        assert stat.S_IMODE(pending.stat().st_mode) == 0o600
        code = console_link(path, capsys).rpartition("=")[2]
        # A code is stored as its hash only.
        assert all(code not in p.name and code not in p.read_text() for p in folder.iterdir())
        # A folder others may enter is not trusted: no link is made, none redeemed.
        folder.chmod(0o755)
        assert main(["console-link", "--config", str(path)]) == 1
        assert "chmod 700" in capsys.readouterr().err
        refused, _ = await browser.request("GET", f"/console/login?code={code}")
        assert refused.status == 401


def test_issue20_a_link_file_planted_by_a_symlink_or_open_to_others_is_refused(
    tmp_path: Path,
) -> None:
    links = ConsoleLinks(tmp_path / "links")
    links.prepare()
    code = links.issue()
    [pending] = links.folder.iterdir()
    pending.chmod(0o644)
    assert not links.redeem(code)
    pending.unlink()
    target = tmp_path / "elsewhere"
    target.write_text("1e300", encoding="ascii")
    os.symlink(target, pending)
    assert not links.redeem(code)
    for content in ("inf", "nan", "soon", "9" * 5_000, "\x00"):
        pending.unlink(missing_ok=True)  # the symlink, then what the last redeem left
        pending.write_text(content, encoding="latin-1")
        pending.chmod(0o600)
        assert not links.redeem(code)
        assert not pending.exists()  # read once, deleted unused
    assert not links.redeem("")
    assert not links.redeem("\ud800" * 5_000)


def test_issue20_console_link_needs_a_folder_the_server_made(tmp_path: Path) -> None:
    with pytest.raises(LinkFolderError, match="no console has started"):
        ConsoleLinks(tmp_path / "never").issue()
