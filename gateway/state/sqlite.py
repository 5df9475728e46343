"""SQLite state: one gateway node whose budgets, cooldowns and receipts survive restarts.

The database runs in WAL mode through gateway/state/sqlite_db.py: a decision runs on the
event loop while the write lock is free at once, and waits for another process's lock on a
worker thread, so any number of coroutines can use the store and the event loop never
waits on a lock or the disk. Each decision is one `BEGIN IMMEDIATE` transaction that reads
the clock only once it holds the write lock, so decisions are serialised in time order,
also between processes sharing the file (`busy_timeout` makes the others wait). A
committed decision survives SIGKILL of the gateway (the WAL is in the file system);
`synchronous=NORMAL` may lose the last transactions on a power cut only.

Decisions where DESIGN.md is silent:
- Time is wall-clock (`time.time()`, injectable) and stored as absolute instants, unlike
  the memory backend's monotonic clock: a monotonic clock restarts with the process, so
  a cooldown stored against it would be wrong after a restart. A cooldown opened at T
  for 60 s still has 60 - (now - T) seconds left when the gateway comes back.
- A pair's row is its `PairRecord` (guards/bot_loop.py): each decision loads it, applies
  `step_pair` and saves it, so the rules are the memory backend's, including a policy
  change mid-window (`/loop set`: the events in the window count against the new budget,
  a running cooldown keeps its end). The row expires (`expires_at`) at the record's
  `idle_at`, when forgetting it changes no decision.
- A room budget's row (table `room_budgets`, issue 20) is its `RoomRecord`
  (guards/room_budget.py) as JSON, stepped by `step_room` like a pair's row; the table is
  created in any schema 4 file (an older loopwarden leaves it alone).
- Schema 3 stores event times where 1 and 2 stored the instants events stop counting,
  under a window they did not record: opening an older file drops its pair rows (a pair
  starts a fresh window, a running cooldown ends early) and keeps everything else.
- A dedupe receipt in flight under another owner (store instance) is taken over at once:
  the file belongs to one gateway process, so another owner is a previous run that died
  mid-turn, and the redelivery of its message is answered (gateway/state/receipts.py).
- Expired rows (idle pairs, claims, message receipts) are swept a few per call, never
  by a scan; a pause that ran out is deleted when it is read.
- The audit trail's admin log (table `audit`) keeps the newest `audit_keep` (10,000)
  entries; its `others` log is the table `audit_others` (gateway/state/audit.py).
- Schema 4 adds the transcripts (DESIGN.md §3): a row per message, its entry as JSON
  (`gateway.state.transcripts`), unique per transcript and message key, and a row per
  transcript with its expiry. An older file gets the new tables and keeps every other.
  A row that cannot be read (not UTF-8, not JSON, not an entry) is skipped and counted.
- The Activity feed's tables and statements are gateway/state/sqlite_activity.py; an
  append is one transaction per batch the feed flushes.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import time
from collections.abc import Callable, Mapping, Sequence

from gateway.app.errors import StateError
from gateway.state import audit, receipts, sqlite_activity, transcripts
from gateway.state.activity import ActivityBucket, ActivityEvent, Span
from gateway.state.base import AuditEntry, AuditKind, Transcript, TranscriptEntry
from gateway.state.receipts import Receipt
from gateway.state.sqlite_db import SqliteDb, transaction
from guards.bot_loop import (
    BotLoopPolicy,
    PairDecision,
    PairRecord,
    PairSnapshot,
    pair_key,
    pair_view,
    step_bot_turns,
    step_pair,
)
from guards.room_budget import RoomDecision, RoomRecord, room_budget_on, step_room

SCHEMA_VERSION = 4
# The first schema whose pair rows are `PairRecord`s; older pair rows are dropped.
_PAIR_RECORD_SCHEMA = 3
_SCHEMA = (
    # A `PairRecord`: times, a JSON list of the admitted events' times, oldest first;
    # cooldown_until, NULL when no cooldown was opened in the window; window_seconds, the
    # window the events were last counted in; expires_at, the record's idle_at.
    """CREATE TABLE IF NOT EXISTS pairs (
        scope TEXT NOT NULL, bot_a TEXT NOT NULL, bot_b TEXT NOT NULL,
        times TEXT NOT NULL, cooldown_until REAL, window_seconds REAL NOT NULL,
        expires_at REAL NOT NULL, PRIMARY KEY (scope, bot_a, bot_b))""",
    "CREATE INDEX IF NOT EXISTS pairs_expiry ON pairs (expires_at)",
    "CREATE TABLE IF NOT EXISTS bot_turns (scope TEXT PRIMARY KEY, count INTEGER NOT NULL)",
    # A room budget's `RoomRecord` (guards/room_budget.py) as JSON, expiring at its idle_at.
    """CREATE TABLE IF NOT EXISTS room_budgets (
        scope TEXT PRIMARY KEY, record TEXT NOT NULL, expires_at REAL NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS room_budgets_expiry ON room_budgets (expires_at)",
    """CREATE TABLE IF NOT EXISTS turns_seen (
        message_key TEXT PRIMARY KEY, count INTEGER NOT NULL, expires_at REAL NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS turns_seen_expiry ON turns_seen (expires_at)",
    "CREATE TABLE IF NOT EXISTS claims (key TEXT PRIMARY KEY, expires_at REAL NOT NULL)",
    "CREATE INDEX IF NOT EXISTS claims_expiry ON claims (expires_at)",
    # Dedupe receipts (gateway/state/receipts.py): owner is the store instance that took
    # the delivery, confirmed 0 while its turn is in flight.
    """CREATE TABLE IF NOT EXISTS receipts (
        key TEXT PRIMARY KEY, owner TEXT NOT NULL, confirmed INTEGER NOT NULL,
        expires_at REAL NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS receipts_expiry ON receipts (expires_at)",
    """CREATE TABLE IF NOT EXISTS overrides (
        scope TEXT NOT NULL, field TEXT NOT NULL, value TEXT NOT NULL,
        PRIMARY KEY (scope, field))""",
    # Where connectors resume reading their platform (a Matrix sync token).
    "CREATE TABLE IF NOT EXISTS cursors (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    # until: NULL pauses until resumed.
    "CREATE TABLE IF NOT EXISTS pauses (scope TEXT PRIMARY KEY, until REAL)",
    """CREATE TABLE IF NOT EXISTS audit (
        id INTEGER PRIMARY KEY AUTOINCREMENT, at REAL NOT NULL, platform TEXT NOT NULL,
        room TEXT NOT NULL, user_id TEXT NOT NULL, user_name TEXT NOT NULL,
        command TEXT NOT NULL, allowed INTEGER NOT NULL, outcome TEXT NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS audit_room ON audit (room, id)",
    # The `others` log (gateway/state/audit.py), bounded overall and per sender.
    """CREATE TABLE IF NOT EXISTS audit_others (
        id INTEGER PRIMARY KEY AUTOINCREMENT, at REAL NOT NULL, platform TEXT NOT NULL,
        room TEXT NOT NULL, user_id TEXT NOT NULL, user_name TEXT NOT NULL,
        command TEXT NOT NULL, allowed INTEGER NOT NULL, outcome TEXT NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS audit_others_sender ON audit_others (platform, user_id, id)",
    # A transcript's messages (entry: `transcripts.encode`), oldest first by id.
    """CREATE TABLE IF NOT EXISTS transcript (
        id INTEGER PRIMARY KEY AUTOINCREMENT, scope TEXT NOT NULL, key TEXT NOT NULL,
        entry TEXT NOT NULL, UNIQUE (scope, key))""",
    "CREATE INDEX IF NOT EXISTS transcript_scope ON transcript (scope, id)",
    "CREATE TABLE IF NOT EXISTS transcripts (scope TEXT PRIMARY KEY, expires_at REAL NOT NULL)",
    "CREATE INDEX IF NOT EXISTS transcripts_expiry ON transcripts (expires_at)",
)

_AUDIT_COLUMNS = "at, platform, room, user_id, user_name, command, allowed, outcome"
_AUDIT_VALUES = "VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
# Expired rows removed per call that may have added one: twice the rate they appear, so
# n idle rows are gone within about n/2 calls.
_SWEEP_PER_CALL = 2
# How long a message's bot-turn count is remembered for the other hosted bots that see
# it; they see it within moments, so ten minutes is plenty.
_TURNS_SEEN_SECONDS = 600.0


class SqliteStateStore:
    """A StateStore in one SQLite file: WAL, a transaction per decision."""

    def __init__(
        self,
        path: str | os.PathLike[str] = "loopwarden.sqlite3",
        *,
        clock: Callable[[], float] | None = None,
        audit_keep: int = 10_000,
        busy_timeout: float = 5.0,
    ) -> None:
        if audit_keep < 1:
            raise ValueError(f"audit_keep must be 1 or more, got {audit_keep!r}")
        self._audit_keep = audit_keep
        self._owner = receipts.new_owner()
        self._sqlite = SqliteDb(
            path,
            name="sqlite state store",
            thread_name="lw-sqlite",
            create_schema=_create_schema,
            clock=clock or time.time,
            busy_timeout=busy_timeout,
        )

    @property
    def path(self) -> str:
        """The database file."""
        return self._sqlite.path

    async def start(self) -> None:
        """Open the file (creating its directory and schema) on the store's own thread."""
        await self._sqlite.start()

    async def aclose(self) -> None:
        """Close the connection and stop the thread."""
        await self._sqlite.aclose()

    async def pair_decide(
        self, *, scope: str, self_bot_id: str, sender_bot_id: str, policy: BotLoopPolicy
    ) -> PairDecision:
        """Load the pair's record, step it and save it, in one transaction."""
        if not policy.enabled:
            # Admitted and not recorded: `step_pair` needs no record, so no transaction.
            return step_pair(None, policy, 0.0)[1]
        a, b = pair_key(self_bot_id, sender_bot_id)
        return await self._sqlite.write(lambda db, now: _step(db, now, (scope, a, b), policy))

    async def pair_reset(self, *, scope: str | None = None, bot_id: str | None = None) -> int:
        """Drop the pairs held (all, one room's, one bot's); idle ones are not counted."""

        def reset(db: sqlite3.Connection, now: float) -> int:
            db.execute("DELETE FROM pairs WHERE expires_at <= ?", (now,))
            where, params = _pair_filter(scope, bot_id)
            return db.execute(f"DELETE FROM pairs{where}", params).rowcount

        return await self._sqlite.write(reset)

    async def pair_snapshot(self, scope: str | None = None) -> list[PairSnapshot]:
        """Live pairs (an event counting or a cooldown running), ordered by room and ids."""

        def snapshot(db: sqlite3.Connection, now: float) -> list[PairSnapshot]:
            where, params = _pair_filter(scope, None)
            rows = db.execute(
                "SELECT scope, bot_a, bot_b, times, cooldown_until, window_seconds, expires_at "
                f"FROM pairs{where} ORDER BY scope, bot_a, bot_b",
                params,
            ).fetchall()
            found = []
            for room, a, b, *record in rows:
                view = pair_view(_record(*record), now)
                if view is not None:
                    found.append(
                        PairSnapshot(room, a, b, count=view[0], cooldown_remaining=view[1])
                    )
            return found

        return await self._sqlite.read(snapshot)

    async def room_decide(
        self, *, scope: str, bot: str, message_key: str | None, policy: BotLoopPolicy
    ) -> RoomDecision:
        """Load the room's budget record, step it and save it, in one transaction."""
        if not room_budget_on(policy):
            return step_room(None, policy, 0.0, bot=bot, key="")[1]
        key = message_key or ""
        return await self._sqlite.write(
            lambda db, now: _step_room(db, now, scope, policy, bot=bot, key=key)
        )

    async def room_reset(self, scope: str | None = None) -> int:
        """Drop the room budget of one room or of all; idle ones are not counted."""

        def reset(db: sqlite3.Connection, now: float) -> int:
            db.execute("DELETE FROM room_budgets WHERE expires_at <= ?", (now,))
            if scope is None:
                return db.execute("DELETE FROM room_budgets").rowcount
            return db.execute("DELETE FROM room_budgets WHERE scope = ?", (scope,)).rowcount

        return await self._sqlite.write(reset)

    async def bot_turn(self, scope: str, *, is_bot: bool, message_key: str | None = None) -> int:
        """Count consecutive bot turns; a human resets; a message key counts once."""

        def turn(db: sqlite3.Connection, now: float) -> int:
            if message_key is not None:
                seen = db.execute(
                    "SELECT count FROM turns_seen WHERE message_key = ? AND expires_at > ?",
                    (message_key, now),
                ).fetchone()
                if seen is not None:
                    return int(seen[0])
            held = db.execute("SELECT count FROM bot_turns WHERE scope = ?", (scope,)).fetchone()
            count = step_bot_turns(0 if held is None else int(held[0]), is_bot=is_bot)
            if count:
                db.execute(
                    "INSERT OR REPLACE INTO bot_turns (scope, count) VALUES (?, ?)", (scope, count)
                )
            else:
                db.execute("DELETE FROM bot_turns WHERE scope = ?", (scope,))
            if message_key is not None:
                _sweep(db, "turns_seen", now)
                db.execute(
                    "INSERT OR REPLACE INTO turns_seen (message_key, count, expires_at) "
                    "VALUES (?, ?, ?)",
                    (message_key, count, now + _TURNS_SEEN_SECONDS),
                )
            return count

        return await self._sqlite.write(turn)

    async def bot_turns_peek(self, scope: str) -> int:
        """The room's count, read without a write transaction."""

        def peek(db: sqlite3.Connection, now: float) -> int:
            held = db.execute("SELECT count FROM bot_turns WHERE scope = ?", (scope,)).fetchone()
            return 0 if held is None else int(held[0])

        return await self._sqlite.read(peek)

    async def claim(self, key: str, ttl: float) -> bool:
        """First claimant wins until the TTL runs out."""

        def claim(db: sqlite3.Connection, now: float) -> bool:
            held = db.execute(
                "SELECT 1 FROM claims WHERE key = ? AND expires_at > ?", (key, now)
            ).fetchone()
            if held is not None:
                return False
            _sweep(db, "claims", now)
            db.execute(
                "INSERT OR REPLACE INTO claims (key, expires_at) VALUES (?, ?)", (key, now + ttl)
            )
            return True

        return await self._sqlite.write(claim)

    async def receive(self, key: str, ttl: float) -> bool:
        """Take the receipt in flight unless it is held; another owner is a previous run."""
        owner = self._owner

        def take(db: sqlite3.Connection, now: float) -> bool:
            row = db.execute(
                "SELECT owner, confirmed, expires_at FROM receipts WHERE key = ?", (key,)
            ).fetchone()
            held = None if row is None else Receipt(row[0], bool(row[1]), row[2])
            taken = receipts.receive(held, owner=owner, owner_alive=False, now=now, ttl=ttl)
            if taken is None:
                return False
            if row is None:
                _sweep(db, "receipts", now)
            _store_receipt(db, key, taken)
            return True

        return await self._sqlite.write(take)

    async def confirm(self, key: str, ttl: float) -> None:
        """Mark the receipt answered for `ttl` seconds from now."""
        owner = self._owner
        await self._sqlite.write(
            lambda db, now: _store_receipt(
                db, key, Receipt(owner, confirmed=True, expires_at=now + ttl)
            )
        )

    async def get_overrides(self, scope: str) -> Mapping[str, object]:
        """The scope's overrides, decoded from JSON."""

        def overrides(db: sqlite3.Connection, now: float) -> dict[str, object]:
            rows = db.execute("SELECT field, value FROM overrides WHERE scope = ?", (scope,))
            return {field: json.loads(value) for field, value in rows}

        return await self._sqlite.read(overrides)

    async def set_override(self, scope: str, field: str, value: object) -> None:
        """Store one override as JSON."""
        encoded = json.dumps(value)
        await self._sqlite.write(
            lambda db, now: db.execute(
                "INSERT OR REPLACE INTO overrides (scope, field, value) VALUES (?, ?, ?)",
                (scope, field, encoded),
            )
        )

    async def clear_overrides(self, scope: str) -> None:
        """Drop a scope's overrides."""
        await self._sqlite.write(
            lambda db, now: db.execute("DELETE FROM overrides WHERE scope = ?", (scope,))
        )

    async def cursor_get(self, key: str) -> str | None:
        """The position saved under `key`."""

        def cursor(db: sqlite3.Connection, now: float) -> str | None:
            row = db.execute("SELECT value FROM cursors WHERE key = ?", (key,)).fetchone()
            return None if row is None else str(row[0])

        return await self._sqlite.read(cursor)

    async def cursor_set(self, key: str, value: str) -> None:
        """Save a position (one row per key)."""
        await self._sqlite.write(
            lambda db, now: db.execute(
                "INSERT OR REPLACE INTO cursors (key, value) VALUES (?, ?)", (key, value)
            )
        )

    async def pause(self, scope: str, seconds: float | None) -> None:
        """Pause until now + seconds (an absolute wall-clock instant), or until resumed."""
        await self._sqlite.write(
            lambda db, now: db.execute(
                "INSERT OR REPLACE INTO pauses (scope, until) VALUES (?, ?)",
                (scope, None if seconds is None else now + seconds),
            )
        )

    async def resume(self, scope: str) -> None:
        """Lift the pause."""
        await self._sqlite.write(
            lambda db, now: db.execute("DELETE FROM pauses WHERE scope = ?", (scope,))
        )

    async def pause_remaining(self, scope: str) -> float | None:
        """Seconds left, `inf` when indefinite, None when not paused (a run-out pause goes)."""

        def remaining(db: sqlite3.Connection, now: float) -> float | None:
            row = db.execute("SELECT until FROM pauses WHERE scope = ?", (scope,)).fetchone()
            if row is None:
                return None
            if row[0] is None:
                return math.inf
            left: float = row[0] - now
            if left > 0:
                return left
            with transaction(db):
                db.execute(
                    "DELETE FROM pauses WHERE scope = ? AND until IS NOT NULL AND until <= ?",
                    (scope, now),
                )
            return None

        return await self._sqlite.read(remaining)

    async def audit(self, entry: AuditEntry) -> None:
        """Append one entry to its log: `audit` keeps `audit_keep`, `audit_others` its bounds."""
        keep = self._audit_keep
        row = (
            entry.at,
            entry.platform,
            entry.room,
            entry.user_id,
            entry.user_name,
            entry.command,
            int(entry.allowed),
            entry.outcome,
        )

        def append(db: sqlite3.Connection, now: float) -> None:
            newest = db.execute(
                f"INSERT INTO audit ({_AUDIT_COLUMNS}) {_AUDIT_VALUES}", row
            ).lastrowid
            if newest is not None:
                db.execute("DELETE FROM audit WHERE id <= ?", (newest - keep,))

        def append_other(db: sqlite3.Connection, now: float) -> None:
            db.execute(f"INSERT INTO audit_others ({_AUDIT_COLUMNS}) {_AUDIT_VALUES}", row)
            # By count, not id: a sender's own deletions leave gaps in the ids.
            db.execute(
                "DELETE FROM audit_others WHERE id IN (SELECT id FROM audit_others "
                "WHERE platform = ? AND user_id = ? ORDER BY id DESC LIMIT -1 OFFSET ?)",
                (*audit.sender(entry), audit.OTHERS_PER_SENDER),
            )
            db.execute(
                "DELETE FROM audit_others WHERE id IN "
                "(SELECT id FROM audit_others ORDER BY id DESC LIMIT -1 OFFSET ?)",
                (audit.OTHERS_KEEP,),
            )

        await self._sqlite.write(append if entry.kind == "admin" else append_other)

    async def recent_audit(
        self, limit: int = 20, scope: str | None = None, kind: AuditKind | None = None
    ) -> list[AuditEntry]:
        """Newest first, optionally for one room, of one log or both."""
        where, params = ("", (limit,)) if scope is None else (" WHERE room = ?", (scope, limit))

        def newest(db: sqlite3.Connection, table: str, of: AuditKind) -> list[AuditEntry]:
            rows = db.execute(
                f"SELECT {_AUDIT_COLUMNS} FROM {table}{where} ORDER BY id DESC LIMIT ?", params
            )
            return [
                AuditEntry(at, platform, room, user_id, name, command, bool(allowed), outcome, of)
                for at, platform, room, user_id, name, command, allowed, outcome in rows
            ]

        def recent(db: sqlite3.Connection, now: float) -> list[AuditEntry]:
            admin = newest(db, "audit", "admin") if kind != "others" else []
            others = newest(db, "audit_others", "others") if kind != "admin" else []
            return audit.newest_first(admin, others, limit)

        return await self._sqlite.read(recent)

    async def transcript_append(
        self, scope: str, entry: TranscriptEntry, *, max_messages: int, ttl: float
    ) -> bool:
        """Insert once per key, trim to `max_messages`, expire `ttl` from now: one transaction."""
        stored = transcripts.bounded(entry)
        encoded = transcripts.encode(stored)

        def append(db: sqlite3.Connection, now: float) -> bool:
            held = db.execute(
                "SELECT expires_at FROM transcripts WHERE scope = ?", (scope,)
            ).fetchone()
            if held is None:
                _sweep_transcripts(db, now)
            elif held[0] <= now:
                db.execute("DELETE FROM transcript WHERE scope = ?", (scope,))
            added = db.execute(
                "INSERT OR IGNORE INTO transcript (scope, key, entry) VALUES (?, ?, ?)",
                (scope, stored.key, encoded),
            ).rowcount
            if not added:
                return False
            db.execute(
                "INSERT OR REPLACE INTO transcripts (scope, expires_at) VALUES (?, ?)",
                (scope, now + ttl),
            )
            db.execute(
                "DELETE FROM transcript WHERE scope = ? AND id <= (SELECT id FROM transcript "
                "WHERE scope = ? ORDER BY id DESC LIMIT 1 OFFSET ?)",
                (scope, scope, max_messages),
            )
            return True

        return await self._sqlite.write(append)

    async def transcript_recent(self, scope: str, limit: int) -> Transcript:
        """The newest `limit` rows, oldest first; a row that cannot be read is skipped."""

        def recent(db: sqlite3.Connection, now: float) -> Transcript:
            held = db.execute(
                "SELECT expires_at FROM transcripts WHERE scope = ?", (scope,)
            ).fetchone()
            if held is None or held[0] <= now or limit <= 0:
                return Transcript()
            # As bytes: a row that is not UTF-8 must not fail the whole query.
            rows = db.execute(
                "SELECT CAST(entry AS BLOB) FROM transcript WHERE scope = ? "
                "ORDER BY id DESC LIMIT ?",
                (scope, limit),
            ).fetchall()
            return Transcript(*transcripts.decode_many([row[0] for row in reversed(rows)]))

        return await self._sqlite.read(recent)

    async def transcript_forget(self, scope: str, *, threads: bool = False) -> int:
        """Delete the transcript's rows (and, with `threads`, its threads')."""
        prefix = scope + transcripts.SEP

        def forget(db: sqlite3.Connection, now: float) -> int:
            where = "scope = ?" + (" OR substr(scope, 1, ?) = ?" if threads else "")
            params: tuple[object, ...] = (scope, len(prefix), prefix) if threads else (scope,)
            db.execute(f"DELETE FROM transcripts WHERE {where}", params)
            return db.execute(f"DELETE FROM transcript WHERE {where}", params).rowcount

        return await self._sqlite.write(forget)

    async def activity_append(self, events: Sequence[ActivityEvent]) -> None:
        """Insert and count the batch, and apply retention, in one transaction."""
        if events:
            await self._sqlite.write(lambda db, now: sqlite_activity.append(db, now, events))

    async def activity_since(
        self, cursor: int | None, limit: int, room: str | None = None
    ) -> tuple[list[ActivityEvent], int | None]:
        """Events after `cursor`, oldest first, and the next cursor."""
        return await self._sqlite.read(
            lambda db, now: sqlite_activity.since(db, cursor, limit, room)
        )

    async def activity_series(
        self, span: Span, now: float, room: str | None = None
    ) -> list[ActivityBucket]:
        """The chart's buckets, oldest first."""
        return await self._sqlite.read(lambda db, _: sqlite_activity.series(db, span, now, room))

    async def activity_rooms(self) -> list[tuple[str, float]]:
        """Rooms seen, newest first."""
        return await self._sqlite.read(lambda db, now: sqlite_activity.rooms(db))


def _sweep_transcripts(db: sqlite3.Connection, now: float) -> None:
    """Delete a few expired transcripts, their rows with them."""
    for (scope,) in db.execute(
        "SELECT scope FROM transcripts WHERE expires_at <= ? LIMIT ?", (now, _SWEEP_PER_CALL)
    ).fetchall():
        db.execute("DELETE FROM transcript WHERE scope = ?", (scope,))
        db.execute("DELETE FROM transcripts WHERE scope = ?", (scope,))


def _create_schema(db: sqlite3.Connection, path: str) -> None:
    """Create the tables of this schema version (a newer file is refused, not downgraded).

    An older file keeps its rows, except the pairs of schemas before 3: they hold when
    events stop counting, not when they happened, so they cannot become `PairRecord`s.
    """
    version = db.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise StateError(
            f"{path} was written by a newer loopwarden "
            f"(schema {version}, this one knows {SCHEMA_VERSION})"
        )
    if version < _PAIR_RECORD_SCHEMA:
        db.execute("DROP TABLE IF EXISTS pairs")
    for statement in (*_SCHEMA, *sqlite_activity.SCHEMA):
        db.execute(statement)
    db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")


def _store_receipt(db: sqlite3.Connection, key: str, receipt: Receipt) -> None:
    """Insert or replace one receipt row."""
    db.execute(
        "INSERT OR REPLACE INTO receipts (key, owner, confirmed, expires_at) VALUES (?, ?, ?, ?)",
        (key, receipt.owner, int(receipt.confirmed), receipt.expires_at),
    )


def _sweep(db: sqlite3.Connection, table: str, now: float) -> None:
    """Delete a few expired rows of a table that has an `expires_at` index."""
    db.execute(
        f"DELETE FROM {table} WHERE rowid IN "
        f"(SELECT rowid FROM {table} WHERE expires_at <= ? LIMIT ?)",
        (now, _SWEEP_PER_CALL),
    )


def _pair_filter(scope: str | None, bot_id: str | None) -> tuple[str, tuple[str, ...]]:
    """A WHERE clause (with its parameters) selecting one room's and/or one bot's pairs."""
    clauses: list[str] = []
    params: tuple[str, ...] = ()
    if scope is not None:
        clauses.append("scope = ?")
        params += (scope,)
    if bot_id is not None:
        clauses.append("(bot_a = ? OR bot_b = ?)")
        params += (bot_id, bot_id)
    return (" WHERE " + " AND ".join(clauses) if clauses else ""), params


def _record(times: str, cooldown_until: float | None, window: float, idle_at: float) -> PairRecord:
    """The `PairRecord` a pairs row holds."""
    return PairRecord(json.loads(times), cooldown_until, window, idle_at)


def _step(
    db: sqlite3.Connection, now: float, key: tuple[str, str, str], policy: BotLoopPolicy
) -> PairDecision:
    """Load one pair's record, apply `step_pair` and save it (inside a transaction)."""
    row = db.execute(
        "SELECT times, cooldown_until, window_seconds, expires_at FROM pairs "
        "WHERE scope = ? AND bot_a = ? AND bot_b = ?",
        key,
    ).fetchone()
    record, decision = step_pair(None if row is None else _record(*row), policy, now)
    if record is not None:
        if row is None:
            _sweep(db, "pairs", now)
        db.execute(
            "INSERT OR REPLACE INTO pairs "
            "(scope, bot_a, bot_b, times, cooldown_until, window_seconds, expires_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                *key,
                json.dumps(list(record.times)),
                record.cooldown_until,
                record.window,
                record.idle_at,
            ),
        )
    return decision


def _step_room(
    db: sqlite3.Connection, now: float, scope: str, policy: BotLoopPolicy, *, bot: str, key: str
) -> RoomDecision:
    """Load one room's budget record, apply `step_room` and save it (inside a transaction)."""
    row = db.execute(
        "SELECT record, expires_at FROM room_budgets WHERE scope = ?", (scope,)
    ).fetchone()
    held = None if row is None else _room_record(*row)
    record, decision = step_room(held, policy, now, bot=bot, key=key)
    if record is not None:
        if row is None:
            _sweep(db, "room_budgets", now)
        stored = json.dumps(
            [record.times, record.bots, record.keys, record.cooldown_until, record.window]
        )
        db.execute(
            "INSERT OR REPLACE INTO room_budgets (scope, record, expires_at) VALUES (?, ?, ?)",
            (scope, stored, record.idle_at),
        )
    return decision


def _room_record(stored: str, idle_at: float) -> RoomRecord:
    """The `RoomRecord` a room_budgets row holds (its idle_at is the row's expiry)."""
    times, bots, keys, cooldown_until, window = json.loads(stored)
    return RoomRecord(times, bots, keys, cooldown_until, window, idle_at)
