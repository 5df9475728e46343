"""Channel positions and the floor, kept in a real state backend's cursor store."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from connectors.mattermost.catchup import Position, parse_position
from connectors.mattermost.cursors import ChannelCursors
from gateway.state.memory import MemoryStateStore
from gateway.state.sqlite import SqliteStateStore

FLOOR_KEY = "mattermost:helper-mm"


def key(channel_id: str) -> str:
    return f"mattermost:helper-mm:{channel_id}"


class GatedStore:
    """A memory store whose writes wait for `gate` and are counted, or fail when `broken`."""

    def __init__(self) -> None:
        self.store = MemoryStateStore()
        self.gate = asyncio.Event()
        self.gate.set()
        self.writes: list[tuple[str, str]] = []
        self.broken = False

    async def cursor_get(self, key: str) -> str | None:
        return await self.store.cursor_get(key)

    async def cursor_set(self, key: str, value: str) -> None:
        await self.gate.wait()
        if self.broken:
            raise OSError("disk full")
        self.writes.append((key, value))
        await self.store.cursor_set(key, value)


async def test_issue23_the_first_start_sets_the_floor_and_a_restart_reads_it(
    tmp_path: Path,
) -> None:
    for now_ms in (1_000, 9_000):
        store = SqliteStateStore(tmp_path / "state.db")
        await store.start()
        cursors = ChannelCursors(store, "helper-mm")
        await cursors.start(now_ms)
        assert cursors.floor == 1_000  # the second start keeps the first start's
        assert await cursors.position("c" * 26) == Position(1_000)
        await store.aclose()


@pytest.mark.parametrize(
    "saved",
    [
        "{",
        "[]",
        '{"floor_ms": -5}',
        '{"floor_ms": true}',
        '{"floor_ms": 1.5}',
        '{"floor_ms": 1e308}',
        '{"floor_ms": Infinity}',
        '{"floor_ms": ' + "9" * 30 + "}",  # past any clock: nothing would ever be answered
        '{"floor_ms": ' + "9" * 5_000 + "}",
        '{"floor_ms": "\u0661\u0662"}',
        "[" * 100_000,
    ],
)
async def test_issue23_a_floor_that_is_not_one_counts_as_a_first_start(saved: str) -> None:
    store = MemoryStateStore()
    await store.cursor_set(FLOOR_KEY, saved)
    cursors = ChannelCursors(store, "helper-mm")
    await cursors.start(7_000)
    assert cursors.floor == 7_000
    assert json.loads(await store.cursor_get(FLOOR_KEY) or "") == {"floor_ms": 7_000}


async def test_issue23_a_held_channel_is_saved_before_the_floor_moves_past_it() -> None:
    store = MemoryStateStore()
    cursors = ChannelCursors(store, "helper-mm")
    await cursors.start(1_000)
    cursors.hold("c" * 26, await cursors.position("c" * 26))
    await cursors.set_floor(5_000)
    # A crash now: the restart reads the channel from where its caught-up posts began.
    restarted = ChannelCursors(store, "helper-mm")
    await restarted.start(9_000)
    assert await restarted.position("c" * 26) == Position(1_000)
    assert await restarted.position("d" * 26) == Position(5_000)


async def test_issue23_a_burst_of_posts_costs_a_few_writes_and_the_newest_is_saved() -> None:
    gated = GatedStore()
    cursors = ChannelCursors(gated, "helper-mm")
    await cursors.start(0)
    gated.writes.clear()
    gated.gate.clear()
    cursors.advance("c" * 26, 1, "post1")
    await asyncio.sleep(0)  # its write has begun, and waits
    for n in range(2, 51):
        cursors.advance("c" * 26, n, f"post{n}")
    gated.gate.set()
    await cursors.flush()
    assert [json.loads(value)["at"] for _, value in gated.writes] == [1, 50]
    assert parse_position(await gated.cursor_get(key("c" * 26))) == Position(
        50, frozenset({"post50"})
    )


async def test_issue23_a_failed_write_is_logged_and_the_next_post_writes_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gated = GatedStore()
    cursors = ChannelCursors(gated, "helper-mm")
    await cursors.start(0)
    gated.broken = True
    cursors.advance("c" * 26, 10, "a")
    await cursors.flush()
    assert "could not save a position (OSError)" in caplog.text
    assert "disk full" not in caplog.text
    gated.broken = False
    cursors.advance("c" * 26, 11, "b")
    await cursors.flush()
    assert parse_position(await gated.cursor_get(key("c" * 26))) == Position(11, frozenset({"b"}))


async def test_issue23_positions_in_memory_are_bounded_and_a_forgotten_one_stays_saved() -> None:
    store = MemoryStateStore()
    cursors = ChannelCursors(store, "helper-mm", max_channels=2)
    await cursors.start(0)
    for n, channel in enumerate(("a" * 26, "b" * 26, "c" * 26), start=1):
        cursors.advance(channel, n, f"post{n}")
    await cursors.flush()
    assert len(cursors) == 2
    assert await cursors.position("a" * 26) == Position(1, frozenset({"post1"}))
