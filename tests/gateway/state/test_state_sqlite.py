"""SqliteStateStore beyond the conformance suite: restarts, concurrency, bounds, SIGKILL."""

from __future__ import annotations

import asyncio
import json
import math
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest

from gateway.app.errors import StateError
from gateway.state.base import AuditEntry, TranscriptEntry
from gateway.state.sqlite import SCHEMA_VERSION, SqliteStateStore
from guards.bot_loop import BotLoopPolicy, PairDecision
from tests.gateway.state.hammer import ROOT, admitted_across_processes

ROOM = "discord:1100"
POLICY = BotLoopPolicy(max_events_per_window=3, window_seconds=600.0, cooldown_seconds=600.0)


class Clock:
    """A settable wall clock."""

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@asynccontextmanager
async def opened(path: Path, clock: Clock, **options: int) -> AsyncIterator[SqliteStateStore]:
    """A started store on `path`, closed on exit (a restart is two of these in turn)."""
    store = SqliteStateStore(path, clock=clock, **options)
    await store.start()
    try:
        yield store
    finally:
        await store.aclose()


async def decide(store: SqliteStateStore, policy: BotLoopPolicy = POLICY) -> PairDecision:
    """One event of the pair bot-a/bot-b in ROOM."""
    return await store.pair_decide(
        scope=ROOM, self_bot_id="bot-a", sender_bot_id="bot-b", policy=policy
    )


def rows(path: Path, table: str) -> int:
    """Rows of a table, read with a connection of our own (WAL lets us read alongside)."""
    with sqlite3.connect(path) as db:
        count: int = db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
    return count


async def test_a_restart_keeps_cooldowns_pauses_overrides_receipts_and_the_audit(
    tmp_path: Path,
) -> None:
    path = tmp_path / "state.sqlite3"
    clock = Clock()
    async with opened(path, clock) as store:
        for _ in range(4):
            await decide(store)
        await store.pause(ROOM, 900.0)
        await store.pause("discord:2200", None)
        await store.set_override(ROOM, "bot_loop.max_events_per_window", 6)
        assert await store.claim("dedupe:discord:bot-a:m1", 600.0)
        assert await store.bot_turn(ROOM, is_bot=True, message_key="m1") == 1
        await store.audit(
            AuditEntry(1.0, "discord", ROOM, "u1", "ann", "/loop reset", True, "done")
        )
    clock.now += 100.0
    async with opened(path, clock) as store:
        refused = await decide(store)
        assert (refused.reason, refused.count) == ("cooldown", 3)
        assert refused.retry_after == pytest.approx(500.0)
        [pair] = await store.pair_snapshot(ROOM)
        assert pair.cooldown_remaining == pytest.approx(500.0)
        assert await store.pause_remaining(ROOM) == pytest.approx(800.0)
        assert await store.pause_remaining("discord:2200") == math.inf
        assert await store.get_overrides(ROOM) == {"bot_loop.max_events_per_window": 6}
        assert not await store.claim("dedupe:discord:bot-a:m1", 600.0)
        assert await store.bot_turn(ROOM, is_bot=True, message_key="m1") == 1
        assert await store.bot_turn(ROOM, is_bot=True) == 2
        assert [e.user_name for e in await store.recent_audit()] == ["ann"]
    clock.now += 500.0
    async with opened(path, clock) as store:
        assert (await decide(store)).count == 1
        assert await store.pause_remaining(ROOM) == pytest.approx(300.0)


# The tables of schema 2 this test needs, as that version created them.
_SCHEMA_2 = (
    """CREATE TABLE pairs (
        scope TEXT NOT NULL, bot_a TEXT NOT NULL, bot_b TEXT NOT NULL,
        times TEXT NOT NULL, cooldown_until REAL, expires_at REAL NOT NULL,
        PRIMARY KEY (scope, bot_a, bot_b))""",
    "CREATE INDEX pairs_expiry ON pairs (expires_at)",
    "CREATE TABLE claims (key TEXT PRIMARY KEY, expires_at REAL NOT NULL)",
    "CREATE INDEX claims_expiry ON claims (expires_at)",
    """CREATE TABLE receipts (
        key TEXT PRIMARY KEY, owner TEXT NOT NULL, confirmed INTEGER NOT NULL,
        expires_at REAL NOT NULL)""",
    """CREATE TABLE overrides (
        scope TEXT NOT NULL, field TEXT NOT NULL, value TEXT NOT NULL,
        PRIMARY KEY (scope, field))""",
    "CREATE TABLE pauses (scope TEXT PRIMARY KEY, until REAL)",
    """CREATE TABLE audit (
        id INTEGER PRIMARY KEY AUTOINCREMENT, at REAL NOT NULL, platform TEXT NOT NULL,
        room TEXT NOT NULL, user_id TEXT NOT NULL, user_name TEXT NOT NULL,
        command TEXT NOT NULL, allowed INTEGER NOT NULL, outcome TEXT NOT NULL)""",
)


async def test_issue10_a_schema_2_file_keeps_all_but_its_pairs(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite3"
    clock = Clock()
    later = clock.now + 500.0
    with sqlite3.connect(path) as db:
        for statement in _SCHEMA_2:
            db.execute(statement)
        # A pair in cooldown, stored as schema 2 did: the instants its events stop counting.
        db.execute(
            "INSERT INTO pairs VALUES (?, 'bot-a', 'bot-b', ?, ?, ?)",
            (ROOM, json.dumps([later] * 3), later, later),
        )
        db.execute("INSERT INTO claims VALUES ('admin:1', ?)", (later,))
        db.execute("INSERT INTO receipts VALUES ('dedupe:1', 'old-run', 1, ?)", (later,))
        db.execute(
            "INSERT INTO overrides VALUES (?, 'bot_loop.max_events_per_window', '6')", (ROOM,)
        )
        db.execute("INSERT INTO pauses VALUES (?, NULL)", (ROOM,))
        db.execute(
            "INSERT INTO audit (at, platform, room, user_id, user_name, command, allowed, "
            "outcome) VALUES (1.0, 'discord', ?, 'u1', 'ann', '/loop pause', 1, 'done')",
            (ROOM,),
        )
        db.execute("PRAGMA user_version=2")
    async with opened(path, clock) as store:
        # Its pair could not become a record (no event times): it starts a fresh window.
        assert await store.pair_snapshot() == []
        assert (await decide(store)).count == 1
        assert not await store.claim("admin:1", 600.0)
        assert not await store.receive("dedupe:1", 600.0)
        assert await store.get_overrides(ROOM) == {"bot_loop.max_events_per_window": 6}
        assert await store.pause_remaining(ROOM) == math.inf
        assert [e.command for e in await store.recent_audit()] == ["/loop pause"]
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 4


async def test_issue11_a_schema_3_file_gets_transcripts_and_keeps_every_other_table(
    tmp_path: Path,
) -> None:
    path = tmp_path / "state.sqlite3"
    clock = Clock()
    async with opened(path, clock) as store:
        await decide(store)
        await store.pause(ROOM, None)
        await store.set_override(ROOM, "bot_loop.max_events_per_window", 6)
    # What schema 3 wrote: everything but the transcript tables.
    with sqlite3.connect(path) as db:
        db.execute("DROP TABLE transcript")
        db.execute("DROP TABLE transcripts")
        db.execute("PRAGMA user_version=3")
    async with opened(path, clock) as store:
        assert (await decide(store)).count == 2
        assert await store.pause_remaining(ROOM) == math.inf
        assert await store.get_overrides(ROOM) == {"bot_loop.max_events_per_window": 6}
        entry = TranscriptEntry("discord:1:1", "U1", "ann", "hello")
        assert await store.transcript_append(ROOM, entry, max_messages=10, ttl=60.0)
        assert (await store.transcript_recent(ROOM, 10)).entries == (entry,)
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == 4


async def test_issue10_a_pair_row_is_its_pair_record(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite3"
    clock = Clock()
    start = clock.now
    async with opened(path, clock) as store:
        await decide(store)
        clock.now += 0.1
        await decide(store, BotLoopPolicy(max_events_per_window=2, window_seconds=30.0))
        clock.now += 0.1
        await decide(store, BotLoopPolicy(max_events_per_window=2, cooldown_seconds=45.0))
    with sqlite3.connect(path) as db:
        times, cooldown_until, window, idle_at = db.execute(
            "SELECT times, cooldown_until, window_seconds, expires_at FROM pairs"
        ).fetchone()
    # Event times kept exactly, the window last counted in, idle when the cooldown ends.
    assert json.loads(times) == [start, start + 0.1]
    assert (cooldown_until, window, idle_at) == (start + 0.1 + 0.1 + 45.0, 60.0, cooldown_until)


async def test_the_default_clock_is_the_wall_clock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [1_700_000_000.0]
    monkeypatch.setattr(time, "time", lambda: now[0])
    store = SqliteStateStore(tmp_path / "state.sqlite3")
    await store.start()
    try:
        await store.pause(ROOM, 60.0)
        now[0] += 45.0
        assert await store.pause_remaining(ROOM) == pytest.approx(15.0)
    finally:
        await store.aclose()


async def test_the_file_is_in_wal_mode_with_its_schema(tmp_path: Path) -> None:
    path = tmp_path / "nested" / "dir" / "state.sqlite3"
    async with opened(path, Clock()):
        pass
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


async def test_a_file_from_a_newer_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite3"
    with sqlite3.connect(path) as db:
        db.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    store = SqliteStateStore(path)
    with pytest.raises(StateError, match="newer loopwarden"):
        await store.start()
    await store.aclose()


async def test_a_store_that_is_not_started_says_so(tmp_path: Path) -> None:
    with pytest.raises(StateError, match="not started"):
        await SqliteStateStore(tmp_path / "state.sqlite3").claim("k", 1.0)


async def test_many_coroutines_on_one_pair_get_exactly_the_budget(tmp_path: Path) -> None:
    async with opened(tmp_path / "state.sqlite3", Clock()) as store:
        decisions = await asyncio.gather(*(decide(store) for _ in range(50)))
    assert sum(d.allowed for d in decisions) == 3
    assert sorted(d.reason for d in decisions).count("budget_exceeded") == 1


def test_two_processes_of_twenty_coroutines_get_exactly_the_budget(tmp_path: Path) -> None:
    counts = admitted_across_processes("sqlite", str(tmp_path / "shared.sqlite3"), budget=7)
    assert sum(counts) == 7


async def test_the_audit_log_keeps_the_newest_entries(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite3"
    async with opened(path, Clock(), audit_keep=5) as store:
        for n in range(12):
            await store.audit(AuditEntry(float(n), "room", "room:lobby", "u", "u", "c", True, "ok"))
        assert [e.at for e in await store.recent_audit(100)] == [11.0, 10.0, 9.0, 8.0, 7.0]
    assert rows(path, "audit") == 5


async def test_idle_pairs_claims_and_receipts_are_swept_as_traffic_goes_on(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite3"
    clock = Clock()
    async with opened(path, clock) as store:
        for n in range(100):
            await store.pair_decide(
                scope=ROOM, self_bot_id=f"bot-{n}", sender_bot_id="x", policy=POLICY
            )
            await store.claim(f"dedupe:{n}", 10.0)
            await store.bot_turn(ROOM, is_bot=True, message_key=f"m{n}")
        clock.now += 3600.0
        for n in range(60):
            await store.pair_decide(
                scope=ROOM, self_bot_id=f"new-{n}", sender_bot_id="x", policy=POLICY
            )
            await store.claim(f"fresh:{n}", 10.0)
            await store.bot_turn(ROOM, is_bot=True, message_key=f"n{n}")
    # 60 calls sweep two idle rows each: every one of the 100 idle rows is gone.
    assert rows(path, "pairs") == 60
    assert rows(path, "claims") == 60
    assert rows(path, "turns_seen") == 60


async def test_a_run_out_pause_is_deleted_when_read(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite3"
    clock = Clock()
    async with opened(path, clock) as store:
        await store.pause(ROOM, 10.0)
        clock.now += 10.0
        assert await store.pause_remaining(ROOM) is None
    assert rows(path, "pauses") == 0


# SIGKILL of a real `loopwarden run` during a cooldown

COOLDOWN = 3600.0
ADMIN_TOKEN = "sigkill-admin-token"
RUN_CONFIG = """
state: {{backend: sqlite, path: '{path}'}}
http: {{host: 127.0.0.1, port: 0, admin_token: {token}}}
agents:
  ping: {{kind: scripted, rules: [{{match: '(?i)@ping\\b', reply: '@pong ping'}}]}}
  pong: {{kind: scripted, rules: [{{match: '(?i)@pong\\b', reply: '@ping pong'}}]}}
bots:
  - {{id: ping, platform: room, name: ping, agent: ping}}
  - {{id: pong, platform: room, name: pong, agent: pong}}
admins: {{room: [alice]}}
policy:
  respond_to: {{humans: all, bots: mentions}}
  bot_loop: {{max_events_per_window: 4, window_seconds: 3600, cooldown_seconds: {cooldown}}}
"""
COOLING = r"ping ↔ pong: cooling down, (1 h|59 min \d+ s) left"
WAIT_SECONDS = 30.0
"""A bound on every wait, so a broken run fails instead of hanging; never a pass condition."""


class Gateway:
    """A `python -m gateway run` subprocess logging to a file."""

    def __init__(self, config: Path, log: Path) -> None:
        self._log = log
        with log.open("ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "gateway", "run", "--config", str(config)],
                cwd=ROOT,
                stdout=out,
                stderr=out,
            )
        self._seen = log.stat().st_size

    async def port(self) -> int:
        """The HTTP port this run serves on, from its log."""
        async with asyncio.timeout(WAIT_SECONDS):
            while True:
                text = self._log.read_bytes()[self._seen :].decode()
                found = re.search(r"http server on [\d.]+:(\d+)", text)
                if found:
                    return int(found.group(1))
                assert self.process.poll() is None, text
                await asyncio.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL: no drain, no close, no chance to write anything more."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=WAIT_SECONDS)


@pytest.fixture
def run_config(tmp_path: Path) -> tuple[Path, Path]:
    """The config of the killed gateway and its state file."""
    state = tmp_path / "state.sqlite3"
    config = tmp_path / "loopwarden.yaml"
    config.write_text(
        RUN_CONFIG.format(path=state, token=ADMIN_TOKEN, cooldown=COOLDOWN), encoding="utf-8"
    )
    return config, state


@asynccontextmanager
async def room_session(port: int) -> AsyncIterator[aiohttp.ClientWebSocketResponse]:
    """A human, carol, in the room's lobby, once every bot is connected."""
    base = f"http://127.0.0.1:{port}"
    async with aiohttp.ClientSession() as client:
        async with asyncio.timeout(WAIT_SECONDS):
            while True:
                async with client.get(f"{base}/readyz") as response:
                    if response.status == 200:
                        break
                await asyncio.sleep(0.05)
        async with client.ws_connect(f"{base}/room/ws") as ws:
            await ws.send_json({"type": "join", "name": "carol", "room": "lobby"})
            yield ws


async def said(ws: aiohttp.ClientWebSocketResponse, sender: str | None, needle: str) -> str:
    """The text of the next message (from `sender`, when given) that contains `needle`."""
    async with asyncio.timeout(WAIT_SECONDS):
        while True:
            frame = await ws.receive()
            assert frame.type is aiohttp.WSMsgType.TEXT, frame
            event = json.loads(frame.data)
            text = str(event.get("text", ""))
            if sender in (None, event.get("sender_name")) and needle in text:
                return text


async def admin_status(port: int) -> str:
    """`GET /admin/status` for the lobby."""
    async with (
        aiohttp.ClientSession() as client,
        client.get(
            f"http://127.0.0.1:{port}/admin/status",
            params={"room": "room:lobby"},
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        ) as response,
    ):
        assert response.status == 200
        result: str = (await response.json())["result"]
        return result


async def cooldown_left(state: Path) -> tuple[float, float, float]:
    """(wall time before, ping↔pong cooldown left, wall time after), read from the file."""
    store = SqliteStateStore(state)
    await store.start()
    try:
        before = time.time()
        [pair] = await store.pair_snapshot("room:lobby")
        after = time.time()
    finally:
        await store.aclose()
    assert (pair.bot_a, pair.bot_b, pair.count) == ("ping", "pong", 4)
    return before, pair.cooldown_remaining, after


async def test_a_cooldown_survives_sigkill_with_the_right_time_left(
    tmp_path: Path, run_config: tuple[Path, Path]
) -> None:
    config, state = run_config
    log = tmp_path / "gateway.log"
    first = Gateway(config, log)
    try:
        port = await first.port()
        async with room_session(port) as ws:
            opened_after = time.time()
            await ws.send_json({"type": "say", "text": "@ping start"})
            await said(ws, None, "Loop guard: pausing replies")
            opened_before = time.time()
        status = await admin_status(port)
        assert re.search(COOLING, status), status
    finally:
        first.kill()
    assert first.process.returncode == -signal.SIGKILL

    # The cooldown opened at some T in [opened_after, opened_before]; it ends at T + COOLDOWN.
    before, left, after = await cooldown_left(state)
    assert opened_after + COOLDOWN - after - 0.01 <= left <= opened_before + COOLDOWN - before

    second = Gateway(config, log)
    try:
        port = await second.port()
        status = await admin_status(port)
        assert re.search(COOLING, status), status
        async with room_session(port) as ws:
            await ws.send_json({"type": "say", "text": "@ping are you there?"})
            assert await said(ws, "ping", "@pong ping") == "@pong ping"
        # pong's answer to ping is refused: the pair is still cooling down after the restart.
        async with asyncio.timeout(WAIT_SECONDS):
            while True:
                if "bot_loop cooldown" in await admin_status(port):
                    break
                await asyncio.sleep(0.05)
        _, left_after, _ = await cooldown_left(state)
        assert left_after <= left
    finally:
        if second.process.poll() is None:
            second.process.send_signal(signal.SIGTERM)
            second.process.wait(timeout=WAIT_SECONDS)
    assert second.process.returncode == 0, log.read_text()
    assert ADMIN_TOKEN not in log.read_text()
