"""The request log's one list of fields: codecs, the CSV and the console's JSON (issue 21)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from gateway.admin.calls import call_json, totals_json
from gateway.app.errors import StateError
from gateway.calls import query
from gateway.calls.codec import LOG_COLUMNS, LOG_FIELDS, from_plain, from_sql_row, plain, sql_row
from gateway.calls.entry import CallLogEntry
from gateway.calls.export import CSV_COLUMNS, csv_row
from gateway.calls.query import CallFilter, CallTotals, TotalsBuilder, call_sums
from gateway.calls.redis_store import RedisCallStore
from gateway.calls.sqlite_store import SqliteCallStore

FULL = CallLogEntry(
    at=1_700_000_000.25,
    provider="openai",
    agent="billing",
    session="s1",
    circuit="c1",
    model="gpt-4o",
    outcome="duplicate_call",
    status=429,
    input_tokens=12,
    output_tokens=34,
    cost=0.001234567,
    estimated=True,
    rule="once",
    retry=2,
    duration_ms=12.3456,
    fields={"step": "s", "customer": "acme", "user": "u", "feature": "f"},
    fingerprint="fp",
)
BARE = CallLogEntry(
    at=1_700_000_001.0,
    provider="anthropic",
    agent="a",
    session="s",
    circuit="c",
    model="claude",
    outcome="forwarded",
)
NAMES = [spec.name for spec in dataclasses.fields(CallLogEntry)]


def test_issue21_each_codec_and_view_is_derived_from_the_entrys_fields() -> None:
    assert [spec.name for spec in LOG_FIELDS] == NAMES
    assert LOG_COLUMNS.split(", ") == NAMES
    assert list(plain(FULL)) == NAMES
    assert set(NAMES) <= set(call_json(FULL))
    assert len(CSV_COLUMNS) == len(csv_row(FULL))


@pytest.mark.parametrize("entry", [FULL, BARE])
def test_issue21_plain_json_and_sql_rows_give_back_every_field(entry: CallLogEntry) -> None:
    assert from_plain(json.loads(json.dumps(plain(entry)))) == entry
    assert from_sql_row(sql_row(entry)) == entry


def test_issue21_an_unknown_stored_outcome_is_a_state_error_naming_it() -> None:
    with pytest.raises(StateError, match="unknown outcome 'exploded'"):
        from_plain({**plain(FULL), "outcome": "exploded"})
    row = list(sql_row(FULL))
    row[NAMES.index("outcome")] = "forwarded\x00"
    with pytest.raises(StateError, match=r"unknown outcome 'forwarded\\x00'"):
        from_sql_row(tuple(row))


async def test_issue21_the_sqlite_store_gives_back_every_field(tmp_path: Path) -> None:
    store = SqliteCallStore(tmp_path / "calls.sqlite3", wall_clock=lambda: FULL.at + 10)
    await store.start()
    try:
        await store.log_calls([FULL, BARE])
        assert await store.calls_since(60) == [FULL, BARE]
    finally:
        await store.aclose()


@pytest.mark.redis
async def test_issue21_the_redis_store_gives_back_every_field(redis_url: str) -> None:
    store = RedisCallStore(redis_url, key_prefix="codec21:", wall_clock=lambda: FULL.at + 10)
    await store.start()
    try:
        await store.log_calls([FULL, BARE])
        assert await store.calls_since(60) == [FULL, BARE]
    finally:
        await store.aclose()


def test_issue21_the_csv_row_writes_each_field_by_its_kind() -> None:
    assert dict(zip(CSV_COLUMNS, csv_row(FULL), strict=True)) == {
        "time": "2023-11-14T22:13:20.250+00:00",
        "provider": "openai",
        "agent": "billing",
        "session": "s1",
        "circuit": "c1",
        "model": "gpt-4o",
        "outcome": "duplicate_call",
        "status": "429",
        "input_tokens": "12",
        "output_tokens": "34",
        "cost": "0.001235",
        "cost_estimated": "true",
        "rule": "once",
        "retry": "2",
        "duration_ms": "12.346",
        "step": "s",
        "customer": "acme",
        "user": "u",
        "feature": "f",
        "fingerprint": "fp",
    }
    bare = dict(zip(CSV_COLUMNS, csv_row(BARE), strict=True))
    assert [bare[name] for name in ("status", "cost", "cost_estimated", "rule", "step")] == [
        "",
        "",
        "false",
        "",
        "",
    ]


def test_issue21_the_console_json_adds_what_the_page_shows_to_the_fields() -> None:
    assert call_json(FULL) == {
        **plain(FULL),
        "iso": "2023-11-14T22:13:20.250+00:00",
        "refused": True,
        "priced": True,
    }
    assert call_json(BARE)["priced"] is False


def test_issue21_one_call_and_a_filter_add_up_in_one_totals_type() -> None:
    assert not hasattr(query, "CallSums")
    one = call_sums(FULL)
    assert one == CallTotals(calls=1, refused=1, cost_saved=0.001234567)
    builder = TotalsBuilder(CallFilter())
    builder.add(FULL)
    builder.add_sums(call_sums(BARE))
    totals = builder.totals()
    assert totals == CallTotals(calls=2, refused=1, cost_saved=0.001234567, unpriced=1)
    assert totals_json(totals) == totals._asdict()
    assert CallTotals(cost=0.1 + 0.2).rounded().cost == 0.3
