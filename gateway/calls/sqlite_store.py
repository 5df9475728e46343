"""SQLite call store: circuits, pauses, rule windows and the request log survive a restart.

The tables live in the state file (`state.path`) next to the StateStore's, prefixed
`call_`, with their own schema version (`call_meta`), so neither store's migrations touch
the other's tables. As for the StateStore, the file runs in WAL mode through
gateway/state/sqlite_db.py (a decision runs on the event loop while the write lock is
free, on a worker thread while another process holds it), and every decision is one
`BEGIN IMMEDIATE` transaction that reads the clock once it holds the write lock, so
decisions are serialised in time order, also between processes sharing the file (a proxy
and the `loopwarden circuits` command, say).

Decisions where DESIGN.md is silent:
- Time is wall-clock (`time.time()`, injectable), stored as absolute instants, so a pause
  opened before a restart has the right time left after it.
- Every decision loads its record (`guards.call_loop.CallRecord`: the circuit's hold, the
  rule groups' holds, the counted calls of the call and of each rule key), steps it with
  `guards.call_loop.step_call` and saves what changed, so it answers exactly as
  CallLoopGuard does. Counted calls are one row per key (`call_windows`: the times,
  packed as little-endian doubles, and when the record goes idle); idle records and
  expired holds are swept a few at a time every eighth decision, never by a scan.
- Schema 2 replaced the per-call rows of schema 1 (`call_events`); an older file is
  upgraded in place and its counted calls are dropped (they last one window at most),
  its pauses kept.
- Schema 3 made the keyed tables of small rows WITHOUT ROWID: `call_holds` and
  `call_windows`, which every decision reads and writes, and the spend tables of
  `gateway.calls.budgets_sqlite` (`call_anomaly`'s rows grow, it keeps its rowid). The
  TEXT key is then the table's own b-tree key: a lookup walks one b-tree, not the key's
  index and then the table, and a new row writes one page fewer (a commit costs about
  the pages it writes: 3.5 WAL pages a decision before, 2.8 after). A file of schema 2
  (or 1) is upgraded in the schema transaction: each of these tables is renamed aside,
  created anew, its rows copied over (counted calls too: copying them needs no more
  code than dropping them) and the old one dropped; two processes opening the file at
  once upgrade it once (the transaction holds the write lock). Sweeps delete by primary
  key (these tables have no `rowid`). A loopwarden of schema 2 still running when the
  file is upgraded fails on its sweeps, and one started after is refused: stop the old
  processes first.
- The request log keeps the newest `log_keep` entries (one indexed DELETE per append of
  a batch, `log_calls`). Its ids are a plain INTEGER PRIMARY KEY, not AUTOINCREMENT:
  the newest row is never deleted, so ids still grow, without a `sqlite_sequence` page
  written per append (files made before keep AUTOINCREMENT, which works the same).
  Listing it (`calls_since`) and the pauses (`paused`) are reads: they never wait for
  another process's write lock; so are the Calls page's queries, asked in SQL over the
  indexes of `gateway.calls.query_sqlite`.
- Budget holds have owners (`gateway.calls.owners`): each store instance renews its
  lease in the file while it runs and gives back the holds of owners whose lease lapsed
  (a SIGKILLed proxy's calls in flight), in `call_spend_owners` and `call_spend_owned`
  (issue 20; created IF NOT EXISTS like the budgets' tables, no schema bump).
- Budgets (`gateway.calls.budgets_sqlite`) and the anomaly detector
  (`gateway.calls.anomaly_sqlite`) added their tables to schema 2 with
  `CREATE TABLE IF NOT EXISTS`: an older loopwarden reading the file ignores them. An
  agent's anomaly pause is a row of `call_holds` like a circuit's.
"""

from __future__ import annotations

import math
import os
import sqlite3
import struct
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType

from gateway.app.errors import StateError
from gateway.calls import anomaly_sqlite, budgets_sqlite, codec, query_sqlite
from gateway.calls.anomaly import AnomalyCharge, anomaly_pause, step_agent_hold, step_anomaly
from gateway.calls.budgets import (
    ADMITTED_FREE,
    Amount,
    GroupSpend,
    Limits,
    SpendAlert,
    SpendEvent,
    SpendHold,
    step_charge,
    step_release,
    step_spend,
)
from gateway.calls.entry import CallLogEntry
from gateway.calls.owners import OwnerLease
from gateway.calls.query import CallFilter, CallPage, CallTotals, CostBucket, Cursor, page_of
from gateway.calls.store import ENFORCED, LOG_KEEP, Admission, Settled, ShadowGuards
from gateway.calls.verdicts import receipt_to_uncount
from gateway.state.receipts import new_owner
from gateway.state.sqlite_db import SqliteDb
from guards.call_loop import (
    NEVER,
    CallDecision,
    CallEvent,
    CallLoopPolicy,
    CallRecord,
    CountedCalls,
    Hold,
    PausedCircuit,
    RuleKey,
    UniquenessRule,
    call_event,
    reopen_window,
    rule_group,
    rules_by_name,
    step_call,
    step_reopen,
    uncount,
)

SCHEMA_VERSION = 3
_META = "CREATE TABLE IF NOT EXISTS call_meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL)"
_SCHEMA = (
    # A pause and/or fresh start of a circuit or rule group; fresh_from NULL: never reopened.
    """CREATE TABLE IF NOT EXISTS call_holds (
        key TEXT PRIMARY KEY, paused_until REAL NOT NULL, fresh_from REAL,
        expires_at REAL NOT NULL, reason TEXT NOT NULL, rule TEXT, count INTEGER NOT NULL)
        WITHOUT ROWID""",
    "CREATE INDEX IF NOT EXISTS call_holds_expiry ON call_holds (expires_at)",
    # The counted calls of a circuit's call (key "c␟circuit␟identity") or of a rule key
    # ("r␟rule␟values"): their times, oldest first, and when the record goes idle.
    """CREATE TABLE IF NOT EXISTS call_windows (
        key TEXT PRIMARY KEY, times BLOB NOT NULL, idle_at REAL NOT NULL) WITHOUT ROWID""",
    "CREATE INDEX IF NOT EXISTS call_windows_idle ON call_windows (idle_at)",
    codec.LOG_TABLE,
    "CREATE INDEX IF NOT EXISTS call_log_at ON call_log (at)",
    *budgets_sqlite.SCHEMA,
    *anomaly_sqlite.SCHEMA,
    *query_sqlite.INDEXES,
)
_LOG_INSERT = (
    f"INSERT INTO call_log ({codec.LOG_COLUMNS}) VALUES ({', '.join('?' * len(codec.LOG_FIELDS))})"
)
_SEP = "\x1f"
# Expired rows are removed _SWEEP_ROWS of each table every _SWEEP_EVERY decisions: four
# per decision, more than one adds, so idle rows go quickly. A DELETE costs about what a
# decision's own statements do, so one sweep serves several decisions.
_SWEEP_EVERY = 8
_SWEEP_ROWS = 32
# A sweep's statements, one per table: (table, primary key, indexed expiry column). Rows
# are picked by their key (the WITHOUT ROWID tables have no rowid).
_SWEEPS = tuple(
    f"DELETE FROM {table} WHERE {key} IN (SELECT {key} FROM {table} WHERE {column} <= ? LIMIT ?)"
    for table, key, column in (
        ("call_windows", "key", "idle_at"),
        ("call_holds", "key", "expires_at"),
        *budgets_sqlite.SWEPT,
        *anomaly_sqlite.SWEPT,
    )
)
# The tables schema 3 made WITHOUT ROWID (the module docstring says why).
_WITHOUT_ROWID = ("call_holds", "call_windows", *budgets_sqlite.WITHOUT_ROWID)


class SqliteCallStore:
    """A CallStore in the SQLite state file: a transaction per decision."""

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
        self._rules = tuple(rules_by_name(rules).values())
        self._wall_clock = wall_clock
        self._log_keep = log_keep
        self._decisions = 0
        self._sqlite = SqliteDb(
            path,
            name="sqlite call store",
            thread_name="lw-calls",
            create_schema=_create_schema,
            clock=clock or time.time,
            busy_timeout=busy_timeout,
        )
        self.owner = new_owner()
        self._lease = OwnerLease(self._beat, name="lw-calls-lease")

    async def start(self) -> None:
        """Open the file (creating its directory and tables), then take the holds' lease."""
        await self._sqlite.start()
        await self._lease.start()

    async def aclose(self) -> None:
        """End the lease (giving back this owner's holds), close the connection and thread."""
        await self._lease.stop()
        await self._sqlite.aclose()

    async def _beat(self, seconds: float) -> int:
        """Renew this owner's lease; give back the holds of owners whose lease lapsed."""
        owner = self.owner
        return await self._sqlite.write(
            lambda db, now: budgets_sqlite.beat(db, owner, now, seconds)
        )

    async def decide(
        self,
        circuit: str,
        fingerprint: str,
        fields: Mapping[str, str] = MappingProxyType({}),
        *,
        policy: CallLoopPolicy | None = None,
    ) -> CallDecision:
        """Decide one call and count it when allowed, in one transaction."""
        chosen = self._policy if policy is None else policy
        event = call_event(circuit, fingerprint, fields, self._rules)
        sweep = self._sweeps()
        return await self._sqlite.write(lambda db, now: _decide(db, now, event, chosen, sweep))

    async def admit(
        self,
        circuit: str,
        fingerprint: str,
        fields: Mapping[str, str],
        spend: SpendEvent,
        *,
        policy: CallLoopPolicy | None = None,
        shadow: ShadowGuards = ENFORCED,
    ) -> Admission:
        """The agent's pause, the budgets' step, then `decide`'s, in one transaction."""
        chosen = self._policy if policy is None else policy
        event = call_event(circuit, fingerprint, fields, self._rules)
        sweep = self._sweeps()
        agent_hold = spend.agent_hold
        owner = self.owner

        def admit(db: sqlite3.Connection, now: float) -> Admission:
            if agent_hold is not None:
                earlier = _hold(db, agent_hold)
                hold, paused = step_agent_hold(earlier, agent_hold, circuit, now)
                if paused is not None:
                    _save_hold(db, agent_hold, earlier, hold)
                    return Admission(paused, ADMITTED_FREE)
            record, verdict = step_spend(budgets_sqlite.load(db, spend, now), spend, now)
            decision = None
            if verdict.allowed:
                decision = _decide(db, now, event, chosen, sweep)
                refused = not decision.allowed and not shadow.covers(decision)
                if verdict.hold is not None:
                    if refused:
                        record = step_release(record, verdict.hold, now)
                    else:
                        budgets_sqlite.own(db, owner, verdict.hold)
            budgets_sqlite.save(db, spend, record)
            return Admission(decision, verdict)

        return await self._sqlite.write(admit)

    def _sweeps(self) -> bool:
        """Whether this decision sweeps expired rows: one in every _SWEEP_EVERY."""
        self._decisions += 1
        return self._decisions % _SWEEP_EVERY == 0

    async def charge(self, hold: SpendHold, used: Amount | None) -> list[SpendAlert]:
        """`step_charge` on the stored records, in one transaction."""
        return (await self.settle(hold, used)).alerts

    async def settle(
        self, hold: SpendHold, used: Amount | None, anomaly: AnomalyCharge | None = None
    ) -> Settled:
        """`step_charge` and `step_anomaly` on the stored records, in one transaction."""
        owner = self.owner

        def settle(db: sqlite3.Connection, now: float) -> Settled:
            alerts: list[SpendAlert] = []
            if hold.groups:
                released = budgets_sqlite.disown(db, owner, hold)
                held = budgets_sqlite.load(db, hold, now)
                record, alerts = step_charge(held, hold, used, now, released)
                budgets_sqlite.save(db, hold, record)
            if anomaly is None:
                return Settled(alerts)
            event, policy = anomaly
            loaded = anomaly_sqlite.load(db, event.agent, policy, now)
            stored = None if loaded is None else loaded.window
            agent, found = step_anomaly(loaded, event, policy, now)
            if agent is not loaded:
                stored = None
            anomaly_sqlite.save(db, event.agent, agent, policy, stored)
            if found is not None and found.paused is not None:
                earlier = _hold(db, found.paused)
                _save_hold(db, found.paused, earlier, anomaly_pause(earlier, now))
            return Settled(alerts, found)

        return await self._sqlite.write(settle)

    async def spend_groups(self) -> list[tuple[str, GroupSpend]]:
        """The stored groups of periods not ended."""
        return await self._sqlite.read(budgets_sqlite.live)

    async def spend_limits(self) -> dict[str, Limits]:
        """The admins' limits in force."""
        return await self._sqlite.read(budgets_sqlite.live_limits)

    async def set_spend_limit(self, key: str, limits: Limits, ends_at: float) -> None:
        """Store an admin's limits until the period ends."""
        await self._sqlite.write(lambda db, now: budgets_sqlite.set_limit(db, key, limits, ends_at))

    async def reset_spend(self, key: str) -> bool:
        """Forget one group's spend."""
        return await self._sqlite.write(lambda db, now: budgets_sqlite.reset(db, key))

    async def record_outcome(
        self, decision: CallDecision, status: int | None = None, error: str | None = None
    ) -> bool:
        """Uncount an allowed call the provider failed; other outcomes stay counted."""
        receipt = receipt_to_uncount(decision, status, error)
        if receipt is None:
            return False

        keys = [
            _call_key(*receipt.call),
            *(_rule_key(name, key) for name, key in receipt.rule_keys),
        ]

        def forget(db: sqlite3.Connection, now: float) -> bool:
            removed = [_uncount(db, key, receipt.at) for key in keys]
            return removed[0]

        return await self._sqlite.write(forget)

    async def reopen(self, circuit: str) -> bool:
        """Lift a pause (circuit or rule group) and forget the counts before now."""
        window = reopen_window(self._policy, self._rules, circuit)

        def reopen(db: sqlite3.Connection, now: float) -> bool:
            earlier = _hold(db, circuit)
            hold, lifted = step_reopen(earlier, now, window)
            _save_hold(db, circuit, earlier, hold)
            return lifted

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

        return await self._sqlite.read(paused)

    async def log_call(self, entry: CallLogEntry) -> None:
        """`log_calls` of one entry."""
        await self.log_calls((entry,))

    async def log_calls(self, entries: Sequence[CallLogEntry]) -> None:
        """Append the entries in one transaction; the oldest beyond `log_keep` go."""
        if not entries:
            return
        keep = self._log_keep
        rows = [codec.sql_row(entry) for entry in entries]

        def append(db: sqlite3.Connection, now: float) -> None:
            db.executemany(_LOG_INSERT, rows)
            (newest,) = db.execute("SELECT last_insert_rowid()").fetchone()
            if newest > keep:
                db.execute("DELETE FROM call_log WHERE id <= ?", (newest - keep,))

        await self._sqlite.write(append)

    async def calls_since(self, seconds: float) -> list[CallLogEntry]:
        """Entries at or after now - seconds, oldest first."""
        cutoff = self._wall_clock() - seconds

        def since(db: sqlite3.Connection, now: float) -> list[CallLogEntry]:
            rows = db.execute(
                f"SELECT {codec.LOG_COLUMNS} FROM call_log WHERE at >= ? ORDER BY at, id", (cutoff,)
            )
            return [codec.from_sql_row(row) for row in rows]

        return await self._sqlite.read(since)

    async def query_calls(
        self, where: CallFilter, limit: int, cursor: Cursor | None = None
    ) -> CallPage:
        """The page in one indexed query (a read: it never waits for a writer)."""

        def page(db: sqlite3.Connection, now: float) -> CallPage:
            rows = query_sqlite.page_rows(db, codec.LOG_COLUMNS, where, limit, cursor)
            return page_of([codec.from_sql_row(row) for row in rows], limit, cursor)

        return await self._sqlite.read(page)

    async def call_totals(self, where: CallFilter) -> CallTotals:
        """The sums in one aggregate query."""
        return await self._sqlite.read(lambda db, now: query_sqlite.totals(db, where))

    async def cost_series(
        self, where: CallFilter, since: float, until: float, bucket_seconds: float
    ) -> list[CostBucket]:
        """The sums per bucket in one grouped query."""
        return await self._sqlite.read(
            lambda db, now: query_sqlite.cost_series(db, where, since, until, bucket_seconds)
        )


def _create_schema(db: sqlite3.Connection, path: str) -> None:
    """Create the call tables, upgrading older ones (a newer schema is refused, not downgraded)."""
    db.execute(_META)
    row = db.execute("SELECT value FROM call_meta WHERE name = 'schema'").fetchone()
    version = SCHEMA_VERSION if row is None else row[0]
    if type(version) is not int or version < 1:  # a hand-edited or foreign file
        raise StateError(f"{path} holds call tables of an unknown schema {str(version)[:40]!r}")
    if version > SCHEMA_VERSION:
        raise StateError(
            f"{path} holds call tables of a newer loopwarden "
            f"(schema {version}, this one knows {SCHEMA_VERSION})"
        )
    rebuilt = _set_aside(db) if version < 3 else []
    for statement in _SCHEMA:
        db.execute(statement)
    for table in rebuilt:
        db.execute(f"INSERT INTO {table} SELECT * FROM {table}_rowid")
        db.execute(f"DROP TABLE {table}_rowid")
    # Schema 1 counted calls one row each; they last a window at most, so they are dropped.
    db.execute("DROP TABLE IF EXISTS call_events")
    db.execute(
        "INSERT OR REPLACE INTO call_meta (name, value) VALUES ('schema', ?)",
        (SCHEMA_VERSION,),
    )


def _set_aside(db: sqlite3.Connection) -> list[str]:
    """Rename the stored rowid tables that schema 3 makes WITHOUT ROWID to `<name>_rowid`.

    Their indexes are dropped, so that `_SCHEMA` creates them, by the same names, on the
    new tables; the caller copies the rows over and drops the old tables.
    """
    stored = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    tables = [table for table in _WITHOUT_ROWID if table in stored]
    for table in tables:
        indexes = db.execute(
            "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = ? "
            "AND sql IS NOT NULL",  # the key's own index (no sql) goes with its table
            (table,),
        ).fetchall()
        for (index,) in indexes:
            db.execute(f"DROP INDEX {index}")
        db.execute(f"ALTER TABLE {table} RENAME TO {table}_rowid")
    return tables


def _decide(
    db: sqlite3.Connection, now: float, event: CallEvent, policy: CallLoopPolicy, sweep: bool
) -> CallDecision:
    """`step_call` on the stored record: load it, step it, save what changed."""
    if sweep:
        _sweep(db, now)
    circuit = event.circuit
    call = _call_key(circuit, event.identity)
    groups = [rule_group(rule, key) for rule, key in event.rules]
    windows = [_rule_key(rule.name, key) for rule, key in event.rules]
    hold = _hold(db, circuit)
    calls, packed = _calls(db, call)
    group_holds = [_hold(db, group) for group in groups]
    rule_calls = [_calls(db, key) for key in windows]
    record = CallRecord(hold, calls, list(group_holds), [found for found, _ in rule_calls])
    record, decision = step_call(record, event, policy, now)
    _save_hold(db, circuit, hold, record.hold)
    _save_calls(db, call, packed, record.calls)
    for group, before, after in zip(groups, group_holds, record.group_holds, strict=True):
        _save_hold(db, group, before, after)
    for key, (_, before_packed), after_calls in zip(
        windows, rule_calls, record.rule_calls, strict=True
    ):
        _save_calls(db, key, before_packed, after_calls)
    return decision


def _call_key(circuit: str, identity: str) -> str:
    return f"c{_SEP}{circuit}{_SEP}{identity}"


def _rule_key(name: str, key: RuleKey) -> str:
    return _SEP.join(("r", name, *key))


def _sweep(db: sqlite3.Connection, now: float) -> None:
    """Delete a few idle records of counted calls and expired holds (they decide nothing)."""
    for delete in _SWEEPS:
        db.execute(delete, (now, _SWEEP_ROWS))


def _hold(db: sqlite3.Connection, key: str) -> Hold | None:
    """The stored hold of a circuit or group (the step tells an expired one)."""
    row = db.execute(
        "SELECT paused_until, fresh_from, expires_at, reason, rule, count FROM call_holds "
        "WHERE key = ?",
        (key,),
    ).fetchone()
    if row is None:
        return None
    paused_until, fresh_from, expires_at, reason, rule, count = row
    fresh = NEVER if fresh_from is None else float(fresh_from)
    return Hold(float(paused_until), fresh, float(expires_at), str(reason), rule, int(count))


def _save_hold(db: sqlite3.Connection, key: str, before: Hold | None, after: Hold | None) -> None:
    """Write a hold the step changed (holds are immutable: a change is a new object)."""
    if after is before:
        return
    if after is None:
        db.execute("DELETE FROM call_holds WHERE key = ?", (key,))
        return
    fresh = None if math.isinf(after.fresh_from) else after.fresh_from
    db.execute(
        "INSERT OR REPLACE INTO call_holds "
        "(key, paused_until, fresh_from, expires_at, reason, rule, count) "
        "VALUES (?, ?, ?, ?, ?, ?, ?)",
        (key, after.paused_until, fresh, after.expires_at, after.reason, after.rule, after.count),
    )


def _pack(times: Sequence[float]) -> bytes:
    """Call times as stored: little-endian doubles, exact and the same on every machine."""
    return struct.pack(f"<{len(times)}d", *times)


def _calls(db: sqlite3.Connection, key: str) -> tuple[CountedCalls | None, bytes | None]:
    """The stored counted calls of a key, and their packed times as read."""
    row = db.execute("SELECT times, idle_at FROM call_windows WHERE key = ?", (key,)).fetchone()
    if row is None:
        return None, None
    packed = row[0]
    if not isinstance(packed, bytes) or len(packed) % 8:
        raise StateError(f"call_windows holds a malformed record of counted calls for {key!r}")
    times = list(struct.unpack(f"<{len(packed) // 8}d", packed))
    return CountedCalls(times, float(row[1])), packed


def _save_calls(
    db: sqlite3.Connection, key: str, before: bytes | None, after: CountedCalls | None
) -> None:
    """Write counted calls the step changed: an empty record is deleted."""
    if after is None:
        return
    if not after.times:
        if before is not None:
            db.execute("DELETE FROM call_windows WHERE key = ?", (key,))
        return
    packed = _pack(after.times)
    if packed != before:  # a call counted or dropped (counting also moves idle_at)
        db.execute(
            "INSERT OR REPLACE INTO call_windows (key, times, idle_at) VALUES (?, ?, ?)",
            (key, packed, after.idle_at),
        )


def _uncount(db: sqlite3.Connection, key: str, at: float) -> bool:
    """`uncount` on a stored record: forget the call counted at `at`, if it is still held."""
    calls, packed = _calls(db, key)
    removed = uncount(calls, at)
    if removed:
        _save_calls(db, key, packed, calls)
    return removed
