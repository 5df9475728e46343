"""The sqlite backend's Activity feed: its tables and the statements each call runs.

Each function runs inside the transaction `SqliteStateStore` opens for it (gateway/state/
sqlite_db.py), `now` being the store's clock. Events are rows (`activity`: the id is the
cursor, the event `gateway.state.activity.encode`d); counters are rows per resolution,
bucket, room and field; rooms a row each with when last seen.

Decisions where DESIGN.md is silent:
- Retention runs in every append (one flush of the feed, a few times a second at most):
  events older than a day or beyond the newest `EVENTS_KEEP`, counters past their
  resolution's keep, message keys past `SEEN_SECONDS` and rooms beyond `ROOMS_KEEP` are
  deleted, each by an indexed range, never a scan.
- The tables are added to an existing file of schema 4 as they are: an older loopwarden
  opening the file ignores them, so the schema version stays.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from gateway.state import activity
from gateway.state.activity import (
    EVENTS_KEEP,
    HOUR_KEEP_SECONDS,
    MINUTE_KEEP_SECONDS,
    ROOMS_KEEP,
    SEEN_SECONDS,
    TOTAL,
    ActivityBucket,
    ActivityEvent,
    Span,
)

SCHEMA = (
    """CREATE TABLE IF NOT EXISTS activity (
        id INTEGER PRIMARY KEY AUTOINCREMENT, at REAL NOT NULL, room TEXT NOT NULL,
        event TEXT NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS activity_room ON activity (room, id)",
    "CREATE INDEX IF NOT EXISTS activity_at ON activity (at)",
    """CREATE TABLE IF NOT EXISTS activity_seen (
        message TEXT PRIMARY KEY, expires_at REAL NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS activity_seen_expiry ON activity_seen (expires_at)",
    # resolution: "m" (minute buckets) or "h" (hour buckets); room TOTAL for all rooms.
    """CREATE TABLE IF NOT EXISTS activity_counts (
        resolution TEXT NOT NULL, bucket INTEGER NOT NULL, room TEXT NOT NULL,
        field TEXT NOT NULL, n INTEGER NOT NULL,
        PRIMARY KEY (resolution, bucket, room, field)) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS activity_rooms (
        room TEXT PRIMARY KEY, last_seen REAL NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS activity_rooms_seen ON activity_rooms (last_seen)",
)

_DAY = 86_400.0
_KEEP = {"m": MINUTE_KEEP_SECONDS, "h": HOUR_KEEP_SECONDS}


def append(db: sqlite3.Connection, now: float, events: Sequence[ActivityEvent]) -> None:
    """Insert and count the events (a message key's `in` once), then apply retention."""
    db.execute("DELETE FROM activity_seen WHERE expires_at <= ?", (now,))
    kept: list[ActivityEvent] = []
    rooms: dict[str, float] = {}
    for event in events:
        key = activity.dedupe_key(event)
        if (
            key is not None
            and not db.execute(
                "INSERT OR IGNORE INTO activity_seen (message, expires_at) VALUES (?, ?)",
                (key, now + SEEN_SECONDS),
            ).rowcount
        ):
            continue
        db.execute(
            "INSERT INTO activity (at, room, event) VALUES (?, ?, ?)",
            (event.at, event.room, activity.encode(event)),
        )
        kept.append(event)
        rooms[event.room] = max(event.at, rooms.get(event.room, event.at))
    db.executemany(
        "INSERT INTO activity_counts (resolution, bucket, room, field, n) VALUES (?, ?, ?, ?, ?) "
        "ON CONFLICT (resolution, bucket, room, field) DO UPDATE SET n = n + excluded.n",
        [
            (*counter, n)
            for counted, n in activity.tallies(kept).items()
            for counter in activity.counters(counted)
        ],
    )
    db.executemany(
        "INSERT INTO activity_rooms (room, last_seen) VALUES (?, ?) "
        "ON CONFLICT (room) DO UPDATE SET last_seen = max(last_seen, excluded.last_seen)",
        list(rooms.items()),
    )
    _retain(db, now)


def _retain(db: sqlite3.Connection, now: float) -> None:
    """Delete what is past its keep: old or surplus events, counters, rooms."""
    db.execute("DELETE FROM activity WHERE at < ?", (now - _DAY,))
    db.execute(
        "DELETE FROM activity WHERE id <= (SELECT max(id) FROM activity) - ?", (EVENTS_KEEP,)
    )
    for resolution, keep in _KEEP.items():
        db.execute(
            "DELETE FROM activity_counts WHERE resolution = ? AND bucket < ?",
            (resolution, now - keep),
        )
    db.execute(
        "DELETE FROM activity_rooms WHERE last_seen < (SELECT last_seen FROM activity_rooms "
        "ORDER BY last_seen DESC LIMIT 1 OFFSET ?)",
        (ROOMS_KEEP - 1,),
    )


def since(
    db: sqlite3.Connection, cursor: int | None, limit: int, room: str | None
) -> tuple[list[ActivityEvent], int | None]:
    """Events after `cursor` (None: the newest), oldest first, and the next cursor."""
    newest: int | None = db.execute("SELECT max(id) FROM activity").fetchone()[0]
    if cursor is not None and (newest is None or cursor > newest):
        cursor = None
    where, params = ("", ()) if room is None else (" AND room = ?", (room,))
    if cursor is None:
        rows = db.execute(
            f"SELECT id, event FROM activity WHERE 1{where} ORDER BY id DESC LIMIT ?",
            (*params, limit),
        ).fetchall()
        rows.reverse()
    else:
        rows = db.execute(
            f"SELECT id, event FROM activity WHERE id > ?{where} ORDER BY id LIMIT ?",
            (cursor, *params, limit),
        ).fetchall()
    found = [event for event in (activity.decode(i, raw) for i, raw in rows) if event is not None]
    if cursor is not None and len(rows) == limit:
        return found, int(rows[-1][0])
    return found, newest


def series(
    db: sqlite3.Connection, span: Span, now: float, room: str | None
) -> list[ActivityBucket]:
    """The chart's buckets, oldest first."""
    resolution, starts = activity.span_buckets(span, now)
    held: dict[int, dict[str, int]] = {}
    for bucket, field, n in db.execute(
        "SELECT bucket, field, n FROM activity_counts WHERE resolution = ? AND room = ? "
        "AND bucket >= ? AND bucket <= ?",
        (resolution, TOTAL if room is None else room, starts[0], starts[-1]),
    ):
        held.setdefault(int(bucket), {})[str(field)] = int(n)
    return [activity.bucket(t, held.get(t, {})) for t in starts]


def rooms(db: sqlite3.Connection) -> list[tuple[str, float]]:
    """Rooms seen, newest first."""
    rows = db.execute(
        "SELECT room, last_seen FROM activity_rooms ORDER BY last_seen DESC LIMIT ?", (ROOMS_KEEP,)
    )
    return [(str(room), float(at)) for room, at in rows]
