"""The request log: one entry per guarded call, with its tokens and (estimated) cost.

Each guarded call is logged once its response has ended (a refusal at once), with the
SDK's retry number; requests forwarded unguarded (model lists, files) are not logged.
The entry is built when the call ends, and written after the response by one background
writer, so a write never delays the next request on the connection. The writer gathers
the entries of `BATCH_SECONDS` and writes them in order with one `log_calls` (one SQLite
transaction, one Redis pipeline): a transaction's fixed cost, more than an entry's own,
is paid once per batch, not once per call. Tokens are the provider's usage; those it did
not report are estimated (`pricing`), and the entry says so. The gateway's own `openai`
agents log their model calls through a `RequestLog` too (`gateway.agents.openai`): a call
is any `LoggedRequest`, the proxy's `ProxiedCall` or an agent's request. Each entry is
also handed to the log's `metrics` (`CallObserver`: the GenAI client metrics and the
money refusals saved, `gateway.observability.metrics.ModelCallMetrics`; the proxy's
per-call counters, `gateway.proxy.metrics.ProxyMetrics`), so every guarded model call is
counted in this one place.

Decisions where DESIGN.md is silent: a batch holds `BATCH_MAX` entries at most, so one
write never holds the event loop for long, and a full one is written without waiting; a
failed write loses its batch only (logged; a batch Redis does not answer is kept and
written once it answers, gateway.calls.redis_pending); `settle` still waits until every entry
queued before it is written.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Protocol

from gateway.calls.entry import CallLogEntry, CallOutcome
from gateway.calls.store import CallStore
from gateway.observability import tracing
from gateway.proxy.pricing import PriceTable
from gateway.proxy.provider import Usage

log = logging.getLogger("loopwarden.proxy")

BATCH_SECONDS = 0.02
"""How long the writer gathers entries before writing them: some tens of calls at 1,000/s."""
BATCH_MAX = 128
"""Entries per write at most (about 2 ms of SQLite inserts)."""


class LoggedRequest(Protocol):
    """A call as the request log reads it: who sent what, how big, when it started."""

    @property
    def provider_name(self) -> str: ...
    @property
    def agent(self) -> str: ...
    @property
    def session(self) -> str: ...
    @property
    def circuit(self) -> str: ...
    @property
    def model(self) -> str: ...
    @property
    def fingerprint(self) -> str: ...
    @property
    def fields(self) -> Mapping[str, str]: ...
    @property
    def request_bytes(self) -> int: ...
    @property
    def max_output(self) -> int | None: ...
    @property
    def retry(self) -> int: ...
    @property
    def started(self) -> float: ...


def log_entry(
    call: LoggedRequest,
    prices: PriceTable,
    outcome: CallOutcome,
    status: int | None,
    usage: Usage | None,
    *,
    at: float,
    duration_ms: float,
    rule: str | None = None,
) -> CallLogEntry:
    """The call's entry: reported tokens where the provider gave them, estimates elsewhere."""
    model = call.model
    reported = usage or Usage()
    guess_in, guess_out = prices.estimate(model, call.request_bytes, call.max_output)
    input_tokens = guess_in if reported.input_tokens is None else reported.input_tokens
    output_tokens = guess_out if reported.output_tokens is None else reported.output_tokens
    return CallLogEntry(
        at=at,
        provider=call.provider_name,
        agent=call.agent,
        session=call.session,
        circuit=call.circuit,
        model=model,
        outcome=outcome,
        status=status,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cost=prices.cost(model, input_tokens, output_tokens, call.provider_name),
        estimated=reported.input_tokens is None or reported.output_tokens is None,
        fingerprint=call.fingerprint,
        rule=rule,
        retry=call.retry,
        duration_ms=duration_ms,
        fields=call.fields,
    )


class CallObserver(Protocol):
    """Counts each guarded call from its request-log entry."""

    def call_logged(self, entry: CallLogEntry) -> None: ...


class RequestLog:
    """Builds each call's entry and writes the entries to the call store in the background."""

    def __init__(
        self,
        store: CallStore,
        prices: PriceTable,
        *,
        wall_clock: Callable[[], float] = time.time,
        timer: Callable[[], float] = time.perf_counter,
        metrics: CallObserver | None = None,
    ) -> None:
        self._store = store
        self._metrics = metrics
        self._prices = prices
        self._wall_clock = wall_clock
        self._timer = timer
        self._queued: deque[CallLogEntry] = deque()
        self._writing = 0  # entries of the batch being written
        self._writer: asyncio.Task[None] | None = None

    def started(self) -> float:
        """The time a call starts, on the timer its duration is measured with."""
        return self._timer()

    def record(
        self,
        call: LoggedRequest,
        outcome: CallOutcome,
        status: int | None,
        usage: Usage | None,
        *,
        rule: str | None = None,
    ) -> CallLogEntry:
        """Queue the call's entry (and return it); a forwarded call's output feeds estimates.

        With tracing on, the outcome, status and usage go on the call's `chat` span too.
        """
        tracing.call_outcome(outcome, status, usage)
        model = call.model
        if outcome == "forwarded" and usage is not None and usage.output_tokens is not None:
            self._prices.observe(model, usage.output_tokens)
        entry = log_entry(
            call,
            self._prices,
            outcome,
            status,
            usage,
            at=self._wall_clock(),
            duration_ms=round((self._timer() - call.started) * 1000, 3),
            rule=rule,
        )
        log.debug(
            "%s %s %s %s status=%s tokens=%s+%s",
            entry.provider,
            entry.circuit,
            model,
            outcome,
            status,
            entry.input_tokens,
            entry.output_tokens,
        )
        if self._metrics is not None:
            self._metrics.call_logged(entry)
        self._queued.append(entry)
        if self._writer is None:
            self._writer = asyncio.create_task(self._write())
        return entry

    @property
    def pending(self) -> int:
        """Entries queued or being written, not yet written."""
        return len(self._queued) + self._writing

    async def settle(self) -> None:
        """Wait until every entry queued so far is written."""
        while self._writer is not None:
            await asyncio.shield(self._writer)

    async def drain(self, seconds: float) -> None:
        """Write what is queued for up to `seconds`; entries left then are dropped, logged."""
        writer = self._writer
        if writer is None:
            return
        await asyncio.wait({writer}, timeout=seconds)
        if not writer.done():
            writer.cancel()
            lost = len(self._queued) + self._writing
            log.warning("%d request-log entries not written at shutdown", lost)
            self._queued.clear()
            await asyncio.wait({writer}, timeout=1.0)

    async def _write(self) -> None:
        """Write the queued entries in batches, in order, until none is left."""
        queued = self._queued
        try:
            while queued:
                # A full batch goes next time round the loop; a partial one waits for more.
                await asyncio.sleep(0 if len(queued) >= BATCH_MAX else BATCH_SECONDS)
                batch = [queued.popleft() for _ in range(min(len(queued), BATCH_MAX))]
                self._writing = len(batch)
                try:
                    await self._store.log_calls(batch)
                except Exception:  # a lost log line must never take the proxy down
                    log.exception(
                        "request-log write of %d entries (first for %s) failed",
                        len(batch),
                        batch[0].circuit,
                    )
        finally:
            self._writing = 0
            self._writer = None
