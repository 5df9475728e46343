"""SIGKILL mid-turn and restart: with sqlite state and Telegram polling, nothing is lost.

A real `loopwarden run` subprocess polls the fake Telegram Bot API (in the test process)
with a slow scripted agent. Each of three groups gets a "quiet" message (the agent has nothing
to say to it, at once, so its receipt is confirmed) and then two that are answered after the
agent's delay; the gateway is killed while the first of those is in flight in every
group, which the test sees in the sqlite file itself, not by timing. Nothing was
confirmed to Telegram, so the restarted gateway (its agent now quick) is handed every
update again: each human message must be answered exactly once, and the quiet ones,
whose receipts were confirmed, are refused as duplicates.

Every wait is a bounded poll on a condition; the bounds are generous and never a pass
condition.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from tests.connectors.connector_helpers import PROCESS_SECONDS, gateway_process, wait_for
from tests.fakes.telegram_server import FakeChat, FakeUser, TelegramFake

TOKEN = "123456:AAHcrashTestToken_abcdefghijklmnopqrs"
ALICE = FakeUser(5678, "Alice", "alice")
GROUPS = [FakeChat(-1001 - n, "supergroup", f"Room {n}") for n in range(3)]
SLOW_SECONDS = 3600.0
"""The first run's agent delay: its turns are still in flight whenever it is killed."""

CONFIG = """
state: {{backend: sqlite, path: "{state}"}}
http: {{host: 127.0.0.1, port: 0}}
agents:
  parrot:
    kind: scripted
    delay: {delay}
    rules: [{{match: "^quiet", reply: ""}}]
    default: "echo: {{text}}"
bots:
  - id: parrot-tg
    platform: telegram
    token: "{token}"
    agent: parrot
    api_base_url: "{base_url}"
    poll_timeout: 1
pipeline: {{typing_indicator: false}}
"""


@pytest.fixture(autouse=True)
def _timedelta_periods(monkeypatch: pytest.MonkeyPatch) -> None:
    """Opt in to PTB's timedelta periods, else its RetryAfter warns (an error under pytest)."""
    monkeypatch.setenv("PTB_TIMEDELTA", "true")


@pytest.fixture
async def fake() -> AsyncIterator[TelegramFake]:
    """The Bot API with one bot in three groups."""
    async with TelegramFake() as server:
        server.add_bot(TOKEN, 7001, "ParrotBot")
        for group in GROUPS:
            server.add_chat(group, TOKEN)
        yield server


def write_config(tmp_path: Path, fake: TelegramFake, state: Path, *, delay: float) -> Path:
    """The gateway's config file, with the agent's delay."""
    path = tmp_path / "loopwarden.yaml"
    path.write_text(
        CONFIG.format(state=state, delay=delay, token=TOKEN, base_url=fake.base_url),
        encoding="utf-8",
    )
    return path


def receipts(state: Path) -> tuple[int, int]:
    """(in flight, confirmed) dedupe receipts in the gateway's sqlite file, as it is now."""
    try:
        with sqlite3.connect(state) as db:
            rows = dict(db.execute("SELECT confirmed, count(*) FROM receipts GROUP BY confirmed"))
    except sqlite3.OperationalError:  # not created yet
        return 0, 0
    return rows.get(0, 0), rows.get(1, 0)


async def metric(port: int, name: str) -> float:
    """One sample of the gateway's /metrics (0 when absent)."""
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://127.0.0.1:{port}/metrics") as response,
    ):
        for line in (await response.text()).splitlines():
            if line.startswith(name + " "):
                return float(line.split()[-1])
    return 0.0


async def test_issue9_sigkill_mid_turn_then_restart_answers_every_message_exactly_once(
    tmp_path: Path, fake: TelegramFake
) -> None:
    state = tmp_path / "state.sqlite3"
    config = write_config(tmp_path, fake, state, delay=SLOW_SECONDS)
    async with gateway_process(config) as first:
        await first.ready()
        for group in GROUPS:
            for text in ("quiet", "one", "two"):
                fake.group_message(group, ALICE, f"{text} in {group.title}")
        # Every group's quiet turn is confirmed and its "one" turn is in flight.
        await wait_for(lambda: receipts(state) == (len(GROUPS), len(GROUPS)), PROCESS_SECONDS)
        await first.kill()
    assert fake.sent == []
    assert len(fake.pending(TOKEN)) == 3 * len(GROUPS)  # nothing confirmed to Telegram

    write_config(tmp_path, fake, state, delay=0.0)
    async with gateway_process(config) as second:
        port = await second.ready()
        for group in GROUPS:
            fake.group_message(group, ALICE, f"three in {group.title}")
        # Each group is answered in order: once "three" is answered, so is all before it.
        await wait_for(lambda: len(fake.sent) == 3 * len(GROUPS), PROCESS_SECONDS)
        for group in GROUPS:
            assert [m.text for m in fake.sent_to(group.id)] == [
                f"echo: {text} in {group.title}" for text in ("one", "two", "three")
            ]
        duplicates = 'refusals_total{reason="duplicate",stage="dedupe"}'
        assert await metric(port, duplicates) == len(GROUPS)
        await second.terminate()
    assert len(fake.sent) == 3 * len(GROUPS)
