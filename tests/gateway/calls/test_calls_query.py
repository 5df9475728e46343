"""The request log's queries answer alike on every CallStore backend (issue 12).

The same log goes into a memory store, a SQLite file and a real Redis; each must give the
same pages (walked to the end by cursor), totals and cost series as a plain Python
reading of the log, for every filter.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from types import MappingProxyType
from typing import get_args

import pytest

from gateway.calls.query import CallFilter, CallTotals, CostBucket, Cursor
from gateway.calls.redis_store import RedisCallStore
from gateway.calls.sqlite_store import SqliteCallStore
from gateway.calls.store import CallLogEntry, CallOutcome, CallStore, MemoryCallStore

BACKENDS = ["memory", "sqlite", pytest.param("redis", marks=pytest.mark.redis)]
START = 1_699_999_200.0  # a whole hour
OUTCOMES: tuple[CallOutcome, ...] = get_args(CallOutcome)
_prefixes = itertools.count()


def entry(
    n: int,
    *,
    at: float | None = None,
    agent: str | None = None,
    outcome: CallOutcome | None = None,
) -> CallLogEntry:
    """The n-th call of the test log: agents, outcomes, models and fields in rotation."""
    chosen = outcome or OUTCOMES[n % len(OUTCOMES)]
    return CallLogEntry(
        at=START + 37.0 * n if at is None else at,
        provider="openai",
        agent=agent or ("billing-bot", "support-bot", "<script>alert(1)</script>")[n % 3],
        session=f"run-{n % 4}",
        circuit=f"c{n % 5}",
        model=("gpt-4o-mini", "claude-3-haiku")[n % 2],
        outcome=chosen,
        status=200 if chosen == "forwarded" else None,
        input_tokens=100 + n,
        output_tokens=None if n % 7 == 0 else 20 + n,
        # Binary fractions add up exactly in any order; every 6th model has no price.
        cost=None if n % 6 == 5 else 0.125 * (n % 4 + 1),
        estimated=n % 2 == 1,
        fingerprint=f"fp{n % 3}",
        fields=MappingProxyType(
            {"customer": f"cust-{n % 3}", "user": f"u{n % 2}"} if n % 5 else {"feature": "faq"}
        ),
    )


LOG = [entry(n) for n in range(120)]
FILTERS = [
    CallFilter(),
    CallFilter(agent="billing-bot"),
    CallFilter(agent="billing-bot", outcome="forwarded"),
    CallFilter(session="run-2", model="claude-3-haiku"),
    CallFilter(customer="cust-1"),
    CallFilter(user="u0", outcome="loop_detected"),
    CallFilter(feature="faq"),
    CallFilter(agent="<script>alert(1)</script>"),
    CallFilter(since=START + 37.0 * 30, until=START + 37.0 * 90),
    CallFilter(agent="nobody"),
]


def expected_totals(where: CallFilter) -> CallTotals:
    """The totals, added up plainly."""
    chosen = [e for e in LOG if where.matches(e)]
    sent = [e for e in chosen if e.outcome in ("forwarded", "upstream_error")]
    refused = [e for e in chosen if e not in sent]
    return CallTotals(
        calls=len(chosen),
        refused=len(refused),
        input_tokens=sum(e.input_tokens or 0 for e in sent),
        output_tokens=sum(e.output_tokens or 0 for e in sent),
        cost=sum(e.cost or 0.0 for e in sent),
        cost_saved=sum(e.cost or 0.0 for e in refused),
        unpriced=sum(e.cost is None for e in chosen),
    )


@pytest.fixture(params=BACKENDS)
async def make(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[Callable[[], CallStore]]:
    """Builds (not started) stores of one backend; the test starts them, this closes them."""
    backend: str = request.param
    url: str | None = request.getfixturevalue("redis_url") if backend == "redis" else None
    built: list[CallStore] = []

    def make() -> CallStore:
        store: CallStore
        if backend == "memory":
            store = MemoryCallStore()
        elif backend == "sqlite":
            store = SqliteCallStore(tmp_path / f"calls-{next(_prefixes)}.sqlite3")
        else:
            assert url is not None
            store = RedisCallStore(url, key_prefix=f"query{next(_prefixes)}:")
        built.append(store)
        return store

    yield make
    for store in built:
        await store.aclose()


async def logged(make: Callable[[], CallStore], entries: list[CallLogEntry]) -> CallStore:
    store = make()
    await store.start()
    for item in entries:
        await store.log_call(item)
    return store


async def every_page(store: CallStore, where: CallFilter, limit: int) -> list[CallLogEntry]:
    """All pages of a filter, walked by cursor; each page holds `limit` but the last."""
    found: list[CallLogEntry] = []
    cursor: Cursor | None = None
    while True:
        page = await store.query_calls(where, limit, cursor)
        found += page.entries
        if page.next_cursor is None:
            assert len(page.entries) <= limit
            return found
        assert len(page.entries) == limit
        cursor = Cursor.parse(page.next_cursor.text())


async def test_issue12_every_backend_gives_the_same_pages_totals_and_series(
    make: Callable[[], CallStore],
) -> None:
    store = await logged(make, LOG[::2] + LOG[1::2])  # logged out of time order
    for where in FILTERS:
        newest_first = sorted((e for e in LOG if where.matches(e)), key=lambda e: -e.at)
        assert await every_page(store, where, 7) == newest_first, where
        assert await store.call_totals(where) == expected_totals(where), where
    hour = await store.cost_series(CallFilter(agent="billing-bot"), START, START + 3_600.0, 60.0)
    assert len(hour) == 60
    assert [b.t for b in hour] == [START + 60.0 * i for i in range(60)]
    assert sum(b.calls for b in hour) == sum(
        1 for e in LOG if e.agent == "billing-bot" and e.at < START + 3_600.0
    )
    # 60..120 s holds calls 2 and 3; billing-bot's is 3, a duplicate_call refused (0.5).
    assert hour[1] == CostBucket(START + 60.0, cost=0.0, saved=0.5, calls=1)
    assert hour[0] == CostBucket(START, cost=0.125, saved=0.0, calls=1)


async def test_issue12_a_series_counts_what_the_totals_count(make: Callable[[], CallStore]) -> None:
    store = await logged(make, LOG)
    until = START + 37.0 * 120
    series = await store.cost_series(CallFilter(), START, until, 3_600.0)
    totals = await store.call_totals(CallFilter())
    assert [b.t for b in series] == [START, START + 3_600.0]
    assert sum(b.calls for b in series) == totals.calls == len(LOG)
    assert sum(b.cost for b in series) == pytest.approx(totals.cost)
    assert sum(b.saved for b in series) == pytest.approx(totals.cost_saved)


async def test_issue12_calls_of_one_time_are_paged_without_loss_or_repeat(
    make: Callable[[], CallStore],
) -> None:
    same = [entry(n, at=START) for n in range(10)]
    store = await logged(make, [entry(99, at=START + 1.0), *same, entry(98, at=START - 1.0)])
    pages = await every_page(store, CallFilter(), 3)
    assert [e.at for e in pages] == [START + 1.0, *[START] * 10, START - 1.0]
    assert sorted(e.input_tokens or 0 for e in pages[1:11]) == [100 + n for n in range(10)]


async def test_issue12_calls_logged_after_a_first_page_do_not_shift_the_next(
    make: Callable[[], CallStore],
) -> None:
    store = await logged(make, LOG[:20])
    first = await store.query_calls(CallFilter(), 5)
    for n in range(20, 30):
        await store.log_call(LOG[n])
    assert first.next_cursor is not None
    second = await store.query_calls(CallFilter(), 5, first.next_cursor)
    assert second.entries == LOG[10:15][::-1]
