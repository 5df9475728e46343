"""Lanes: one channel's items in order, channels in parallel, bounded, forgotten when idle."""

from __future__ import annotations

import asyncio

from connectors.lanes import Lanes
from tests.connectors.connector_helpers import wait_for


class Recorder:
    """A lane handler that records items and holds the ones it is told to."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.hold: dict[str, asyncio.Event] = {}

    async def __call__(self, item: str) -> None:
        self.seen.append(item)
        gate = self.hold.get(item)
        if gate is not None:
            await gate.wait()


async def test_issue10_one_channel_is_handled_in_order_while_channels_run_in_parallel() -> None:
    record = Recorder()
    lanes = Lanes(record)
    record.hold["a1"] = asyncio.Event()
    for key, item in [("a", "a1"), ("a", "a2"), ("b", "b1"), ("a", "a3"), ("b", "b2")]:
        assert lanes.put(key, item)
    # a1 holds lane a; lane b runs past it.
    await wait_for(lambda: record.seen == ["a1", "b1", "b2"])
    assert len(lanes) == 1
    record.hold["a1"].set()
    await lanes.join()
    assert record.seen == ["a1", "b1", "b2", "a2", "a3"]
    assert len(lanes) == 0  # idle lanes are forgotten


async def test_issue10_lanes_are_bounded_per_channel_and_in_all() -> None:
    record = Recorder()
    lanes = Lanes(record, per_lane=2, total=3)
    record.hold["a0"] = record.hold["b0"] = asyncio.Event()
    assert lanes.put("a", "a0")
    assert lanes.put("b", "b0")
    await wait_for(lambda: record.seen == ["a0", "b0"])  # both taken: none waiting
    assert lanes.put("a", "a1")
    assert lanes.put("a", "a2")
    assert not lanes.put("a", "a3")  # two wait in lane a already
    assert lanes.put("b", "b1")
    assert not lanes.put("c", "c0")  # three wait in all
    record.hold["a0"].set()
    await lanes.join()
    assert sorted(record.seen) == ["a0", "a1", "a2", "b0", "b1"]
    assert lanes.put("c", "c0")  # room again once they were handled
    await lanes.join()


async def test_issue10_aclose_cancels_waiting_items_and_leaves_the_lanes_usable() -> None:
    record = Recorder()
    lanes = Lanes(record)
    record.hold["stuck"] = asyncio.Event()
    lanes.put("a", "stuck")
    lanes.put("a", "never")
    lanes.put("b", "not started")  # its task has not run yet when it is cancelled
    await lanes.aclose()
    assert "never" not in record.seen
    assert len(lanes) == 0
    await asyncio.wait_for(lanes.join(), timeout=1)
    assert lanes.put("a", "again")
    await lanes.join()
    assert record.seen[-1] == "again"
