"""The Calls page's questions in SQL, on the SQLite call store's `call_log` table.

`gateway.calls.query` defines the filters, pages, totals and series; this module asks
the same of SQLite so a filtered page and its totals over 100,000 logged calls take a few
milliseconds, not a Python pass over every row.

Decisions where DESIGN.md is silent:
- Indexes, added to schema 2 with `CREATE INDEX IF NOT EXISTS` (an older loopwarden
  ignores them): agent (then outcome), outcome, session, and customer, user and feature
  (read from the entry's JSON fields, indexed by expression), each ending in `at`, so a
  filtered page is an index range read newest first. `model` has none: a handful of
  models each match a large share of the log, so an index would not spare the totals'
  pass over those rows. Each index costs every logged call a B-tree insert, off the
  request path (bench/calls_query_bench.py measures both).
- Ties in time come newest written first (`id DESC`), as the memory store lists them.
"""

from __future__ import annotations

import sqlite3

from gateway.calls.query import (
    FIELD_FILTERS,
    SENT_OUTCOMES,
    CallFilter,
    CallTotals,
    CostBucket,
    Cursor,
    bucket_count,
    series_buckets,
    series_start,
)

_COLUMN_FILTERS = ("agent", "session", "model", "outcome")
INDEXES = (
    # agent leads outcome: the Calls page's usual pair (agent + outcome) is one range read.
    "CREATE INDEX IF NOT EXISTS call_log_agent ON call_log (agent, outcome, at)",
    "CREATE INDEX IF NOT EXISTS call_log_outcome ON call_log (outcome, at)",
    "CREATE INDEX IF NOT EXISTS call_log_session ON call_log (session, at)",
    *(
        f"CREATE INDEX IF NOT EXISTS call_log_{name} ON call_log "
        f"(json_extract(fields, '$.{name}'), at)"
        for name in FIELD_FILTERS
    ),
)
_SENT = f"outcome IN ({', '.join(repr(outcome) for outcome in sorted(SENT_OUTCOMES))})"


def _where(where: CallFilter, before: float | None = None) -> tuple[str, list[object]]:
    """The WHERE clause of a filter (and of a cursor's time), with its parameters."""
    terms: list[str] = []
    params: list[object] = []
    for column in _COLUMN_FILTERS:
        value = getattr(where, column)
        if value is not None:
            terms.append(f"{column} = ?")
            params.append(value)
    for name, value in where.field_values().items():
        # The same expression as the index's, so the index serves it.
        terms.append(f"json_extract(fields, '$.{name}') = ?")
        params.append(value)
    for term, bound in (("at >= ?", where.since), ("at < ?", where.until), ("at <= ?", before)):
        if bound is not None:
            terms.append(term)
            params.append(bound)
    return " AND ".join(terms) or "1", params


def page_rows(
    db: sqlite3.Connection, columns: str, where: CallFilter, limit: int, cursor: Cursor | None
) -> list[tuple[object, ...]]:
    """Up to `limit` + 1 rows of a page, newest first (one more tells a next page exists)."""
    clause, params = _where(where, None if cursor is None else cursor.at)
    skip = 0 if cursor is None else cursor.skip
    return db.execute(
        f"SELECT {columns} FROM call_log WHERE {clause} ORDER BY at DESC, id DESC LIMIT ? OFFSET ?",
        (*params, limit + 1, skip),
    ).fetchall()


def totals(db: sqlite3.Connection, where: CallFilter) -> CallTotals:
    """What the filtered calls add up to, in one aggregate query."""
    clause, params = _where(where)
    row = db.execute(
        "SELECT count(*), "
        f"coalesce(sum(NOT {_SENT}), 0), "
        f"coalesce(sum(CASE WHEN {_SENT} THEN input_tokens END), 0), "
        f"coalesce(sum(CASE WHEN {_SENT} THEN output_tokens END), 0), "
        f"total(CASE WHEN {_SENT} THEN cost END), "
        f"total(CASE WHEN NOT {_SENT} THEN cost END), "
        "coalesce(sum(cost IS NULL), 0) "
        f"FROM call_log WHERE {clause}",
        params,
    ).fetchone()
    calls, refused, tokens_in, tokens_out, cost, saved, unpriced = row
    sums = CallTotals(
        int(calls), int(refused), int(tokens_in), int(tokens_out), cost, saved, int(unpriced)
    )
    return sums.rounded()


def cost_series(
    db: sqlite3.Connection, where: CallFilter, since: float, until: float, bucket_seconds: float
) -> list[CostBucket]:
    """The filtered calls of since..until per bucket, in one grouped query."""
    start = series_start(since, bucket_seconds)
    count = bucket_count(since, until, bucket_seconds)
    clause, params = _where(where)
    rows = db.execute(
        # CAST truncates as `query.bucket_index` does; min() as `SeriesBuilder.add` clamps.
        "SELECT min(CAST((at - ?) / ? AS INTEGER), ?) AS slot, "
        f"total(CASE WHEN {_SENT} THEN cost END), total(CASE WHEN NOT {_SENT} THEN cost END), "
        f"count(*) FROM call_log WHERE {clause} AND at >= ? AND at < ? GROUP BY slot",
        (start, bucket_seconds, count - 1, *params, since, until),
    )
    sums = [(0.0, 0.0, 0)] * count
    for slot, cost, saved, calls in rows:
        sums[int(slot)] = (float(cost), float(saved), int(calls))
    return series_buckets(start, bucket_seconds, sums)
