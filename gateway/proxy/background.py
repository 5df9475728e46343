"""The proxy's background tasks (spend charges, alert deliveries) at shutdown.

Decisions where DESIGN.md is silent:
- A task still running when the drain's time is up is cancelled and given one more
  second to unwind (its `finally` blocks, a connection's close), then left.
"""

from __future__ import annotations

import asyncio
from collections.abc import Set
from typing import Any

UNWIND_SECONDS = 1.0


async def drain(tasks: Set[asyncio.Task[Any]], seconds: float) -> int:
    """Let `tasks` finish for up to `seconds`, cancel the rest; how many were cancelled."""
    if not tasks:
        return 0
    _, late = await asyncio.wait(set(tasks), timeout=seconds)
    for task in late:
        task.cancel()
    if late:
        await asyncio.wait(late, timeout=UNWIND_SECONDS)
    return len(late)
