"""SQLite call store: circuits, pauses, rule windows and the request log survive a restart.

The tables live in the state file (`state.path`) next to the StateStore's, prefixed
`call_`, with their own schema version (`call_meta`), so neither store's migrations touch
the other's tables. As for the StateStore, the file runs in WAL mode with one connection
owned by one worker thread (gateway/state/sqlite_db.py), and every decision is one
`BEGIN IMMEDIATE` transaction that reads the clock once it holds the write lock, so
decisions are serialised in time order, also between processes sharing the file (a proxy
and the `loopwarden circuits` command, say).

Decisions where DESIGN.md is silent:
- Time is wall-clock (`time.time()`, injectable), stored as absolute instants, so a pause
  opened before a restart has the right time left after it.
- Counted calls are rows `(key, at)`; the window of the current policy decides which
  still count, so a changed `window_seconds` applies to calls already counted. Rows that
  left their window are swept a few per decision, never by a scan.
- The request log keeps the newest `log_keep` entries (one indexed DELETE per append).
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import time
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import cast

from gateway.calls.store import LOG_KEEP, OUTCOMES, CallLogEntry, CallOutcome
from gateway.calls.verdicts import (
    NEVER,
    Hold,
    RuleKey,
    allowed_verdict,
    call_identity,
    duplicate_verdict,
    loop_verdict,
    pause_hold,
    paused_verdict,
    receipt_to_uncount,
    reopen_hold,
    reopen_window,
    rule_group,
    rule_key,
    rules_by_name,
)
from gateway.errors import StateError
from gateway.state.sqlite_db import SqliteDb
from guards.call_loop import CallDecision, CallLoopPolicy, PausedCircuit, UniquenessRule

SCHEMA_VERSION = 1
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS call_meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL)",
    # A pause and/or fresh start of a circuit or rule group; fresh_from NULL: never reopened.
    """CREATE TABLE IF NOT EXISTS call_holds (
        key TEXT PRIMARY KEY, paused_until REAL NOT NULL, fresh_from REAL,
        expires_at REAL NOT NULL, reason TEXT NOT NULL, rule TEXT, count INTEGER NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS call_holds_expiry ON call_holds (expires_at)",
    # One counted call of a circuit (key "c␟circuit␟identity") or rule ("r␟rule␟values").
    """CREATE TABLE IF NOT EXISTS call_events (
        id INTEGER PRIMARY KEY, key TEXT NOT NULL, at REAL NOT NULL, expires_at REAL NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS call_events_key ON call_events (key, at)",
    "CREATE INDEX IF NOT EXISTS call_events_expiry ON call_events (expires_at)",
    """CREATE TABLE IF NOT EXISTS call_log (
        id INTEGER PRIMARY KEY AUTOINCREMENT, at REAL NOT NULL, provider TEXT NOT NULL,
        agent TEXT NOT NULL, session TEXT NOT NULL, circuit TEXT NOT NULL, model TEXT NOT NULL,
        outcome TEXT NOT NULL, status INTEGER, input_tokens INTEGER, output_tokens INTEGER,
        cost REAL, estimated INTEGER NOT NULL, fingerprint TEXT NOT NULL, rule TEXT,
        retry INTEGER NOT NULL, duration_ms REAL NOT NULL, fields TEXT NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS call_log_at ON call_log (at)",
)
_LOG_COLUMNS = (
    "at, provider, agent, session, circuit, model, outcome, status, input_tokens, "
    "output_tokens, cost, estimated, fingerprint, rule, retry, duration_ms, fields"
)
_SEP = "\x1f"
# Expired rows removed per decision: more than a decision adds, so idle rows go quickly.
_SWEEP_PER_CALL = 4


class SqliteCallStore:
    """A CallStore in the SQLite state file: one writer thread, a transaction per decision."""

    def __init__(
        self,
        path: str | os.PathLike[str] = "loopwarden.sqlite3",
        policy: CallLoopPolicy | None = None,
        rules: Iterable[UniquenessRule] = (),
        *,
        clock: Callable[[], float] | None = None,
        wall_clock: Callable[[], float] = time.time,
        log_keep: int = LOG_KEEP,
        busy_timeout: float = 5.0,
    ) -> None:
        if log_keep < 1:
            raise ValueError(f"log_keep must be 1 or more, got {log_keep!r}")
        self._policy = policy or CallLoopPolicy()
        self._rules = rules_by_name(rules)
        self._wall_clock = wall_clock
        self._log_keep = log_keep
        self._sqlite = SqliteDb(
            path,
            name="sqlite call store",
            thread_name="lw-calls",
            create_schema=_create_schema,
            clock=clock or time.time,
            busy_timeout=busy_timeout,
        )

    async def start(self) -> None:
        """Open the file (creating its directory and tables) on the store's own thread."""
        await self._sqlite.start()

    async def aclose(self) -> None:
        """Close the connection and stop the thread."""
        await self._sqlite.aclose()

    async def decide(
        self, circuit: str, fingerprint: str, fields: Mapping[str, str] = MappingProxyType({})
    ) -> CallDecision:
        """Decide one call and count it when allowed, in one transaction."""
        return await self._sqlite.write(
            lambda db, now: self._decide(db, now, circuit, fingerprint, fields)
        )

    def _decide(
        self,
        db: sqlite3.Connection,
        now: float,
        circuit: str,
        fingerprint: str,
        fields: Mapping[str, str],
    ) -> CallDecision:
        """CallLoopGuard.check on the stored state (inside a transaction)."""
        _sweep(db, now)
        hold = _hold(db, circuit, now)
        if hold is not None and hold.paused_until > now:
            return paused_verdict(circuit, hold.paused_until - now, _bump(db, circuit), None)
        keyed: list[tuple[UniquenessRule, RuleKey, str, Hold | None]] = []
        for rule in self._rules.values():
            key = rule_key(rule, fingerprint, fields)
            if key is None:
                continue
            group = rule_group(rule, key)
            group_hold = _hold(db, group, now)
            if group_hold is not None and group_hold.paused_until > now:
                remaining = group_hold.paused_until - now
                return paused_verdict(circuit, remaining, _bump(db, group), group_hold.rule)
            keyed.append((rule, key, group, group_hold))
        policy = self._policy
        identity = call_identity(fingerprint, fields)
        call = _call_key(circuit, identity)
        floor = NEVER if hold is None else hold.fresh_from
        repeats = len(_live(db, call, now, policy.window_seconds, floor))
        if repeats >= policy.max_repeats:
            pause = policy.pause_seconds
            _put_hold(db, circuit, pause_hold(hold, now, pause, reason="loop_detected", rule=None))
            return loop_verdict(circuit, repeats + 1, pause)
        for rule, key, group, group_hold in keyed:
            floor = NEVER if group_hold is None else group_hold.fresh_from
            times = _live(db, _rule_key(rule.name, key), now, rule.window_seconds, floor)
            if len(times) < rule.max_calls:
                continue
            if rule.action == "pause":
                pause = policy.pause_seconds
                reason = f"rule:{rule.name}"
                _put_hold(
                    db, group, pause_hold(group_hold, now, pause, reason=reason, rule=rule.name)
                )
                return duplicate_verdict(circuit, rule, len(times) + 1, pause)
            return duplicate_verdict(
                circuit, rule, len(times) + 1, times[0] + rule.window_seconds - now
            )
        _add(db, call, now, policy.window_seconds)
        for rule, key, _, _ in keyed:
            _add(db, _rule_key(rule.name, key), now, rule.window_seconds)
        rule_keys = tuple((rule.name, key) for rule, key, _, _ in keyed)
        return allowed_verdict(circuit, identity, repeats + 1, now, rule_keys)

    async def record_outcome(
        self, decision: CallDecision, status: int | None = None, error: str | None = None
    ) -> bool:
        """Uncount an allowed call the provider failed; other outcomes stay counted."""
        receipt = receipt_to_uncount(decision, status, error)
        if receipt is None:
            return False

        def uncount(db: sqlite3.Connection, now: float) -> bool:
            removed = _discard(db, _call_key(*receipt.call), receipt.at)
            for name, key in receipt.rule_keys:
                _discard(db, _rule_key(name, key), receipt.at)
            return removed

        return await self._sqlite.write(uncount)

    async def reopen(self, circuit: str) -> bool:
        """Lift a pause (circuit or rule group) and forget the counts before now."""
        window = reopen_window(self._policy, self._rules, circuit)

        def reopen(db: sqlite3.Connection, now: float) -> bool:
            hold = _hold(db, circuit, now)
            _put_hold(db, circuit, reopen_hold(hold, now, window))
            return hold is not None and hold.paused_until > now

        return await self._sqlite.write(reopen)

    async def paused(self) -> list[PausedCircuit]:
        """The circuits and rule groups paused now, by key."""

        def paused(db: sqlite3.Connection, now: float) -> list[PausedCircuit]:
            rows = db.execute(
                "SELECT key, paused_until, reason, count FROM call_holds "
                "WHERE paused_until > ? ORDER BY key",
                (now,),
            )
            return [
                PausedCircuit(circuit=key, remaining=until - now, reason=reason, count=count)
                for key, until, reason, count in rows
            ]

        return await self._sqlite.write(paused)

    async def log_call(self, entry: CallLogEntry) -> None:
        """Append one entry; the oldest beyond `log_keep` go."""
        keep = self._log_keep
        row = (
            entry.at,
            entry.provider,
            entry.agent,
            entry.session,
            entry.circuit,
            entry.model,
            entry.outcome,
            entry.status,
            entry.input_tokens,
            entry.output_tokens,
            entry.cost,
            int(entry.estimated),
            entry.fingerprint,
            entry.rule,
            entry.retry,
            entry.duration_ms,
            json.dumps(dict(entry.fields), sort_keys=True),
        )

        def append(db: sqlite3.Connection, now: float) -> None:
            newest = db.execute(
                f"INSERT INTO call_log ({_LOG_COLUMNS}) VALUES ({', '.join('?' * len(row))})",
                row,
            ).lastrowid
            if newest is not None and newest > keep:
                db.execute("DELETE FROM call_log WHERE id <= ?", (newest - keep,))

        await self._sqlite.write(append)

    async def calls_since(self, seconds: float) -> list[CallLogEntry]:
        """Entries at or after now - seconds, oldest first."""
        cutoff = self._wall_clock() - seconds

        def since(db: sqlite3.Connection, now: float) -> list[CallLogEntry]:
            rows = db.execute(
                f"SELECT {_LOG_COLUMNS} FROM call_log WHERE at >= ? ORDER BY at, id", (cutoff,)
            )
            return [_entry(row) for row in rows]

        return await self._sqlite.write(since)


def _entry(row: tuple[object, ...]) -> CallLogEntry:
    """A log entry from its row (columns in `_LOG_COLUMNS` order)."""
    (at, provider, agent, session, circuit, model, outcome, status, tokens_in, tokens_out) = row[
        :10
    ]
    cost, estimated, fingerprint, rule, retry, duration_ms, fields = row[10:]
    fields_map = json.loads(str(fields))
    return CallLogEntry(
        at=float(cast(float, at)),
        provider=str(provider),
        agent=str(agent),
        session=str(session),
        circuit=str(circuit),
        model=str(model),
        outcome=_outcome(str(outcome)),
        status=cast(int | None, status),
        input_tokens=cast(int | None, tokens_in),
        output_tokens=cast(int | None, tokens_out),
        cost=cast(float | None, cost),
        estimated=bool(estimated),
        fingerprint=str(fingerprint),
        rule=cast(str | None, rule),
        retry=int(cast(int, retry)),
        duration_ms=float(cast(float, duration_ms)),
        fields=MappingProxyType({str(k): str(v) for k, v in fields_map.items()}),
    )


def _outcome(text: str) -> CallOutcome:
    """A stored outcome, checked against the known ones."""
    for outcome in OUTCOMES:
        if outcome == text:
            return outcome
    raise StateError(f"the call log holds an unknown outcome {text!r}")


def _create_schema(db: sqlite3.Connection, path: str) -> None:
    """Create the call tables (a newer schema is refused, not downgraded)."""
    for statement in _SCHEMA:
        db.execute(statement)
    row = db.execute("SELECT value FROM call_meta WHERE name = 'schema'").fetchone()
    if row is not None and row[0] > SCHEMA_VERSION:
        raise StateError(
            f"{path} holds call tables of a newer loopwarden "
            f"(schema {row[0]}, this one knows {SCHEMA_VERSION})"
        )
    db.execute(
        "INSERT OR REPLACE INTO call_meta (name, value) VALUES ('schema', ?)",
        (SCHEMA_VERSION,),
    )


def _call_key(circuit: str, identity: str) -> str:
    return f"c{_SEP}{circuit}{_SEP}{identity}"


def _rule_key(name: str, key: RuleKey) -> str:
    return _SEP.join(("r", name, *key))


def _sweep(db: sqlite3.Connection, now: float) -> None:
    """Delete a few counted calls and holds that no longer matter."""
    for table in ("call_events", "call_holds"):
        db.execute(
            f"DELETE FROM {table} WHERE rowid IN "
            f"(SELECT rowid FROM {table} WHERE expires_at <= ? LIMIT ?)",
            (now, _SWEEP_PER_CALL),
        )


def _hold(db: sqlite3.Connection, key: str, now: float) -> Hold | None:
    """The hold of a circuit or group, None when there is none (an expired one is deleted)."""
    row = db.execute(
        "SELECT paused_until, fresh_from, expires_at, reason, rule, count FROM call_holds "
        "WHERE key = ?",
        (key,),
    ).fetchone()
    if row is None:
        return None
    paused_until, fresh_from, expires_at, reason, rule, count = row
    if expires_at <= now:
        db.execute("DELETE FROM call_holds WHERE key = ?", (key,))
        return None
    fresh = NEVER if fresh_from is None else float(fresh_from)
    return Hold(float(paused_until), fresh, float(expires_at), str(reason), rule, int(count))


def _put_hold(db: sqlite3.Connection, key: str, hold: Hold) -> None:
    fresh = None if math.isinf(hold.fresh_from) else hold.fresh_from
    db.execute(
        "INSERT OR REPLACE INTO call_holds "
        "(key, paused_until, fresh_from, expires_at, reason, rule, count) "
        "VALUES (?, ?, ?, ?, ?, ?, ?)",
        (key, hold.paused_until, fresh, hold.expires_at, hold.reason, hold.rule, hold.count),
    )


def _bump(db: sqlite3.Connection, key: str) -> int:
    """Count one more refusal of a running pause; the new count."""
    row = db.execute(
        "UPDATE call_holds SET count = count + 1 WHERE key = ? RETURNING count", (key,)
    ).fetchone()
    return int(row[0])


def _live(db: sqlite3.Connection, key: str, now: float, window: float, floor: float) -> list[float]:
    """The times still counting (a call at t counts in [t, t + window), and not before floor)."""
    rows = db.execute(
        "SELECT id, at FROM call_events WHERE key = ? ORDER BY at, id", (key,)
    ).fetchall()
    dead = [event for event, at in rows if at + window <= now or at < floor]
    if dead:
        db.execute(f"DELETE FROM call_events WHERE id IN ({', '.join('?' * len(dead))})", dead)
    return [at for _, at in rows if not (at + window <= now or at < floor)]


def _add(db: sqlite3.Connection, key: str, now: float, window: float) -> None:
    db.execute(
        "INSERT INTO call_events (key, at, expires_at) VALUES (?, ?, ?)", (key, now, now + window)
    )


def _discard(db: sqlite3.Connection, key: str, at: float) -> bool:
    """Forget one counted call made at `at`, if it is still held."""
    return (
        db.execute(
            "DELETE FROM call_events WHERE id = "
            "(SELECT id FROM call_events WHERE key = ? AND at = ? LIMIT 1)",
            (key, at),
        ).rowcount
        > 0
    )
