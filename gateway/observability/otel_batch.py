"""The queue of finished spans and the thread that exports them in batches (tracing on).

The event loop only appends to a bounded deque and tests its length; one thread of its
own (`EXPORT_THREAD`) takes batches off it and hands them to the exporter, on the batch
span processor's schedule and its standard variables: every `OTEL_BSP_SCHEDULE_DELAY`
ms, or as soon as a batch is full (`OTEL_BSP_MAX_EXPORT_BATCH_SIZE`, 2048 unless set;
the SDK's 512 wakes the thread four times as often), at most `OTEL_BSP_MAX_QUEUE_SIZE`
spans waiting. A span that finds the queue full is dropped and counted, as the SDK's
queue does, and the thread logs how many were dropped. Flushes and the final export run
on that thread too, so all of the export's work is in one place (the tracing bench reads
its CPU time).
"""

from __future__ import annotations

import logging
import os
import threading
from collections import deque
from collections.abc import Callable
from contextlib import suppress
from typing import Generic, TypeVar

from opentelemetry.instrumentation.utils import suppress_instrumentation
from opentelemetry.sdk.environment_variables import (
    OTEL_BSP_MAX_EXPORT_BATCH_SIZE,
    OTEL_BSP_MAX_QUEUE_SIZE,
    OTEL_BSP_SCHEDULE_DELAY,
)

log = logging.getLogger(__name__)

EXPORT_THREAD = "loopwarden-span-export"
EXPORT_BATCH = 2048
"""Spans an export posts at most by default: the SDK's 512 wakes the thread 4 times as often."""
DEFAULT_QUEUE = 2048
DEFAULT_DELAY_MS = 5000
FLUSH_TIMEOUT_S = 30.0

Item = TypeVar("Item")


def _env_count(name: str, default: int) -> int:
    """A positive whole number from the variable `name`; `default` when unset or not one."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    # ASCII digits only (int() also reads look-alikes such as "١٢"), and few enough of them
    # that int() takes them: a 5,000-digit value is refused, not raised on.
    if raw.isascii() and raw.isdigit() and len(raw) <= 10 and 0 < int(raw) < 2**31:
        return int(raw)
    log.warning("%s is not a positive whole number; using %d", name, default)
    return default


class SpanBatcher(Generic[Item]):
    """Finished spans queued by `add`, exported in batches by a thread of its own.

    Args:
        export: posts one batch (a failed post is the exporter's to log).
        close: stops the exporter, after the last export.
    """

    def __init__(self, export: Callable[[list[Item]], None], close: Callable[[], None]) -> None:
        self._export_batch = export
        self._close = close
        self.max_queue = _env_count(OTEL_BSP_MAX_QUEUE_SIZE, DEFAULT_QUEUE)
        # At most the queue: a batch larger than the queue would never fill.
        batch = _env_count(OTEL_BSP_MAX_EXPORT_BATCH_SIZE, EXPORT_BATCH)
        self.max_batch = min(batch, self.max_queue)
        self.delay = _env_count(OTEL_BSP_SCHEDULE_DELAY, DEFAULT_DELAY_MS) / 1000
        self.dropped = 0
        self._reported = 0
        self.items: deque[Item] = deque()
        """The spans waiting, oldest first."""
        self.check_at = self.max_batch
        """The queue's length at which `check` is due: a batch, or past `max_queue`."""
        self._wake = threading.Event()
        self._flushes: deque[threading.Event] = deque()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=EXPORT_THREAD, daemon=True)
        self._thread.start()

    def add(self, item: Item) -> None:
        """Queue one finished span: an append and a length test.

        What the event loop's own spans do inline (`gateway.observability.otel`): append
        to `items`, and call `check` when the length reaches `check_at`.
        """
        items = self.items
        items.append(item)
        if len(items) >= self.check_at:
            self.check()

    def check(self) -> None:
        """The queue reached `check_at`: past `max_queue` drop the newest span, and wake
        the thread.

        Woken, the thread takes every full batch, so `check_at` moves past the queue's
        limit until it has (no call a span from a queue that outruns it, as the bench's
        does); it sets `check_at` back to a batch after taking them. It is moved before
        the thread is woken, so the thread's setting back always comes after.
        """
        items = self.items
        if len(items) > self.max_queue:
            with suppress(IndexError):  # the thread may have emptied it since
                items.pop()
                self.dropped += 1
        else:
            self.check_at = self.max_queue + 1
        if not self._wake.is_set():
            self._wake.set()

    def flush(self, timeout: float = FLUSH_TIMEOUT_S) -> bool:
        """Export every queued span now; False when the thread did not finish in `timeout` s."""
        if self._stopping:
            return False
        done = threading.Event()
        self._flushes.append(done)
        self._wake.set()
        return done.wait(timeout)

    def shutdown(self, timeout: float = FLUSH_TIMEOUT_S) -> None:
        """Export what is queued, stop the thread and close the exporter (once)."""
        if self._stopping:
            return
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout)
        self._close()

    def _run(self) -> None:
        """Sleep until the schedule or a full batch, export, and answer waiting flushes."""
        while not self._stopping:
            woken = self._wake.wait(self.delay)
            self._wake.clear()
            flushes = [self._flushes.popleft() for _ in range(len(self._flushes))]
            # Woken by a full batch: only the full batches; by the schedule or a flush: all.
            self._export(everything=not woken or bool(flushes) or self._stopping)
            for done in flushes:
                done.set()
        self._export(everything=True)
        for done in self._flushes:
            done.set()

    def _export(self, *, everything: bool) -> None:
        queue, size = self.items, self.max_batch
        while len(queue) >= size or (everything and queue):
            batch = [queue.popleft() for _ in range(min(size, len(queue)))]
            try:
                with suppress_instrumentation():  # the export's own HTTP is not traced
                    self._export_batch(batch)
            except Exception:  # the thread outlives a failed export, as the SDK's does
                log.exception("exporting %d spans failed", len(batch))
        # Fewer than a batch wait now: the next full batch wakes the thread (the length
        # test is `>=`, so spans added since the last look still do).
        self.check_at = size
        if self.dropped != self._reported:
            log.warning(
                "dropped %d spans: more than %s=%d were waiting for export",
                self.dropped - self._reported,
                OTEL_BSP_MAX_QUEUE_SIZE,
                self.max_queue,
            )
            self._reported = self.dropped
