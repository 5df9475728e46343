"""The request log's queries answer alike on every CallStore backend (issue 12).

The same log goes into a memory store, a SQLite file and a real Redis; each must give the
same pages (walked to the end by cursor), totals and cost series as a plain Python
reading of the log, for every filter.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from types import MappingProxyType
from typing import get_args

import pytest
from redis.asyncio import Redis

from gateway.calls.entry import CallLogEntry, CallOutcome
from gateway.calls.query import CallFilter, CallTotals, CostBucket, Cursor
from gateway.calls.redis_store import RedisCallStore
from gateway.calls.sqlite_store import SqliteCallStore
from gateway.calls.store import LOG_KEEP, CallStore, MemoryCallStore
from gateway.state.redis_link import RedisTopology
from tests.gateway.calls.store_helpers import BACKENDS

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


def expected_totals(where: CallFilter, log: list[CallLogEntry] = LOG) -> CallTotals:
    """The totals, added up plainly."""
    chosen = [e for e in log if where.matches(e)]
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
) -> AsyncIterator[Callable[..., CallStore]]:
    """Builds (not started) stores of one backend; the test starts them, this closes them."""
    backend: str = request.param
    url: str | None = None
    if backend == "redis":
        url = request.getfixturevalue("redis_url")
    elif backend == "redis-cluster":
        url = request.getfixturevalue("redis_cluster").url
    topology = RedisTopology(cluster=backend == "redis-cluster")
    built: list[CallStore] = []

    def make(log_keep: int = LOG_KEEP) -> CallStore:
        store: CallStore
        if backend == "memory":
            store = MemoryCallStore(log_keep=log_keep)
        elif backend == "sqlite":
            path = tmp_path / f"calls-{next(_prefixes)}.sqlite3"
            store = SqliteCallStore(path, log_keep=log_keep)
        else:
            assert url is not None
            store = RedisCallStore(
                url, key_prefix=f"query{next(_prefixes)}:", log_keep=log_keep, topology=topology
            )
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


HOUR = 3_600.0
EDGE = START + 3 * HOUR
# Twelve hours of calls, with some at an hour's first instant and the float just before.
LONG = sorted(
    [entry(n, at=START + 211.0 * n) for n in range(200)]
    + [entry(200, at=EDGE), entry(201, at=math.nextafter(EDGE, -math.inf)), entry(202, at=EDGE)]
    + [entry(203, agent="billing-bot\x1fforwarded", outcome="loop_detected")],
    key=lambda e: e.at,
)
RANGES = [
    (None, None),
    (START + 1_800.5, None),
    (None, START + 7 * HOUR + 13.25),
    (START + 2 * HOUR, START + 6 * HOUR),
    (START + 1_234.5, START + 9 * HOUR + 1.0),
    (EDGE - 10.0, EDGE + 10.0),
    (EDGE, EDGE + HOUR),
    (math.nextafter(EDGE, -math.inf), START + 20 * HOUR),
]
WIDE_FILTERS = [
    *FILTERS,
    CallFilter(outcome="forwarded"),
    CallFilter(model="claude-3-haiku"),
    CallFilter(model="gpt-4o-mini", outcome="upstream_error"),
    CallFilter(customer="cust-2", outcome="forwarded"),
    CallFilter(feature="faq", outcome="duplicate_call"),
    CallFilter(agent="billing-bot", customer="cust-1"),  # two fields: scanned
    CallFilter(session="run-1"),
    CallFilter(agent="billing-bot\x1fforwarded"),
    CallFilter(agent="billing-bot", outcome="loop_detected"),
]


def expected_series(
    log: list[CallLogEntry], where: CallFilter, since: float, until: float, bucket: float
) -> list[CostBucket]:
    """The series, added up plainly."""
    start = math.floor(since / bucket) * bucket
    sums = [[0.0, 0.0, 0] for _ in range(max(1, math.ceil((until - start) / bucket)))]
    for e in log:
        if where.matches(e) and since <= e.at < until:
            slot = sums[min(int((e.at - start) / bucket), len(sums) - 1)]
            slot[0 if e.outcome in ("forwarded", "upstream_error") else 1] += e.cost or 0.0
            slot[2] += 1
    return [
        CostBucket(start + i * bucket, cost, saved, int(calls))
        for i, (cost, saved, calls) in enumerate(sums)
    ]


async def assert_answers(store: CallStore, log: list[CallLogEntry]) -> None:
    """Totals and series of every filter over every range are the plain sums of `log`."""
    for where, (since, until) in itertools.product(WIDE_FILTERS, RANGES):
        chosen = dataclasses.replace(where, since=since, until=until)
        assert await store.call_totals(chosen) == expected_totals(chosen, log), chosen
    for where in WIDE_FILTERS[:6]:
        for since, until in RANGES[3:]:
            assert since is not None
            assert until is not None
            for bucket in (HOUR, 2 * HOUR, 60.0):
                series = await store.cost_series(where, since, until, bucket)
                assert series == expected_series(log, where, since, until, bucket), where


async def test_issue12_totals_and_series_over_any_range_are_those_of_the_entries(
    make: Callable[..., CallStore],
) -> None:
    store = make()
    await store.start()
    for first in range(0, len(LONG), 16):  # in batches, as the proxy writes
        await store.log_calls(LONG[first : first + 16])
    await assert_answers(store, LONG)


async def test_issue12_a_log_trimmed_by_log_keep_adds_up_what_it_keeps(
    make: Callable[..., CallStore],
) -> None:
    store = make(log_keep=61)
    await store.start()
    for first in range(0, len(LONG), 7):
        await store.log_calls(LONG[first : first + 7])
    await assert_answers(store, LONG[-61:])
    await store.log_call(entry(300, at=START + 13 * HOUR + 5.0))
    await assert_answers(store, [*LONG[-60:], entry(300, at=START + 13 * HOUR + 5.0)])


async def redis_store(
    redis_url: str, log_keep: int = LOG_KEEP
) -> tuple[RedisCallStore, Redis, str]:
    """A started Redis store of its own prefix, a plain client, and the store's key base."""
    prefix = f"query{next(_prefixes)}:"
    store = RedisCallStore(redis_url, key_prefix=prefix, log_keep=log_keep)
    await store.start()
    return store, Redis.from_url(redis_url, decode_responses=True), prefix + "{calls}:"


async def scans(client: Redis) -> int:
    """How many ZREVRANGEBYSCOREs (reads of log entries) Redis answered since the reset."""
    stats = await client.info("commandstats")
    return int(stats.get("cmdstat_zrevrangebyscore", {}).get("calls", 0))


@pytest.mark.redis
async def test_issue12_redis_adds_up_whole_hours_from_their_sums_not_the_entries(
    redis_url: str,
) -> None:
    store, client, _ = await redis_store(redis_url)
    try:
        await store.log_calls(LONG)
        await client.config_resetstat()
        whole = CallFilter(agent="billing-bot", outcome="forwarded", since=START, until=EDGE)
        assert await store.call_totals(whole) == expected_totals(whole, LONG)
        series = await store.cost_series(CallFilter(), START, START + 12 * HOUR, HOUR)
        assert series == expected_series(LONG, CallFilter(), START, START + 12 * HOUR, HOUR)
        assert await scans(client) == 0
        edges = CallFilter(agent="billing-bot", since=START + 10.0, until=EDGE + 10.0)
        assert await store.call_totals(edges) == expected_totals(edges, LONG)
        assert await scans(client) == 2  # the first and the last hour only
    finally:
        await store.aclose()
        await client.aclose()


@pytest.mark.redis
async def test_issue12_redis_sums_are_dropped_with_the_hours_the_log_trims(
    redis_url: str,
) -> None:
    store, client, base = await redis_store(redis_url, log_keep=40)
    try:
        for first in range(0, len(LONG), 10):
            await store.log_calls(LONG[first : first + 10])
        kept = LONG[-40:]
        trimmed_hour = math.floor(LONG[-41].at / HOUR) * HOUR
        assert await client.get(f"{base}agg:floor") == str(int(trimmed_hour))
        hours = {key async for key in client.scan_iter(f"{base}agg:1*")}
        later = {math.floor(e.at / HOUR) * HOUR for e in kept} - {trimmed_hour}
        assert hours == {f"{base}agg:{int(hour)}" for hour in later}
        assert await store.call_totals(CallFilter()) == expected_totals(CallFilter(), kept)
    finally:
        await store.aclose()
        await client.aclose()


@pytest.mark.redis
async def test_issue12_a_redis_log_written_before_the_sums_is_scanned_then_summed(
    redis_url: str,
) -> None:
    store, client, base = await redis_store(redis_url)
    try:
        await store.log_calls(LONG[:100])
        await client.delete(f"{base}agg:floor", f"{base}agg:hours")
        await client.delete(*[key async for key in client.scan_iter(f"{base}agg:1*")])
        await assert_answers(store, LONG[:100])
        await store.log_calls(LONG[100:])
        assert await client.get(f"{base}agg:floor") == str(
            int(math.floor(LONG[99].at / HOUR) * HOUR)
        )
        await assert_answers(store, LONG)
    finally:
        await store.aclose()
        await client.aclose()
