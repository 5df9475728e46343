"""The first refusal of a call, kept a few seconds, so a client's retry gets the same answer.

A refused call opens a pause; a client that retries it anyway (litellm's `num_retries`,
its Router, LangChain's `max_retries`) would then be told `loop_paused`, and the error it
finally raises would hide why: `loop_detected`. So a `loop_paused` answer for the same
fingerprint on the same circuit within `keep` seconds of the first refusal repeats that
refusal's code and message instead (with the pause's remaining time). Kept per process:
a retry that lands on another replica gets `loop_paused`.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import replace

from guards.call_loop import CallDecision

KEEP_SECONDS = 10.0
MAX_KEPT = 10_000


class FirstRefusals:
    """The recent first refusals by (circuit, fingerprint), oldest first, bounded."""

    def __init__(
        self,
        *,
        keep: float = KEEP_SECONDS,
        limit: int = MAX_KEPT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._keep = keep
        self._limit = limit
        self._clock = clock
        self._kept: OrderedDict[tuple[str, str], tuple[float, CallDecision]] = OrderedDict()

    def answer(self, circuit: str, fingerprint: str, decision: CallDecision) -> CallDecision:
        """The refusal to give: `decision`, or for a quick retry the first refusal's."""
        now = self._clock()
        while self._kept:
            at, _ = next(iter(self._kept.values()))
            if now - at < self._keep:
                break
            self._kept.popitem(last=False)
        key = (circuit, fingerprint)
        if decision.code != "loop_paused":
            self._kept[key] = (now, decision)
            self._kept.move_to_end(key)
            if len(self._kept) > self._limit:
                self._kept.popitem(last=False)
            return decision
        kept = self._kept.get(key)
        if kept is None:
            return decision
        return replace(kept[1], retry_after=decision.retry_after)
