"""The request log: entries with reported or estimated tokens, written after the call (issue 10)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import pytest

from gateway.calls.entry import CallLogEntry
from gateway.calls.store import MemoryCallStore
from gateway.config.proxy import Price
from gateway.proxy.auth import ProxyClient
from gateway.proxy.calls import ProxiedCall, build_call
from gateway.proxy.openai import OpenAIProvider
from gateway.proxy.pricing import PriceTable
from gateway.proxy.provider import GuardedCall, Usage
from gateway.proxy.request_log import BATCH_MAX, RequestLog, log_entry
from tests.gateway.proxy.proxy_helpers import MODEL


class Ticks:
    """An injected clock that moves only when told."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def prices() -> PriceTable:
    return PriceTable({"gpt-4o*": Price(input_per_1k=1.0, output_per_1k=2.0)}, 100)


def a_call(text: str = "hi", *, started: float = 0.0) -> ProxiedCall:
    described = GuardedCall(MODEL, [{"role": "user", "content": text}], stream=False)
    client = ProxyClient(agent="billing-bot", root="billing-bot")
    headers = {"X-Loopwarden-Customer": "acme"}
    return build_call(OpenAIProvider(), client, headers, described, size=400, started=started)


def test_issue10_reported_tokens_are_kept_and_missing_ones_estimated() -> None:
    call = a_call()
    reported = log_entry(
        call, prices(), "forwarded", 200, Usage(11, 7), at=5.0, duration_ms=1.5, rule=None
    )
    assert (reported.input_tokens, reported.output_tokens, reported.estimated) == (11, 7, False)
    assert reported.cost == pytest.approx((11 * 1.0 + 7 * 2.0) / 1000)
    assert (reported.at, reported.duration_ms, reported.circuit) == (5.0, 1.5, "billing-bot")
    assert dict(reported.fields) == {"customer": "acme", "agent": "billing-bot", "model": MODEL}
    # A refused call: 400 bytes ≈ 100 input tokens, the default output size.
    refused = log_entry(
        call, prices(), "duplicate_call", None, None, at=5.0, duration_ms=0.1, rule="once"
    )
    assert (refused.input_tokens, refused.output_tokens, refused.estimated) == (100, 100, True)
    assert refused.rule == "once"
    half = log_entry(call, prices(), "forwarded", 200, Usage(11, None), at=5.0, duration_ms=1.0)
    assert (half.input_tokens, half.output_tokens, half.estimated) == (11, 100, True)


async def test_issue10_entries_are_written_after_the_call_in_order_with_their_duration() -> None:
    store = MemoryCallStore(wall_clock=lambda: 1_000.0)
    timer = Ticks(10.0)
    request_log = RequestLog(store, prices(), wall_clock=lambda: 999.0, timer=timer)
    for n in range(3):
        call = a_call(f"call {n}", started=request_log.started())
        timer.now += 0.25
        request_log.record(call, "forwarded", 200, Usage(11, 7))
    # Queued, not yet written: the response is not delayed by the store.
    assert request_log.pending == 3
    assert await store.calls_since(60) == []
    await request_log.settle()
    logged = await store.calls_since(60)
    assert request_log.pending == 0
    assert [entry.duration_ms for entry in logged] == [250.0, 250.0, 250.0]
    assert len({entry.fingerprint for entry in logged}) == 3
    assert [entry.at for entry in logged] == [999.0, 999.0, 999.0]


class Counting(MemoryCallStore):
    """A store that counts the entries of each log write."""

    def __init__(self) -> None:
        super().__init__(wall_clock=lambda: 0.0)
        self.writes: list[int] = []

    async def log_calls(self, entries: Sequence[CallLogEntry]) -> None:
        self.writes.append(len(entries))
        await super().log_calls(entries)


class FailingOnce(Counting):
    """A store whose first log write fails."""

    async def log_calls(self, entries: Sequence[CallLogEntry]) -> None:
        if not self.writes:
            self.writes.append(len(entries))
            raise OSError("disk full")
        await super().log_calls(entries)


async def test_issue10_the_entries_queued_together_are_written_in_one_batch_in_order() -> None:
    store = Counting()
    request_log = RequestLog(store, prices(), wall_clock=lambda: 0.0)
    for n in range(5):
        request_log.record(a_call(f"call {n}"), "forwarded", 200, None)
    await request_log.settle()
    logged = await store.calls_since(60)
    assert store.writes == [5]
    assert [entry.fingerprint for entry in logged] == [
        a_call(f"call {n}").fingerprint for n in range(5)
    ]


async def test_issue10_a_backlog_is_written_in_batches_of_at_most_batch_max() -> None:
    store = Counting()
    request_log = RequestLog(store, prices(), wall_clock=lambda: 0.0)
    for n in range(2 * BATCH_MAX + 3):
        request_log.record(a_call(f"call {n}"), "forwarded", 200, None)
    await request_log.settle()
    assert store.writes == [BATCH_MAX, BATCH_MAX, 3]
    assert len(await store.calls_since(60)) == 2 * BATCH_MAX + 3


async def test_issue10_a_failed_write_loses_its_batch_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = FailingOnce()
    request_log = RequestLog(store, prices(), wall_clock=lambda: 0.0)
    request_log.record(a_call("first"), "forwarded", 200, None)
    request_log.record(a_call("second"), "forwarded", 200, None)
    with caplog.at_level(logging.ERROR, logger="loopwarden.proxy"):
        await request_log.settle()
    request_log.record(a_call("third"), "forwarded", 200, None)
    await request_log.settle()
    assert [entry.fingerprint for entry in await store.calls_since(60)] == [
        a_call("third").fingerprint
    ]
    assert "request-log write of 2 entries (first for billing-bot) failed" in caplog.text


class Stuck(MemoryCallStore):
    """A store whose log writes never finish."""

    async def log_calls(self, entries: Sequence[CallLogEntry]) -> None:
        await asyncio.Event().wait()


async def test_issue10_drain_gives_up_on_writes_that_never_end(
    caplog: pytest.LogCaptureFixture,
) -> None:
    request_log = RequestLog(Stuck(), prices())
    request_log.record(a_call("first"), "forwarded", 200, None)
    request_log.record(a_call("second"), "forwarded", 200, None)
    with caplog.at_level(logging.WARNING, logger="loopwarden.proxy"):
        await request_log.drain(0.01)
    assert request_log.pending == 0
    assert "2 request-log entries not written at shutdown" in caplog.text
    await request_log.settle()  # nothing left to wait for
