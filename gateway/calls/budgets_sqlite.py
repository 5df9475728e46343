"""The spend records in the SQLite state file: loaded, stepped with gateway.calls.budgets, saved.

`call_spend` holds one row per group and period (charged and held money and tokens, the
highest alert sent, when the period ends); `call_spend_limits` an admin's limits per
budget and period. Rows whose period has ended count as none and are swept a few per
decision with the call store's other expired rows.

Both tables are WITHOUT ROWID since the call store's schema 3 (which upgrades older
files): every budgeted call reads them by key and upserts its groups' rows, and their
rows are small, so one b-tree serves where a rowid table reads its key's index and then
the table (measured: a few µs off each admit and settle, about 3%).
"""

from __future__ import annotations

import sqlite3

from gateway.calls.budgets import (
    Amount,
    GroupSpend,
    Limits,
    SpendEvent,
    SpendHold,
    SpendRecord,
)

SCHEMA = (
    """CREATE TABLE IF NOT EXISTS call_spend (
        key TEXT PRIMARY KEY, spent_usd INTEGER NOT NULL, spent_tokens INTEGER NOT NULL,
        held_usd INTEGER NOT NULL, held_tokens INTEGER NOT NULL, alerted INTEGER NOT NULL,
        ends_at REAL NOT NULL) WITHOUT ROWID""",
    "CREATE INDEX IF NOT EXISTS call_spend_end ON call_spend (ends_at)",
    """CREATE TABLE IF NOT EXISTS call_spend_limits (
        key TEXT PRIMARY KEY, usd INTEGER, tokens INTEGER, ends_at REAL NOT NULL) WITHOUT ROWID""",
    "CREATE INDEX IF NOT EXISTS call_spend_limits_end ON call_spend_limits (ends_at)",
)
SWEPT = (("call_spend", "key", "ends_at"), ("call_spend_limits", "key", "ends_at"))
"""The tables the call store sweeps: (table, primary key, indexed expiry column)."""
WITHOUT_ROWID = ("call_spend", "call_spend_limits")
"""The tables that are WITHOUT ROWID since schema 3 (the call store rebuilds older ones)."""
_COLUMNS = "spent_usd, spent_tokens, held_usd, held_tokens, alerted, ends_at"


def _group(row: tuple[int, int, int, int, int, float]) -> GroupSpend:
    spent_usd, spent_tokens, held_usd, held_tokens, alerted, ends_at = row
    return GroupSpend(
        Amount(int(spent_usd), int(spent_tokens)),
        Amount(int(held_usd), int(held_tokens)),
        int(alerted),
        float(ends_at),
    )


def load(db: sqlite3.Connection, groups: SpendEvent | SpendHold, now: float) -> SpendRecord:
    """The stored record of an event's (or a hold's) groups and their admins' limits.

    One query for the groups and one for the limits, however many budgets apply.
    """
    keys = [group.key for group in groups.groups]
    marks = ", ".join("?" * len(keys))
    rows = db.execute(f"SELECT key, {_COLUMNS} FROM call_spend WHERE key IN ({marks})", keys)
    found = {str(row[0]): _group(row[1:]) for row in rows}
    limit_keys = [group.limit_key for group in groups.groups]
    rows = db.execute(
        f"SELECT key, usd, tokens FROM call_spend_limits WHERE key IN ({marks}) AND ends_at > ?",
        (*limit_keys, now),
    )
    limits = {str(key): Limits(usd, tokens) for key, usd, tokens in rows}
    return SpendRecord([found.get(key) for key in keys], [limits.get(key) for key in limit_keys])


def save(db: sqlite3.Connection, groups: SpendEvent | SpendHold, record: SpendRecord) -> None:
    """Write every group record the step left (an ended or absent one is deleted)."""
    kept = []
    for group, current in zip(groups.groups, record.groups, strict=True):
        if current is None:
            db.execute("DELETE FROM call_spend WHERE key = ?", (group.key,))
            continue
        kept.append(
            (
                group.key,
                current.spent.nano_usd,
                current.spent.tokens,
                current.held.nano_usd,
                current.held.tokens,
                current.alerted,
                current.ends_at,
            )
        )
    # An upsert changes a stored row in place (a group's end never changes: the step sets
    # it when it makes the record), leaving its index entries alone: INSERT OR REPLACE
    # would delete and insert it, and a transaction costs about the pages it writes.
    db.executemany(
        f"INSERT INTO call_spend (key, {_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?) "
        "ON CONFLICT (key) DO UPDATE SET spent_usd = excluded.spent_usd, "
        "spent_tokens = excluded.spent_tokens, held_usd = excluded.held_usd, "
        "held_tokens = excluded.held_tokens, alerted = excluded.alerted",
        kept,
    )


def set_limit(db: sqlite3.Connection, key: str, limits: Limits, ends_at: float) -> None:
    """Store an admin's limits for a budget until its period ends."""
    db.execute(
        "INSERT OR REPLACE INTO call_spend_limits (key, usd, tokens, ends_at) VALUES (?, ?, ?, ?)",
        (key, limits.nano_usd, limits.tokens, ends_at),
    )


def reset(db: sqlite3.Connection, key: str) -> bool:
    """Forget a group's spend this period; True when it had any."""
    return db.execute("DELETE FROM call_spend WHERE key = ?", (key,)).rowcount > 0


def live(db: sqlite3.Connection, now: float) -> list[tuple[str, GroupSpend]]:
    """The groups whose period has not ended, by key."""
    rows = db.execute(
        f"SELECT key, {_COLUMNS} FROM call_spend WHERE ends_at > ? ORDER BY key", (now,)
    )
    return [(str(row[0]), _group(row[1:])) for row in rows]


def live_limits(db: sqlite3.Connection, now: float) -> dict[str, Limits]:
    """The admins' limits in force, by budget-and-period key."""
    rows = db.execute("SELECT key, usd, tokens FROM call_spend_limits WHERE ends_at > ?", (now,))
    return {str(key): Limits(usd, tokens) for key, usd, tokens in rows}
