"""Per-channel ordered lanes: one channel's items handled in order, channels in parallel.

`put(key, item)` queues an item on its channel's lane; a lane with items runs as one task
that hands them to `handle` one at a time and ends when it is empty, so an idle channel
costs nothing. Lanes are bounded: at most `per_lane` items wait in one lane and `total` in
all of them, and `put` answers False instead of queueing beyond that (the connector counts
the drop as `queue_full`), so a flood cannot exhaust memory. `handle` must not raise
(the connectors hand over through `ConnectorRuntime`, which never does); should it, the
lane ends there and its waiting items are let go.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

from connectors.tasks import BackgroundTasks

PER_LANE = 1000
TOTAL = 10_000

T = TypeVar("T")


class Lanes(Generic[T]):
    """Bounded per-key FIFO lanes, each drained by a task of its own while it has items."""

    def __init__(
        self,
        handle: Callable[[T], Awaitable[None]],
        *,
        per_lane: int = PER_LANE,
        total: int = TOTAL,
    ) -> None:
        self._handle = handle
        self._per_lane = per_lane
        self._total = total
        self._lanes: dict[str, deque[T]] = {}
        self._waiting = 0
        self._tasks = BackgroundTasks()
        self._idle = asyncio.Event()
        self._idle.set()

    def put(self, key: str, item: T) -> bool:
        """Queue `item` on lane `key`; False (nothing queued) when the lanes are full."""
        lane = self._lanes.get(key)
        if self._waiting >= self._total or (lane is not None and len(lane) >= self._per_lane):
            return False
        if lane is None:
            lane = self._lanes[key] = deque()
            self._idle.clear()
            self._tasks.spawn(self._drain(key, lane))
        lane.append(item)
        self._waiting += 1
        return True

    async def join(self) -> None:
        """Wait until every lane has handled all of its items."""
        await self._idle.wait()

    async def aclose(self) -> None:
        """Cancel every lane; the items still waiting are let go."""
        await self._tasks.cancel()
        # A lane cancelled before its task first ran never reached its own clean-up.
        self._lanes.clear()
        self._waiting = 0
        self._idle.set()

    def __len__(self) -> int:
        """The lanes with an item waiting or being handled."""
        return len(self._lanes)

    async def _drain(self, key: str, lane: deque[T]) -> None:
        try:
            while lane:
                item = lane.popleft()
                self._waiting -= 1
                await self._handle(item)
        finally:
            self._waiting -= len(lane)
            lane.clear()
            self._lanes.pop(key, None)
            if not self._lanes:
                self._idle.set()
