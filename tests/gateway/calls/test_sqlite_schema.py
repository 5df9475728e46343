"""The SQLite call store's schema: WITHOUT ROWID tables, the upgrade of a schema-2 file, sweeps.

The schema-2 file is built from that schema's own CREATE statements (copied here as they
were), so the upgrade is tested on the tables an older loopwarden really wrote.
"""

from __future__ import annotations

import asyncio
import sqlite3
import struct
from contextlib import closing
from pathlib import Path

import pytest

from gateway.app.errors import StateError
from gateway.calls.budgets import Amount, GroupSpend, Limits, group_key, limit_key, nano
from gateway.calls.sqlite_store import SCHEMA_VERSION, SqliteCallStore
from guards.call_loop import circuit_key
from tests.gateway.calls.store_helpers import START, Clock, fingerprint

SCHEMA_2 = (
    "CREATE TABLE IF NOT EXISTS call_meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL)",
    """CREATE TABLE IF NOT EXISTS call_holds (
        key TEXT PRIMARY KEY, paused_until REAL NOT NULL, fresh_from REAL,
        expires_at REAL NOT NULL, reason TEXT NOT NULL, rule TEXT, count INTEGER NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS call_holds_expiry ON call_holds (expires_at)",
    """CREATE TABLE IF NOT EXISTS call_windows (
        key TEXT PRIMARY KEY, times BLOB NOT NULL, idle_at REAL NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS call_windows_idle ON call_windows (idle_at)",
    """CREATE TABLE IF NOT EXISTS call_log (
        id INTEGER PRIMARY KEY, at REAL NOT NULL, provider TEXT NOT NULL,
        agent TEXT NOT NULL, session TEXT NOT NULL, circuit TEXT NOT NULL, model TEXT NOT NULL,
        outcome TEXT NOT NULL, status INTEGER, input_tokens INTEGER, output_tokens INTEGER,
        cost REAL, estimated INTEGER NOT NULL, fingerprint TEXT NOT NULL, rule TEXT,
        retry INTEGER NOT NULL, duration_ms REAL NOT NULL, fields TEXT NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS call_log_at ON call_log (at)",
    """CREATE TABLE IF NOT EXISTS call_spend (
        key TEXT PRIMARY KEY, spent_usd INTEGER NOT NULL, spent_tokens INTEGER NOT NULL,
        held_usd INTEGER NOT NULL, held_tokens INTEGER NOT NULL, alerted INTEGER NOT NULL,
        ends_at REAL NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS call_spend_end ON call_spend (ends_at)",
    """CREATE TABLE IF NOT EXISTS call_spend_limits (
        key TEXT PRIMARY KEY, usd INTEGER, tokens INTEGER, ends_at REAL NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS call_spend_limits_end ON call_spend_limits (ends_at)",
    """CREATE TABLE IF NOT EXISTS call_anomaly (
        agent TEXT PRIMARY KEY, first_at REAL NOT NULL, win INTEGER NOT NULL,
        spent INTEGER NOT NULL, median REAL NOT NULL, alerted INTEGER NOT NULL,
        past TEXT NOT NULL, sessions TEXT NOT NULL, expires_at REAL NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS call_anomaly_end ON call_anomaly (expires_at)",
    "CREATE INDEX IF NOT EXISTS call_log_agent ON call_log (agent, outcome, at)",
    "CREATE INDEX IF NOT EXISTS call_log_outcome ON call_log (outcome, at)",
    "CREATE INDEX IF NOT EXISTS call_log_session ON call_log (session, at)",
    "CREATE INDEX IF NOT EXISTS call_log_customer ON call_log "
    "(json_extract(fields, '$.customer'), at)",
    "CREATE INDEX IF NOT EXISTS call_log_user ON call_log (json_extract(fields, '$.user'), at)",
    "CREATE INDEX IF NOT EXISTS call_log_feature ON call_log "
    "(json_extract(fields, '$.feature'), at)",
)
KEYED_TABLES = ("call_holds", "call_windows", "call_spend", "call_spend_limits", "call_anomaly")
WITHOUT_ROWID = {
    "call_holds",
    "call_windows",
    "call_spend",
    "call_spend_limits",
    "call_spend_owners",
    "call_spend_owned",
}
PAUSED = circuit_key("billing-bot", "run-1")
SPEND_KEY = group_key("daily", "2027-01-15", ("billing-bot",))
LIMIT_KEY = limit_key("daily", "2027-01-15")
DAY_END = START + 57_600.0  # midnight UTC after START


def write_schema_2_file(path: Path) -> None:
    """A file as schema 2 left it: a paused circuit, a counted call, spend, a limit, an agent."""
    until = START + 100.0
    with closing(sqlite3.connect(path)) as db, db:
        for statement in SCHEMA_2:
            db.execute(statement)
        db.execute("INSERT INTO call_meta VALUES ('schema', 2)")
        db.execute(
            "INSERT INTO call_holds VALUES (?, ?, NULL, ?, 'loop_detected', NULL, 6)",
            (PAUSED, until, until),
        )
        db.execute(
            "INSERT INTO call_windows VALUES (?, ?, ?)",
            ("c\x1fsupport-bot/run-9\x1fabc", struct.pack("<2d", START - 2, START - 1), until),
        )
        db.execute(
            "INSERT INTO call_spend VALUES (?, ?, 120, 0, 0, 50, ?)",
            (SPEND_KEY, nano(0.25), DAY_END),
        )
        db.execute(
            "INSERT INTO call_spend_limits VALUES (?, ?, NULL, ?)", (LIMIT_KEY, nano(5.0), DAY_END)
        )
        db.execute(
            "INSERT INTO call_anomaly VALUES ('billing-bot', ?, 0, 7, 0.0, 0, '[]', '{}', ?)",
            (START - 10, DAY_END),
        )


def keyed_rows(path: Path) -> dict[str, list[tuple[object, ...]]]:
    """Every row of the keyed call tables, by table."""
    with closing(sqlite3.connect(path)) as db:
        return {
            table: db.execute(f"SELECT * FROM {table} ORDER BY 1").fetchall()
            for table in KEYED_TABLES
        }


def schema_of(path: Path) -> tuple[int, set[str], list[tuple[str, str, str]]]:
    """The call tables' schema version, the WITHOUT ROWID tables, and every table and index."""
    with closing(sqlite3.connect(path)) as db:
        (version,) = db.execute("SELECT value FROM call_meta WHERE name = 'schema'").fetchone()
        without = {
            str(name)
            for (name,) in db.execute(
                "SELECT name FROM pragma_table_list WHERE wr AND name LIKE 'call%'"
            )
        }
        master = db.execute("SELECT type, name, sql FROM sqlite_master ORDER BY type, name")
        return int(version), without, master.fetchall()


async def open_store(path: Path, clock: Clock) -> SqliteCallStore:
    store = SqliteCallStore(path, clock=clock, wall_clock=clock)
    await store.start()
    return store


async def test_issue10_sqlite_upgrades_a_schema_2_file_keeping_pauses_counts_and_spend(
    tmp_path: Path,
) -> None:
    path = tmp_path / "state.sqlite3"
    clock = Clock(START)
    write_schema_2_file(path)
    before = keyed_rows(path)
    _, _, old_master = schema_of(path)

    await (await open_store(path, clock)).aclose()
    assert keyed_rows(path) == before
    version, without, master = schema_of(path)
    assert (version, without) == (SCHEMA_VERSION, WITHOUT_ROWID)
    # The same tables and indexes, none left behind, less the keys' own indexes, plus the
    # hold owners' tables (issue 20, created as every start creates missing tables).
    key_indexes = {f"sqlite_autoindex_{table}_1" for table in WITHOUT_ROWID}
    owners = {"call_spend_owners", "call_spend_owned"}
    assert [(kind, name) for kind, name, _ in master if name not in owners] == [
        (kind, name) for kind, name, _ in old_master if name not in key_indexes
    ]

    store = await open_store(path, clock)
    try:
        refused = await store.decide(PAUSED, fingerprint(1))
        assert (refused.allowed, refused.code) == (False, "loop_paused")
        assert await store.spend_groups() == [
            (SPEND_KEY, GroupSpend(Amount(nano(0.25), 120), Amount(), 50, DAY_END))
        ]
        assert await store.spend_limits() == {LIMIT_KEY: Limits(nano(5.0), None)}
    finally:
        await store.aclose()


async def test_issue10_sqlite_two_stores_opening_a_schema_2_file_at_once_upgrade_it_once(
    tmp_path: Path,
) -> None:
    path = tmp_path / "state.sqlite3"
    clock = Clock(START)
    write_schema_2_file(path)
    before = keyed_rows(path)

    stores = await asyncio.gather(open_store(path, clock), open_store(path, clock))
    for store in stores:
        await store.aclose()
    assert keyed_rows(path) == before
    assert schema_of(path)[:2] == (SCHEMA_VERSION, WITHOUT_ROWID)


async def test_issue10_sqlite_reopening_a_current_file_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite3"
    clock = Clock(START)
    store = await open_store(path, clock)
    try:
        for _ in range(6):
            await store.decide(PAUSED, fingerprint(2))
            clock.now += 1.0
    finally:
        await store.aclose()
    first = schema_of(path), keyed_rows(path)
    assert first[0][:2] == (SCHEMA_VERSION, WITHOUT_ROWID)
    assert first[1]["call_holds"] != []

    await (await open_store(path, clock)).aclose()
    assert (schema_of(path), keyed_rows(path)) == first


async def test_issue10_sqlite_refuses_call_tables_of_a_newer_schema(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite3"
    write_schema_2_file(path)
    with closing(sqlite3.connect(path)) as db, db:
        db.execute("UPDATE call_meta SET value = ?", (SCHEMA_VERSION + 1,))
    store = SqliteCallStore(path)
    with pytest.raises(StateError, match="newer loopwarden"):
        await store.start()
    version, without, _ = schema_of(path)
    assert (version, without) == (SCHEMA_VERSION + 1, set())


@pytest.mark.parametrize("version", ["abc", 1e308, float("inf"), "9" * 5_000, 0, -1, b"\xff\xfe"])
async def test_issue10_sqlite_refuses_a_schema_version_it_cannot_read(
    tmp_path: Path, version: object
) -> None:
    path = tmp_path / "state.sqlite3"
    write_schema_2_file(path)
    with closing(sqlite3.connect(path)) as db, db:
        db.execute("UPDATE call_meta SET value = ?", (version,))
    store = SqliteCallStore(path)
    with pytest.raises(StateError, match="unknown schema") as refused:
        await store.start()
    assert str(path) in str(refused.value)
    assert len(str(refused.value)) < len(str(path)) + 120
    # The file is left as it was, and the next open with a good version works.
    with closing(sqlite3.connect(path)) as db, db:
        db.execute("UPDATE call_meta SET value = 2")
    await (await open_store(path, Clock(START))).aclose()
    assert schema_of(path)[0] == SCHEMA_VERSION


async def test_issue10_sqlite_sweeps_expired_rows_of_every_table_by_key(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite3"
    clock = Clock(START)
    await (await open_store(path, clock)).aclose()
    gone = START - 1.0
    with closing(sqlite3.connect(path)) as db, db:
        db.execute(
            "INSERT INTO call_holds VALUES (?, ?, NULL, ?, 'loop_detected', NULL, 6)",
            (PAUSED, gone, gone),
        )
        db.execute("INSERT INTO call_windows VALUES ('c\x1fold\x1fabc', ?, ?)", (b"\x00" * 8, gone))
        db.execute("INSERT INTO call_spend VALUES (?, 1, 1, 0, 0, 0, ?)", (SPEND_KEY, gone))
        db.execute("INSERT INTO call_spend_limits VALUES (?, 1, NULL, ?)", (LIMIT_KEY, gone))
        db.execute(
            "INSERT INTO call_anomaly VALUES ('billing-bot', ?, 0, 7, 0.0, 0, '[]', '{}', ?)",
            (gone, gone),
        )

    store = await open_store(path, clock)
    try:
        for n in range(8):  # one sweep
            await store.decide(circuit_key("billing-bot", "run-2"), fingerprint(n))
    finally:
        await store.aclose()
    with closing(sqlite3.connect(path)) as db:
        expired = {
            table: db.execute(
                f"SELECT count(*) FROM {table} WHERE {column} <= ?", (START,)
            ).fetchone()[0]
            for table, column in (
                ("call_holds", "expires_at"),
                ("call_windows", "idle_at"),
                ("call_spend", "ends_at"),
                ("call_spend_limits", "ends_at"),
                ("call_anomaly", "expires_at"),
            )
        }
    assert expired == dict.fromkeys(expired, 0)
