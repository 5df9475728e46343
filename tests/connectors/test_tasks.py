"""BackgroundTasks: connector tasks are held while they run and cancelled together."""

from __future__ import annotations

import asyncio

from connectors.tasks import BackgroundTasks


async def test_a_task_is_held_until_it_ends() -> None:
    tasks = BackgroundTasks()
    release = asyncio.Event()
    done: list[str] = []

    async def work() -> None:
        await release.wait()
        done.append("work")

    tasks.spawn(work())
    assert len(tasks) == 1
    release.set()
    async with asyncio.timeout(10):
        while len(tasks):  # noqa: ASYNC110 - the task ends on its own
            await asyncio.sleep(0)
    assert done == ["work"]


async def test_cancel_ends_every_running_task_and_waits_for_it() -> None:
    tasks = BackgroundTasks()
    unwound: list[int] = []

    async def forever(n: int) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            unwound.append(n)

    for n in range(3):
        tasks.spawn(forever(n))
    await asyncio.sleep(0)  # let them start, so their `finally` runs on cancel
    await tasks.cancel()
    assert sorted(unwound) == [0, 1, 2]
    assert len(tasks) == 0
    await tasks.cancel()  # nothing left: a no-op
