"""The reconnect backoff of every connector: doubling waits, capped, reset once connected.

tenacity (the project's library for bounded retries of one call: delivery, agents) fits a
call that ends; a connection loop runs until the connector closes and starts over from
the first delay once a connection came up, so this small helper holds that one policy.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

Sleep = Callable[[float], Awaitable[None]]


class Backoff:
    """Waits `first`, then twice as long each time up to `cap`, until `reset`."""

    def __init__(self, first: float, cap: float, *, sleep: Sleep = asyncio.sleep) -> None:
        self.first = first
        self._cap = cap
        self._sleep = sleep
        self._delay = first

    @property
    def delay(self) -> float:
        """The wait the next `wait()` sleeps."""
        return self._delay

    async def wait(self) -> None:
        """Sleep the current delay, then double it (capped)."""
        delay = self._delay
        self._delay = min(delay * 2, self._cap)
        await self._sleep(delay)

    def reset(self) -> None:
        """A connection came up: the next failure waits `first` again."""
        self._delay = self.first
