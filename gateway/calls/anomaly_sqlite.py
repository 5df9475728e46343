"""The anomaly detector's records in the SQLite state file: loaded, stepped, saved.

`call_anomaly` holds one row per agent: its first charge, the current window (its index,
spend, the median of the windows before it, whether it alerted), the earlier windows'
spend (JSON `[[index, nano-dollars], ...]`) and the current window's spend by session
(JSON), and when the record stops mattering (`anomaly.expires_at`); expired rows are swept
a few per decision with the call store's other expired rows. The earlier windows are only
decoded when the record rolls over to a new window, the one time the step reads them.

Unlike the call store's other keyed tables, `call_anomaly` keeps its rowid: its rows
grow with the sessions of a window (the JSON), and a WITHOUT ROWID table stores whole
rows in its key's b-tree, fewer to a page, where it suits small rows; a charge updates
its row in place, one page written either way.
"""

from __future__ import annotations

import json
import sqlite3

from gateway.calls.anomaly import AgentSpend, AnomalyPolicy, expires_at

SCHEMA = (
    """CREATE TABLE IF NOT EXISTS call_anomaly (
        agent TEXT PRIMARY KEY, first_at REAL NOT NULL, win INTEGER NOT NULL,
        spent INTEGER NOT NULL, median REAL NOT NULL, alerted INTEGER NOT NULL,
        past TEXT NOT NULL, sessions TEXT NOT NULL, expires_at REAL NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS call_anomaly_end ON call_anomaly (expires_at)",
)
SWEPT = (("call_anomaly", "agent", "expires_at"),)
"""The tables the call store sweeps: (table, primary key, indexed expiry column)."""


def load(
    db: sqlite3.Connection, agent: str, policy: AnomalyPolicy, now: float
) -> AgentSpend | None:
    """The agent's stored record (its earlier windows only when `now` is in a later one)."""
    row = db.execute(
        "SELECT first_at, win, spent, median, alerted, past, sessions FROM call_anomaly "
        "WHERE agent = ?",
        (agent,),
    ).fetchone()
    if row is None:
        return None
    first_at, window, spent, median, alerted, past, sessions = row
    rolls = policy.index(now) > int(window)
    return AgentSpend(
        first_at=float(first_at),
        window=int(window),
        spent=int(spent),
        median=float(median),
        alerted=bool(alerted),
        past={int(k): int(v) for k, v in json.loads(str(past))} if rolls else {},
        sessions={str(k): int(v) for k, v in json.loads(str(sessions)).items()},
    )


def save(
    db: sqlite3.Connection,
    agent: str,
    record: AgentSpend,
    policy: AnomalyPolicy,
    stored: int | None,
) -> None:
    """Write the record the step left; `stored`: the window of the row it was loaded from.

    A record still in its stored window keeps its stored earlier windows (never decoded),
    first charge, median and end.
    """
    sessions = json.dumps(record.sessions, ensure_ascii=False)
    if stored == record.window:
        # Within one window only these change; the rest (and its index entry) stays put.
        db.execute(
            "UPDATE call_anomaly SET spent = ?, alerted = ?, sessions = ? WHERE agent = ?",
            (record.spent, int(record.alerted), sessions, agent),
        )
        return
    head = (record.first_at, record.window, record.spent, record.median, int(record.alerted))
    ends = expires_at(record, policy)
    past = json.dumps(sorted(record.past.items()))
    db.execute(
        "INSERT OR REPLACE INTO call_anomaly "
        "(agent, first_at, win, spent, median, alerted, past, sessions, expires_at) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (agent, *head, past, sessions, ends),
    )
