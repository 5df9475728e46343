"""The SDK-backed tracer (issue 25): what a span costs the event loop, sampling, the queue.

Spans go to the real OTLP/HTTP receiver of `tests/fakes/otlp_receiver.py`; the queue's
own tests drive a `SpanBatcher` with an export function of the test's (a unit test of
the queue). The cost of a span is counted in function calls (`sys.setprofile`), not timed.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import random
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

import pytest

from bench.pipeline_bench import CONFIG, NO_ROOM_MEMORY, Bench, workload
from gateway.app.errors import ConfigError
from gateway.config import TelemetryConfig, parse_config
from gateway.observability import otel, tracing
from gateway.observability.otel_batch import DEFAULT_DELAY_MS, DEFAULT_QUEUE, SpanBatcher
from gateway.observability.telemetry import reset_tracing, setup_tracing
from tests.fakes.otlp_receiver import OtlpReceiver, ReceivedSpan

CALLER_TRACE = "0af7651916cd43dd8448eb211c80319c"
CALLER_SPAN = "b7ad6b7169203331"


async def flushed(receiver: OtlpReceiver) -> dict[str, list[ReceivedSpan]]:
    """Every span finished so far, exported (from a thread: this loop answers the post)."""
    assert await asyncio.to_thread(tracing.tracer().force_flush)
    return receiver.traces()


@contextmanager
def counted_calls() -> Iterator[list[int]]:
    """Counts the Python and C functions called inside the block (in `[0]`)."""
    count = [0]

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event in {"call", "c_call"}:
            count[0] += 1

    # No collection inside: a `gc.callbacks` entry (hypothesis has one) would be counted.
    collecting = gc.isenabled()
    gc.disable()
    sys.setprofile(profile)
    try:
        yield count
    finally:
        sys.setprofile(None)
        if collecting:
            gc.enable()


async def test_issue25_a_span_costs_the_event_loop_a_handful_of_calls(
    receiver: OtlpReceiver,
) -> None:
    # The SDK's own span (start_span, its sampler, BoundedAttributes, the context attach,
    # end and the batch processor) made 151 calls for a root and 139 for a child; a
    # record makes 12 and 13 in a `with` block, an instant span 7 (the counting's own calls
    # aside; 13 and 14 while a helper made the record).
    active = tracing.tracer()
    attributes = {tracing.AGENT_NAME: "parrot", tracing.CONVERSATION_ID: "room:C1"}
    with counted_calls() as root, active.span("message room", attributes, root=True):
        pass
    with active.span("message room", {}, root=True):
        with counted_calls() as child, active.span("invoke_agent parrot", attributes):
            pass
        with counted_calls() as instant:
            active.instant("apply_guardrail bot_loop", attributes)
    assert root[0] <= 25, root
    assert child[0] <= 25, child
    assert instant[0] <= 15, instant
    traces = await flushed(receiver)
    assert sorted(len(spans) for spans in traces.values()) == [1, 3]


async def test_issue25_tracing_adds_few_calls_to_a_message_through_the_pipeline(
    receiver: OtlpReceiver,
) -> None:
    # The bench's pipeline and messages (in each room a human's, then a bot's five): with
    # tracing on a message adds its spans (message, invoke_agent, and apply_guardrail for
    # a bot's) and their attributes, and nothing else: 25 calls a message (28 while a
    # finished span was queued by a call, 35 while the two spans were `with` blocks made by
    # a helper, 37 while a traced turn awaited a second coroutine and a verdict built its
    # span anew; 426 with the SDK's own spans).
    bench = Bench(parse_config(CONFIG + NO_ROOM_MEMORY, env={}))
    messages = workload(3)
    active = tracing.tracer()
    counts: dict[bool, int] = {}
    for traced in (False, True, False, True):  # the first two warm up
        tracing.install(active if traced else tracing.NO_TRACER)
        bench.fresh()
        with counted_calls() as calls:
            await bench.through_pipeline(messages)
        counts[traced] = calls[0]
    tracing.install(active)
    added = (counts[True] - counts[False]) / len(messages)
    assert added <= 27, added
    traces = await flushed(receiver)
    assert len(traces) == 2 * len(messages)
    assert sum(len(spans) for spans in traces.values()) == 2 * (2 * 18 + 5 * 3)


async def test_issue25_a_sampler_that_says_no_records_nothing_but_the_trace_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")
    async with OtlpReceiver() as receiver:
        active = setup_tracing(TelemetryConfig(otlp_endpoint=receiver.endpoint), "test")
        try:
            headers: dict[str, str] = {}
            with active.span("message room", {}, root=True), active.span("chat m", {}):
                active.current().set_attribute(tracing.REQUEST_MODEL, "m")
                assert active.current() is tracing.NO_SPAN
                active.inject(headers)
            assert await asyncio.to_thread(active.force_flush)
        finally:
            await asyncio.to_thread(reset_tracing)
    assert receiver.spans == []
    version, trace_id, span_id, flags = headers["traceparent"].split("-")
    assert (version, flags, len(trace_id), len(span_id)) == ("00", "00", 32, 16)


async def test_issue25_an_unsampled_callers_trace_is_continued_unsampled(
    receiver: OtlpReceiver,
) -> None:
    # The default sampler follows the caller: its "not sampled" holds for every span under.
    active = tracing.tracer()
    unsampled = {"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-00"}
    headers: dict[str, str] = {}
    with active.span("chat m", {}, kind="client", parent=unsampled), active.span("x", {}):
        active.inject(headers)
    sampled = {"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"}
    with active.span("chat m", {}, kind="client", parent=sampled):
        pass
    [spans] = (await flushed(receiver)).values()
    assert [(span.trace_id, span.parent_id) for span in spans] == [(CALLER_TRACE, CALLER_SPAN)]
    assert headers["traceparent"].startswith(f"00-{CALLER_TRACE}-")
    assert headers["traceparent"].endswith("-00")


async def test_issue25_the_ratio_sampler_decides_once_for_a_whole_trace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0.5")
    async with OtlpReceiver() as receiver:
        active = setup_tracing(TelemetryConfig(otlp_endpoint=receiver.endpoint), "test")
        try:
            for _ in range(200):
                with active.span("message room", {}, root=True):
                    with active.span("invoke_agent a", {}), active.span("chat m", {}):
                        pass
                    active.instant("apply_guardrail g", {})
            assert await asyncio.to_thread(active.force_flush)
        finally:
            await asyncio.to_thread(reset_tracing)
    traces = receiver.traces()
    # 200 coin tosses: all heads or all tails is 1 chance in 2**199.
    assert 0 < len(traces) < 200
    assert all(len(spans) == 4 for spans in traces.values())


async def test_issue25_attribute_limits_apply_to_what_is_exported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", "3")
    monkeypatch.setenv("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "2")
    async with OtlpReceiver() as receiver:
        active = setup_tracing(TelemetryConfig(otlp_endpoint=receiver.endpoint), "test")
        try:
            attributes: dict[str, tracing.AttributeValue] = {"a": "x", "b": 1}
            with active.span("message room", attributes, root=True) as started:
                started.set_attribute("c", "later")
            assert await asyncio.to_thread(active.force_flush)
        finally:
            await asyncio.to_thread(reset_tracing)
    [span] = receiver.spans
    # As the SDK's own span: values cut to the length, the oldest attribute dropped.
    assert span.attributes == {"b": 1, "c": "lat"}
    assert attributes == {"a": "x", "b": 1}  # the caller's own, untouched


def test_issue25_a_full_queue_drops_and_says_how_many(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "4")
    exporting, release = threading.Event(), threading.Event()
    exported: list[list[int]] = []

    def export(batch: list[int]) -> None:
        exported.append(batch)
        exporting.set()
        release.wait(10)

    queue: SpanBatcher[int] = SpanBatcher(export, lambda: None)
    assert (queue.max_queue, queue.max_batch) == (4, 4)
    for item in range(4):
        queue.add(item)  # the fourth fills a batch: the thread takes all four
    assert exporting.wait(10)
    for item in range(4, 10):
        queue.add(item)  # four wait while the export is stuck; two find the queue full
    assert queue.dropped == 2
    release.set()
    with caplog.at_level(logging.WARNING, "gateway.observability.otel_batch"):
        assert queue.flush()
        queue.shutdown()
    assert exported == [[0, 1, 2, 3], [4, 5, 6, 7]]
    [warning] = caplog.messages
    assert "dropped 2 spans" in warning
    assert "OTEL_BSP_MAX_QUEUE_SIZE=4" in warning


def test_issue25_a_queue_that_outruns_the_thread_wakes_it_once_a_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "100")
    monkeypatch.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "4")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "3600000")  # only batches and flushes
    exporting, release = threading.Event(), threading.Event()
    exported: list[list[int]] = []
    taken = threading.Condition()

    def export(batch: list[int]) -> None:
        with taken:
            exported.append(batch)
            taken.notify_all()
        exporting.set()
        release.wait(10)

    def batches(count: int) -> bool:
        with taken:
            return taken.wait_for(lambda: len(exported) >= count, 10)

    checks: list[int] = []

    class Counted(SpanBatcher[int]):
        def check(self) -> None:
            checks.append(len(self.items))
            super().check()

    queue = Counted(export, lambda: None)
    for item in range(4):
        queue.add(item)  # a batch: the thread is woken and takes it
    assert exporting.wait(10)
    for item in range(4, 54):
        queue.add(item)  # twelve more batches and two spans, the export stuck: no call
    assert checks == [4]
    release.set()
    # The thread takes the full batches and looks for the next one from then on.
    assert batches(13)
    assert [len(batch) for batch in exported] == [4] * 13
    for _ in range(10_000):  # the thread sets `check_at` back once its last export returns
        if queue.check_at == 4:
            break
        time.sleep(0.001)
    assert queue.check_at == 4
    for item in range(54, 56):
        queue.add(item)  # the two waiting make a batch with these: woken again
    assert batches(14)
    assert exported[-1] == [52, 53, 54, 55]
    assert checks == [4, 4]
    assert queue.dropped == 0
    queue.shutdown()


@pytest.mark.parametrize(
    "value", ["abc", "-5", "0", "1e308", "9" * 5000, "12\x1b[2J", "\u0661\u0662", "nan"]
)
def test_issue25_a_bad_batch_variable_falls_back_to_its_default_naming_it(
    value: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", value)
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", value)
    with caplog.at_level(logging.WARNING, "gateway.observability.otel_batch"):
        queue: SpanBatcher[int] = SpanBatcher(lambda batch: None, lambda: None)
        queue.shutdown()
    assert (queue.delay, queue.max_queue) == (DEFAULT_DELAY_MS / 1000, DEFAULT_QUEUE)
    named = sorted(message.split()[0] for message in caplog.messages)
    assert named == ["OTEL_BSP_MAX_QUEUE_SIZE", "OTEL_BSP_SCHEDULE_DELAY"]
    assert all("\x1b" not in message for message in caplog.messages)


async def test_issue25_a_span_draws_its_ids_only_when_its_context_leaves_the_process(
    receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The hot path draws no id: a span's ids are drawn by the export thread, or by an
    # outbound request that carries them (`inject`), once.
    drawn: list[int] = []

    def counted(bits: int) -> int:
        drawn.append(bits)
        return random.getrandbits(bits)

    monkeypatch.setattr(otel, "getrandbits", counted)
    active = tracing.tracer()
    headers: dict[str, str] = {}
    with active.span("message room", {}, root=True), active.span("invoke_agent parrot", {}):
        active.instant("apply_guardrail bot_loop", {})
        assert drawn == []
        active.inject(headers)
        active.inject(headers)
    assert sorted(drawn) == [64, 64, 128]  # the child's span id, the root's, the trace's
    [spans] = (await flushed(receiver)).values()
    _, trace_id, span_id, _ = headers["traceparent"].split("-")
    [turn] = [span for span in spans if span.name == "invoke_agent parrot"]
    assert (turn.trace_id, turn.span_id) == (trace_id, span_id)


async def test_issue25_ids_drawn_by_the_export_thread_are_the_ones_injected_later(
    receiver: OtlpReceiver,
) -> None:
    # The instant span is exported while its parent is still open: the export thread draws
    # the parent's ids, and the parent's traceparent afterwards carries those same ids.
    active = tracing.tracer()
    headers: dict[str, str] = {}
    with active.span("message room", {}, root=True):
        active.instant("apply_guardrail bot_loop", {})
        [[verdict]] = (await flushed(receiver)).values()
        active.inject(headers)
    [spans] = (await flushed(receiver)).values()
    [root] = [span for span in spans if span.name == "message room"]
    _, trace_id, span_id, _ = headers["traceparent"].split("-")
    assert (verdict.trace_id, verdict.parent_id) == (root.trace_id, root.span_id)
    assert (root.trace_id, root.span_id) == (trace_id, span_id)


@pytest.mark.parametrize(
    "variable", ["OTEL_EXPORTER_OTLP_TIMEOUT", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT"]
)
@pytest.mark.parametrize(
    "setting",
    ["0", "-5", "nan", "inf", "1e308", "9" * 5_000, "\u0661\u0662", "10\x1b[2J", "10000"],
)
def test_issue25_an_absurd_otlp_timeout_is_refused_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, setting: str
) -> None:
    # The SDK would wait `inf` seconds, or 1e308, or take "١٢" as 12; "10000" is the
    # specification's milliseconds, which this SDK reads as seconds (2.8 hours).
    monkeypatch.setenv(variable, setting)
    with pytest.raises(ConfigError) as raised:
        setup_tracing(TelemetryConfig(otlp_endpoint="http://127.0.0.1:9"), "x")
    assert raised.value.path == variable
    assert "a number of seconds from 0.1 to 3,600" in str(raised.value)
    assert "\x1b" not in str(raised.value)
    assert tracing.tracer() is tracing.NO_TRACER


async def test_issue25_a_sane_otlp_timeout_is_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", " 2.5 ")
    active = setup_tracing(TelemetryConfig(otlp_endpoint="http://127.0.0.1:9"), "x")
    try:
        assert active.enabled
    finally:
        await asyncio.to_thread(reset_tracing)
