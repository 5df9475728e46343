"""The Activity feed's storage, one suite for every backend (memory, sqlite, redis).

Events are appended as the feed flushes them and read back by cursor; the counters behind
the console's chart are checked bucket by bucket against `gateway.state.activity.counters`,
the rule every backend (the Redis script its second version) must keep. Two Redis stores on
one prefix stand for two replicas: they share one feed and their counts add up.
"""

from __future__ import annotations

import sqlite3
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from gateway.state import activity
from gateway.state.activity import EVENTS_KEEP, SEEN_SECONDS, TOTAL, ActivityEvent, Kind, Span
from gateway.state.base import StateStore
from gateway.state.memory import MemoryStateStore
from gateway.state.redis import RedisStateStore
from gateway.state.sqlite import SqliteStateStore
from tests.gateway.state.test_state_conformance import BACKENDS, Clock, backend_url, build_store

ROOM = "discord:1100"
OTHER = "discord:2200"
NOW = 1_800_000_000.0  # a wall-clock instant: the feed's times are wall time


@pytest.fixture
def clock() -> Clock:
    """The stores' clock, on the feed's wall-clock scale."""
    return Clock(NOW)


@pytest.fixture(params=BACKENDS)
async def store(
    request: pytest.FixtureRequest, clock: Clock, tmp_path: Path
) -> AsyncIterator[StateStore]:
    """A started store of each backend."""
    backend: str = request.param
    built = build_store(backend, clock, workdir=tmp_path, redis_url=backend_url(request, backend))
    await built.start()
    try:
        yield built
    finally:
        await built.aclose()


def event(
    kind: Kind = "refusal",
    *,
    at: float = NOW,
    room: str = ROOM,
    bot: str = "parrot",
    stage: str = "bot_loop",
    message: str = "m1",
    text: str = "hello",
    code: str = "code",
) -> ActivityEvent:
    """An event as the feed hands it over (id 0)."""
    return ActivityEvent(0, at, room, bot, "echo", kind, stage, code, "detail", text, message)


def numbered(count: int, *, room: str = ROOM, start: int = 0) -> list[ActivityEvent]:
    """`count` notices with distinct message keys and texts."""
    return [
        event("notice", room=room, message=f"n{start + i}", text=f"t{start + i}")
        for i in range(count)
    ]


async def test_issue12_events_come_back_in_order_with_consecutive_ids(store: StateStore) -> None:
    await store.activity_append(numbered(5))
    events, cursor = await store.activity_since(None, 3)
    assert [e.excerpt for e in events] == ["t2", "t3", "t4"]
    ids = [e.id for e in events]
    assert ids == list(range(ids[0], ids[0] + 3))
    assert cursor == ids[-1]
    first = ids[0] - 2
    after, following = await store.activity_since(first, 2)
    assert [e.excerpt for e in after] == ["t1", "t2"]
    assert following == first + 2, "a full page: the next read starts after its last event"
    rest, following = await store.activity_since(first + 2, 10)
    assert [e.excerpt for e in rest] == ["t3", "t4"]
    assert following == ids[-1]
    assert await store.activity_since(ids[-1], 10) == ([], ids[-1])
    assert events[0] == event("notice", message="n2", text="t2").stored(ids[0])


async def test_issue12_an_empty_feed_and_a_cursor_beyond_it(store: StateStore) -> None:
    assert await store.activity_since(None, 10) == ([], None)
    assert await store.activity_since(99, 10) == ([], None)
    await store.activity_append(numbered(2))
    events, cursor = await store.activity_since(10**17, 10)
    assert [e.excerpt for e in events] == ["t0", "t1"], "read as no cursor: the newest"
    assert cursor == events[-1].id


async def test_issue12_a_message_in_is_kept_once_per_message_key(store: StateStore) -> None:
    await store.activity_append([event("in", bot="parrot"), event("in", bot="echo")])
    await store.activity_append([event("in", bot="third"), event("in", message="m2")])
    events, _ = await store.activity_since(None, 10)
    assert [(e.bot, e.message) for e in events] == [("parrot", "m1"), ("parrot", "m2")]
    (minute, *_) = await store.activity_series("hour", NOW)
    assert (await store.activity_series("hour", NOW))[-1].messages_in == 2
    assert minute.messages_in == 0
    await store.activity_append([event("refusal", message="m1"), event("refusal", message="m1")])
    events, _ = await store.activity_since(None, 10)
    assert len(events) == 4, "only a message in is kept once: each refusal is a decision"


async def test_issue12_one_rooms_events(store: StateStore) -> None:
    await store.activity_append(
        [*numbered(3, room=ROOM), *numbered(3, room=OTHER, start=3), *numbered(1, start=6)]
    )
    events, cursor = await store.activity_since(None, 2, ROOM)
    assert [e.excerpt for e in events] == ["t2", "t6"]
    everything, newest = await store.activity_since(None, 100)
    assert cursor == newest
    start = everything[0].id - 1
    mine, following = await store.activity_since(start, 2, OTHER)
    assert [e.excerpt for e in mine] == ["t3", "t4"]
    assert following == mine[-1].id
    rest, following = await store.activity_since(following, 10, OTHER)
    assert [e.excerpt for e in rest] == ["t5"]
    assert following == newest, "past every event of the room: the newest id held"
    assert await store.activity_since(None, 5, "discord:nobody") == ([], newest)


async def test_issue12_a_room_name_that_looks_like_part_of_a_record(store: StateStore) -> None:
    tricky = 'discord:a","b'
    await store.activity_append([event("notice", room=tricky), event("notice", room="discord:a")])
    events, _ = await store.activity_since(None, 10, tricky)
    assert [e.room for e in events] == [tricky]
    events, _ = await store.activity_since(0, 10, "discord:a")
    assert [e.room for e in events] == ["discord:a"]


async def test_issue12_the_chart_counts_per_minute_and_hour_by_guard(store: StateStore) -> None:
    minute = int(NOW // 60) * 60
    batch = [
        event("in", at=minute + 1, message="a"),
        event("in", at=minute + 2, message="b", room=OTHER),
        event("reply", at=minute + 3, stage="delivery"),
        event("refusal", at=minute + 4, stage="bot_loop"),
        event("refusal", at=minute + 5, stage="bot_loop", room=OTHER),
        event("refusal", at=minute + 6, stage="admission"),
        # Routine: every hosted bot turns away what is not meant for it; listed, not counted.
        event("refusal", at=minute + 6, stage="admission", code="not_addressed"),
        event("shadow", at=minute + 7, stage="bot_loop"),
        event("notice", at=minute + 8, stage="admin"),
        event("in", at=minute - 60 * 5, message="c"),
        event("refusal", at=minute - 3_600 * 3, stage="dedupe"),
    ]
    await store.activity_append(batch)
    now = minute + 30
    hour = await store.activity_series("hour", now)
    assert len(hour) == 60
    assert [b.t for b in hour] == [minute - 60 * back for back in range(59, -1, -1)]
    assert hour[-1].as_json() == {
        "t": minute,
        "in": 2,
        "out": 1,
        "refusals": {"bot_loop": 2, "admission": 1},
    }
    assert hour[-6].messages_in == 1
    assert sum(b.messages_in for b in hour) == 3, "three hours ago is not in the last hour"
    mine = await store.activity_series("hour", now, ROOM)
    assert mine[-1].as_json()["refusals"] == {"bot_loop": 1, "admission": 1}
    assert mine[-1].messages_in == 1
    day = await store.activity_series("day", now)
    assert len(day) == 24
    assert day[-1].t == int(now // 3_600) * 3_600
    assert day[-1].messages_in + day[-2].messages_in == 3
    assert sum(sum((b.refusals or {}).values()) for b in day) == 4
    expected: Counter[tuple[str, int, str, str]] = Counter()
    for counted, n in activity.tallies(batch).items():
        expected.update(dict.fromkeys(activity.counters(counted), n))
    day_total = sum(n for (res, _, room, _), n in expected.items() if res == "h" and room == TOTAL)
    assert sum(b.messages_in + b.replies_out + sum((b.refusals or {}).values()) for b in day) == (
        day_total
    )


async def test_issue12_memory_counts_and_keeps_a_batch_as_its_events_one_by_one() -> None:
    minute = int(NOW // 60) * 60
    batch = [
        event("in", at=minute - 1, message="a"),
        event("reply", at=minute - 0.5, stage="delivery"),
        event("in", at=minute, message="a"),  # the same message again: kept once
        event("refusal", at=minute + 59.5, stage="bot_loop", room=OTHER),
        event("in", at=minute + 60, message="b", room=OTHER),
        event("in", at=minute + 61 + SEEN_SECONDS, message="a"),  # by its own time: forgotten
    ]
    batched, one_by_one = MemoryStateStore(), MemoryStateStore()
    await batched.activity_append(batch)
    for each in batch:
        await one_by_one.activity_append([each])
    now = minute + 61 + SEEN_SECONDS
    spans: list[tuple[Span, str | None]] = [("hour", None), ("hour", OTHER), ("day", ROOM)]
    for span, room in spans:
        series = await batched.activity_series(span, now, room)
        assert series == await one_by_one.activity_series(span, now, room), (span, room)
    assert await batched.activity_since(None, 10) == await one_by_one.activity_since(None, 10)
    kept, _ = await batched.activity_since(None, 10)
    assert [e.message for e in kept if e.kind == "in"] == ["a", "b", "a"]
    assert await batched.activity_rooms() == await one_by_one.activity_rooms()


async def test_issue12_every_room_seen_newest_first(store: StateStore) -> None:
    await store.activity_append([event(room=ROOM, at=NOW - 10), event(room=OTHER, at=NOW - 5)])
    await store.activity_append([event(room=ROOM, at=NOW)])
    assert await store.activity_rooms() == [(ROOM, NOW), (OTHER, NOW - 5)]


async def test_issue12_the_feed_keeps_the_newest_events_only(store: StateStore) -> None:
    await store.activity_append(numbered(EVENTS_KEEP + 25))
    events, _ = await store.activity_since(0, 5)
    _, newest = await store.activity_since(None, 1)
    assert newest is not None
    assert events[0].id == newest - EVENTS_KEEP + 1
    assert events[0].excerpt == "t25"


async def test_issue12_sqlite_forgets_events_older_than_a_day(tmp_path: Path) -> None:
    clock = Clock(NOW)
    store = SqliteStateStore(tmp_path / "state.sqlite3", clock=clock)
    await store.start()
    try:
        await store.activity_append([event("notice", at=NOW - 90_000, message="old")])
        await store.activity_append([event("notice", at=NOW, message="new")])
        events, _ = await store.activity_since(None, 10)
        assert [e.message for e in events] == ["new"]
    finally:
        await store.aclose()


async def test_issue12_sqlite_skips_an_unreadable_row(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite3"
    store = SqliteStateStore(path, clock=Clock(NOW))
    await store.start()
    try:
        await store.activity_append([event("notice", message="a")])
        with sqlite3.connect(path) as db:
            db.execute(
                "INSERT INTO activity (at, room, event) VALUES (?, ?, ?)", (NOW, ROOM, "[not json")
            )
        await store.activity_append([event("notice", message="b")])
        events, _ = await store.activity_since(None, 10)
        assert [e.message for e in events] == ["a", "b"]
    finally:
        await store.aclose()


@pytest.mark.redis
async def test_issue12_two_replicas_on_one_redis_share_one_feed(redis_url: str) -> None:
    clock = Clock(NOW)
    one = RedisStateStore(redis_url, key_prefix="replicas12:", clock=clock)
    two = RedisStateStore(redis_url, key_prefix="replicas12:", clock=clock)
    await one.start()
    await two.start()
    try:
        await one.activity_append([event("in", bot="parrot", message="m1"), event("reply")])
        await two.activity_append([event("in", bot="echo", message="m1"), event("refusal")])
        await two.activity_append([event("in", bot="echo", message="m2", room=OTHER)])
        seen_one, cursor_one = await one.activity_since(None, 10)
        seen_two, cursor_two = await two.activity_since(None, 10)
        assert seen_one == seen_two
        assert cursor_one == cursor_two
        assert [e.kind for e in seen_one] == ["in", "reply", "refusal", "in"]
        for store in (one, two):
            (bucket,) = (await store.activity_series("hour", NOW))[-1:]
            assert (bucket.messages_in, bucket.replies_out) == (2, 1)
            assert bucket.refusals == {"bot_loop": 1}
            assert [room for room, _ in await store.activity_rooms()] == [OTHER, ROOM]
    finally:
        await one.aclose()
        await two.aclose()


@pytest.mark.redis
async def test_issue12_redis_skips_an_unreadable_entry(redis_url: str) -> None:
    store = RedisStateStore(redis_url, key_prefix="garbage12:", clock=Clock(NOW))
    await store.start()
    client: Redis = Redis.from_url(redis_url, decode_responses=True)
    try:
        await store.activity_append([event("notice", message="a")])
        await client.rpush("garbage12:{act}:log", "2 [not json")
        await client.incr("garbage12:{act}:id")
        await store.activity_append([event("notice", message="b")])
        events, cursor = await store.activity_since(None, 10)
        assert [e.message for e in events] == ["a", "b"]
        assert cursor == 3
    finally:
        await client.aclose()
        await store.aclose()
