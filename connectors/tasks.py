"""The background tasks of one connector: started, kept referenced, cancelled together."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine


class BackgroundTasks:
    """Tasks a connector runs on its own (hand-overs, pollers), held until they end.

    asyncio keeps only weak references to tasks, so a task nobody holds can vanish mid-run;
    this set holds each one until it is done and lets `aclose` cancel whatever still runs.
    """

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()

    def spawn(self, work: Coroutine[object, object, None]) -> None:
        """Run `work` as a task held here until it ends."""
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def cancel(self) -> None:
        """Cancel every task still running and wait until all of them have ended."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)

    def __len__(self) -> int:
        """How many tasks are still running."""
        return len(self._tasks)
