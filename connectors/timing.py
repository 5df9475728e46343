"""The time a connector runs on, injected as one value: clock, sleep, backoff, typing delay.

Every connector reads the wall clock (`received_at`, signature staleness), sleeps (typing
delay, reconnect waits) and backs off the same way, so it takes one `Timing`; each
platform keeps its own defaults, and tests run a connector on fast or fake time.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from gateway.app.backoff import Backoff, Sleep


@dataclass(frozen=True, slots=True)
class Timing:
    """A connector's clock, sleep, reconnect delays (first, cap) and typing delay."""

    clock: Callable[[], float] = time.time
    sleep: Sleep = asyncio.sleep
    retry_delays: tuple[float, float] = (1.0, 60.0)
    typing_delay: float = 0.0

    def backoff(self) -> Backoff:
        """A fresh reconnect backoff on these delays and this sleep."""
        first, cap = self.retry_delays
        return Backoff(first, cap, sleep=self.sleep)
