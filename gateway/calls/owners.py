"""Who holds budget estimates: a store instance's lease, renewed while it runs (issue 20).

An admitted LLM call holds its estimate in its budget groups until its charge replaces
it. A proxy killed mid-call (SIGKILL, OOM, a lost host) never charges, so its holds would
block the groups until the period's end. Each sqlite and Redis call store is therefore
an owner with a random id (`gateway.state.receipts.new_owner`, as dedupe receipts are):
its holds are counted as its own, and `OwnerLease` renews its lease every third of
`OWNER_SECONDS`. Each renewal also gives back the holds of every owner whose lease has
lapsed (the backend's `beat`), so they return within about `OWNER_SECONDS` and a third
of the kill wherever another instance runs, or as soon as a new one starts. Closing the
store gives back what it still holds (a charge cancelled at shutdown).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from gateway.app.errors import StateError
from gateway.calls.budgets import OWNER_SECONDS

log = logging.getLogger(__name__)


class OwnerLease:
    """Renews an owner's lease while its store runs; `beat(seconds)` is the backend's."""

    def __init__(self, beat: Callable[[float], Awaitable[int]], *, name: str) -> None:
        self._beat = beat
        self._name = name
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Take the lease (giving back the holds of owners already dead), then keep it."""
        await self._renew(OWNER_SECONDS)
        self._task = asyncio.create_task(self._keep(), name=self._name)

    async def stop(self) -> None:
        """Stop renewing and end the lease now, giving back what this owner still holds."""
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await self._renew(0.0)

    async def _keep(self) -> None:
        while True:
            await asyncio.sleep(OWNER_SECONDS / 3)
            await self._renew(OWNER_SECONDS)

    async def _renew(self, seconds: float) -> None:
        try:
            given = await self._beat(seconds)
        except StateError:  # an outage, logged once by the store: the next renewal retries
            return
        except Exception:  # the lease must never take the store down; decisions go on
            log.warning("%s: renewing the budget hold lease failed", self._name, exc_info=True)
            return
        if given:
            log.info("%s: gave back %d budget holds of stopped proxies", self._name, given)
