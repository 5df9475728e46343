"""Delivery: a reply goes out as chunks within the platform limit, in order, exactly once each.

A chunk whose send fails with `DeliveryError(retryable=True)` is sent again after the
error's `retry_after` (honoured exactly, as the platform asked) or, without one, after an
exponential backoff; attempts are bounded. A reply that finally fails is logged with its
channel, length and reason (never its text above DEBUG), counted, and not raised: the
pipeline goes on. Chunks after a failed one are not sent, so a reader never sees a reply
with a hole in it.

Decisions where DESIGN.md is silent:
- Only the first chunk carries `reply_to` (the platform's reply reference); every chunk
  keeps the thread and `ephemeral_to`.
- A `retry_after` above `max_retry_after` (default 300 s) is not waited for: the reply is
  given up at once, because waiting less than asked would only be refused again.
- The first attempt calls the connector directly and tenacity takes over after the first
  transient failure: building a tenacity controller costs about 20 µs, which is more than
  the whole pipeline spends on a message, and almost every send succeeds first time.

A streamed reply (gateway.delivery.streaming) is posted and edited through the same retries
(`attempt`), on the delivery's `clock` and `sleep`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from functools import partial
from typing import TypeVar

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt

from gateway.app.connector import Connector
from gateway.app.errors import DeliveryError, LoopwardenError
from gateway.app.types import Reply
from gateway.delivery.chunking import chunk_text
from gateway.observability.metrics import Metrics

log = logging.getLogger("loopwarden.delivery")

Sleep = Callable[[float], Awaitable[None]]
Clock = Callable[[], float]
_T = TypeVar("_T")


def _transient(exc: BaseException) -> bool:
    return isinstance(exc, DeliveryError) and exc.retryable


class _GiveUpError(LoopwardenError):
    """A chunk could not be sent; the reason is safe to log."""


class Delivery:
    """Sends replies through a connector: chunking, bounded retries, exactly-once chunks."""

    def __init__(
        self,
        metrics: Metrics | None = None,
        *,
        max_attempts: int = 5,
        backoff_initial: float = 1.0,
        backoff_max: float = 30.0,
        max_retry_after: float = 300.0,
        sleep: Sleep = asyncio.sleep,
        clock: Clock = time.monotonic,
    ) -> None:
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {max_attempts}")
        self.metrics = metrics or Metrics()
        self._max_attempts = max_attempts
        self._backoff_initial = backoff_initial
        self._backoff_max = backoff_max
        self._max_retry_after = max_retry_after
        self.sleep = sleep
        self.clock = clock

    async def deliver(self, connector: Connector, channel_id: str, reply: Reply) -> bool:
        """Send every chunk of `reply` in order; True when all were delivered. Never raises."""
        platform = connector.name
        capabilities = connector.capabilities
        chunks = chunk_text(
            reply.text, capabilities.max_message_length, units=capabilities.length_unit
        )
        for index, text in enumerate(chunks):
            part = reply if text is reply.text else self._part(reply, text, index)
            try:
                await self.attempt(platform, partial(connector.send, channel_id, part))
            except Exception as exc:  # a connector bug must not escape into the pipeline
                where = f"{platform}:{channel_id}"
                self.failed(platform, where, reply, f"chunk {index + 1} of {len(chunks)}", exc)
                return False
        if chunks:
            self.metrics.reply_out(platform)
        return True

    @staticmethod
    def _part(reply: Reply, text: str, index: int) -> Reply:
        """One chunk of `reply`: only the first keeps the platform reply reference."""
        return replace(reply, text=text, reply_to=reply.reply_to if index == 0 else None)

    async def attempt(self, platform: str, call: Callable[[], Awaitable[_T]]) -> _T:
        """`call()` (one send or edit), retried while its failure is transient; raises the last."""
        try:
            return await call()
        except DeliveryError as exc:
            if not exc.retryable or self._max_attempts == 1:
                raise
            first = exc
        self.metrics.delivery_retry(platform)
        await self.sleep(self.retry_delay(first))
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self._max_attempts - 1),
            wait=self._tenacity_wait,
            retry=retry_if_exception(_transient),
            sleep=self.sleep,
            before_sleep=lambda state: self._count_retry(platform, state),
            reraise=True,
        )
        result: _T = await retrying(call)
        return result

    def retry_delay(self, exc: DeliveryError) -> float:
        """How long to wait after the first transient failure `exc` (raises past the cap)."""
        return self._delay(exc, retry=1)

    def _tenacity_wait(self, state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome is not None else None
        # Attempt 1 of tenacity is the second send: the first retry was waited for already.
        return self._delay(exc, state.attempt_number + 1)

    def _count_retry(self, platform: str, state: RetryCallState) -> None:
        self.metrics.delivery_retry(platform)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s: send retried after attempt %d", platform, state.attempt_number + 1)

    def _delay(self, exc: BaseException | None, retry: int) -> float:
        """The platform's retry_after when given, else doubling from `backoff_initial`."""
        if isinstance(exc, DeliveryError) and exc.retry_after is not None:
            if exc.retry_after > self._max_retry_after:
                raise _GiveUpError(
                    f"rate limited for {exc.retry_after:.0f} s, longer than the "
                    f"{self._max_retry_after:.0f} s a reply is worth waiting"
                ) from exc
            return max(0.0, exc.retry_after)
        return float(min(self._backoff_max, self._backoff_initial * 2 ** (retry - 1)))

    def failed(self, platform: str, where: str, reply: Reply, part: str, exc: Exception) -> None:
        """Log and count a reply that was not delivered (its text only at DEBUG)."""
        self.metrics.delivery_failure(platform)
        log.warning(
            "%s reply of %d chars not delivered (%s): %s: %s",
            where,
            len(reply.text),
            part,
            type(exc).__name__,
            exc,
        )
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s undelivered text: %r", where, reply.text)
