"""The spend records in the SQLite state file: loaded, stepped with gateway.calls.budgets, saved.

`call_spend` holds one row per group and period (charged and held money and tokens, the
highest alert sent, when the period ends); `call_spend_limits` an admin's limits per
budget and period. Rows whose period has ended count as none and are swept a few per
decision with the call store's other expired rows.

`call_spend_owners` holds each store instance's lease (renewed by `beat` while it runs)
and `call_spend_owned` what it holds per group (`gateway.calls.budgets`: holds have
owners): a hold adds to its owner's row, a charge takes off it what it gives back, and a
`beat` gives back every hold of an owner whose lease has lapsed (a SIGKILLed proxy) and
forgets that owner. Several processes may share the file (`--workers`), so a lease, not
"another owner is a previous run", says who is dead.

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
    dead_hold,
    owned,
    step_release,
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
    # Who holds what (issue 20): each store instance's lease, and its holds per group.
    """CREATE TABLE IF NOT EXISTS call_spend_owners (
        owner TEXT PRIMARY KEY, alive_until REAL NOT NULL) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS call_spend_owned (
        owner TEXT NOT NULL, key TEXT NOT NULL, usd INTEGER NOT NULL, tokens INTEGER NOT NULL,
        PRIMARY KEY (owner, key)) WITHOUT ROWID""",
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


def own(db: sqlite3.Connection, owner: str, hold: SpendHold) -> None:
    """Count a hold as `owner`'s in each of its groups."""
    amount = hold.amount
    db.executemany(
        "INSERT INTO call_spend_owned (owner, key, usd, tokens) VALUES (?, ?, ?, ?) "
        "ON CONFLICT (owner, key) DO UPDATE SET usd = usd + excluded.usd, "
        "tokens = tokens + excluded.tokens",
        [(owner, group.key, amount.nano_usd, amount.tokens) for group in hold.groups],
    )


def disown(db: sqlite3.Connection, owner: str, hold: SpendHold) -> list[Amount]:
    """What a charge of `owner`'s hold gives back per group (`owned`), taken off its rows."""
    keys = [group.key for group in hold.groups]
    marks = ", ".join("?" * len(keys))
    rows = db.execute(
        f"SELECT key, usd, tokens FROM call_spend_owned WHERE owner = ? AND key IN ({marks})",
        (owner, *keys),
    )
    held = {str(key): Amount(int(usd), int(tokens)) for key, usd, tokens in rows}
    released = [owned(hold.amount, held.get(key, Amount())) for key in keys]
    for key, back in zip(keys, released, strict=True):
        left = held.get(key, Amount())
        if (left.nano_usd, left.tokens) == (back.nano_usd, back.tokens):
            db.execute("DELETE FROM call_spend_owned WHERE owner = ? AND key = ?", (owner, key))
        else:
            db.execute(
                "UPDATE call_spend_owned SET usd = usd - ?, tokens = tokens - ? "
                "WHERE owner = ? AND key = ?",
                (back.nano_usd, back.tokens, owner, key),
            )
    return released


def beat(db: sqlite3.Connection, owner: str, now: float, seconds: float) -> int:
    """Renew `owner`'s lease for `seconds` (0: it ends now), then give back the holds of
    every owner whose lease has lapsed and forget them; the number of holds given back.
    """
    db.execute(
        "INSERT OR REPLACE INTO call_spend_owners (owner, alive_until) VALUES (?, ?)",
        (owner, now + seconds),
    )
    dead = [
        str(row[0])
        for row in db.execute("SELECT owner FROM call_spend_owners WHERE alive_until <= ?", (now,))
    ]
    given = 0
    for gone in dead:
        rows = db.execute(
            "SELECT key, usd, tokens FROM call_spend_owned WHERE owner = ?", (gone,)
        ).fetchall()
        for key, usd, tokens in rows:
            hold = dead_hold(str(key), Amount(int(usd), int(tokens)))
            save(db, hold, step_release(load(db, hold, now), hold, now))
            given += 1
        db.execute("DELETE FROM call_spend_owned WHERE owner = ?", (gone,))
        db.execute("DELETE FROM call_spend_owners WHERE owner = ?", (gone,))
    return given


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
