"""`loopwarden run --workers N`: webhook bots served by every worker (issue 24).

A real `loopwarden run --workers 2` on sqlite state hosts a Telegram bot in webhook mode
against the fake Bot API; updates posted to its webhook route on the one port are
answered by both workers. A bot that keeps a connection of its own is refused.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import aiohttp
import pytest

from gateway.cli.workers import WORKER_HEADER
from tests.fakes.telegram_server import TelegramFake
from tests.gateway.proxy.test_proxy_cli import free_port, run_cli
from tests.gateway.proxy.test_proxy_workers import Workers

TOKEN = "4242:AAE-workers-test-token"
SECRET = "webhook-secret-0123456789"
TIMEOUT = 30


def run_yaml(tmp_path: Path, api: str, port: int, *, mode: str = "webhook") -> Path:
    path = tmp_path / "loopwarden.yaml"
    path.write_text(
        f"""
http: {{host: 127.0.0.1, port: {port}}}
state: {{backend: sqlite, path: '{tmp_path / "state.sqlite3"}'}}
agents: {{parrot: {{kind: scripted, default: 'echo: {{text}}'}}}}
bots:
  - id: tg
    platform: telegram
    token: '{TOKEN}'
    api_base_url: '{api}'
    mode: {mode}
    webhook_url: 'https://bots.example.com/telegram/tg'
    webhook_secret: '{SECRET}'
    agent: parrot
""",
        encoding="utf-8",
    )
    return path


async def test_issue24_run_with_two_workers_serves_the_webhook_from_both(tmp_path: Path) -> None:
    async with TelegramFake() as telegram:
        telegram.add_bot(TOKEN, 4242, "workers_bot")
        port = free_port()
        path = run_yaml(tmp_path, telegram.base_url, port)
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            *("-m", "gateway", "run", "--workers", "2", "--config", str(path)),
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        workers = Workers(process, f"http://127.0.0.1:{port}")
        reading = asyncio.create_task(workers.read())
        try:
            await workers.logged("loopwarden running", 2)
            seen: set[str] = set()
            connector = aiohttp.TCPConnector(force_close=True)
            headers = {"X-Telegram-Bot-Api-Secret-Token": SECRET}
            async with aiohttp.ClientSession(connector=connector) as http:
                for update in range(400):
                    async with http.post(
                        f"{workers.url}/telegram/tg", json={"update_id": update}, headers=headers
                    ) as answer:
                        assert answer.status == 200, await answer.text()
                        seen.add(answer.headers[WORKER_HEADER])
                    if len(seen) == 2:
                        break
            started = await workers.logged(r"worker \d started \(pid (\d+)\)", 2)
            assert seen == {m[1] for m in started}
            process.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(process.wait(), TIMEOUT) == 0
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
            await reading


@pytest.mark.parametrize(
    ("bots", "named"),
    [
        ("mode: polling", "bots.0 (tg): Telegram long polling is one connection per bot"),
        ("mode: webhook", None),
    ],
)
async def test_issue24_run_workers_refuse_a_bot_with_a_connection_of_its_own(
    tmp_path: Path, bots: str, named: str | None
) -> None:
    path = run_yaml(tmp_path, "http://127.0.0.1:9", free_port(), mode=bots.split()[1])
    if named is None:  # the webhook bot passes; memory state is the next refusal
        text = path.read_text(encoding="utf-8").replace("backend: sqlite", "backend: memory")
        path.write_text(text, encoding="utf-8")
        named = "state.backend: memory"
    code, _, err = await run_cli("run", "--workers", "3", "--config", str(path))
    assert code == 2
    assert err.startswith(f"config error: {named}")
    assert "--workers 3" in err
