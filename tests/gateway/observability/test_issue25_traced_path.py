"""The middlewares' traced path (issue 25, round 3): what a traced message costs the loop.

A traced turn is one coroutine (the agent stage's span opens in the coroutine that runs
the turn), and a guard verdict seen before reuses its span's name and attributes. The
turn is driven through the real agent stage with the real tracer exporting to the OTLP
receiver of `tests/fakes/otlp_receiver.py`; the verdict table is a unit test of
`tracing.guardrail` with a tracer that keeps what it is handed.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Iterator, Mapping, MutableMapping
from dataclasses import replace

import pytest

from gateway.app.context import TurnContext
from gateway.app.middlewares.agent_dispatch import AgentDispatchMiddleware, Deadlines
from gateway.app.middlewares.errors import ErrorsMiddleware
from gateway.app.refusals import DecisionLog, RecentRefusals
from gateway.app.types import AgentResult, InboundMessage, Reply
from gateway.config import PipelineConfig
from gateway.observability import tracing
from gateway.observability.metrics import Metrics
from tests.fakes.inmemory import ConstantAgent, PipelineRig, rig_config
from tests.fakes.otlp_receiver import OtlpReceiver


class HeldAgent:
    """Answers "hi" once let go; says when its turn has begun."""

    def __init__(self) -> None:
        self.begun = asyncio.Event()
        self.go = asyncio.Event()

    async def respond(self, turn: TurnContext) -> AgentResult:
        self.begun.set()
        await self.go.wait()
        return AgentResult("hi")

    async def aclose(self) -> None:
        """Nothing to close."""


async def test_issue25_a_traced_turn_is_one_coroutine(receiver: OtlpReceiver) -> None:
    agent = HeldAgent()
    rig = PipelineRig(rig_config(), {"parrot": agent})
    await rig.start()
    connector = rig.connector()
    stage = AgentDispatchMiddleware(PipelineConfig(), DecisionLog(Metrics(), RecentRefusals()))
    ctx = rig.turn(connector.message("hello"))

    async def innermost(ctx: TurnContext) -> Reply | None:
        raise AssertionError("the agent stage calls no further stage")

    pending = stage(ctx, innermost)
    assert inspect.iscoroutine(pending)
    assert pending.cr_code is AgentDispatchMiddleware._traced.__code__
    task = asyncio.ensure_future(pending)
    await agent.begun.wait()
    # The traced turn awaits the deadline's watch over the agent itself, not a second
    # coroutine of the stage's that does.
    assert pending.cr_await is not None
    assert pending.cr_await.cr_code is Deadlines.run.__code__
    agent.go.set()
    reply = await task
    assert reply is not None
    assert reply.text == "hi"
    assert await asyncio.to_thread(tracing.tracer().force_flush)
    [trace] = receiver.traces().values()
    [turn] = trace
    assert turn.name == "invoke_agent parrot"
    assert turn.attributes[tracing.CONVERSATION_ID] == ctx.message.room


class Kept:
    """A tracer that keeps each instant span it is handed (a unit test's stand-in)."""

    enabled = True
    capture_content = False

    def __init__(self) -> None:
        self.instants: list[tuple[str, tracing.Attributes]] = []
        self.spans: list[tuple[str, tracing.Attributes]] = []

    def span(
        self,
        name: str,
        attributes: tracing.Attributes,
        *,
        kind: tracing.SpanKind = "internal",
        parent: Mapping[str, str] | None = None,
        root: bool = False,
    ) -> tracing.OpenSpan:
        self.spans.append((name, attributes))
        return tracing.NO_SPAN

    def instant(self, name: str, attributes: tracing.Attributes) -> None:
        self.instants.append((name, attributes))

    def current(self) -> tracing.Span:
        return tracing.NO_SPAN

    def inject(self, headers: MutableMapping[str, str]) -> None:
        """Nothing to write."""

    def force_flush(self) -> bool:
        return True

    def shutdown(self) -> None:
        """Nothing to stop."""


@pytest.fixture
def kept() -> Iterator[Kept]:
    tracer = Kept()
    tracing.install(tracer)
    try:
        yield tracer
    finally:
        tracing.install(tracing.NO_TRACER)


def test_issue25_a_verdict_seen_before_reuses_its_span(kept: Kept) -> None:
    for _ in range(2):
        tracing.guardrail("bot_loop", "ok", tracing.ALLOWED, shadow=False, detail="within")
    tracing.guardrail("bot_loop", "ok", tracing.ALLOWED, shadow=True, detail="within")
    tracing.guardrail("call_loop", "loop_detected", tracing.REFUSED, shadow=False)
    first, again, shadowed, bare = kept.instants
    assert first[0] == "apply_guardrail bot_loop"
    assert again[0] is first[0]
    assert again[1] is first[1]  # built once
    assert first[1] == {
        tracing.OPERATION_NAME: tracing.APPLY_GUARDRAIL,
        tracing.GUARDRAIL_NAME: "bot_loop",
        tracing.GUARDRAIL_CODE: "ok",
        tracing.GUARDRAIL_RESULT: tracing.ALLOWED,
        tracing.GUARDRAIL_SHADOW: False,
        tracing.DETAIL: "within",
    }
    assert shadowed[1][tracing.GUARDRAIL_SHADOW] is True
    assert bare[0] == "apply_guardrail call_loop"
    assert tracing.DETAIL not in bare[1]


def test_issue25_a_verdicts_words_are_one_line_and_the_table_stays_bounded(kept: Kept) -> None:
    tracing.guardrail(
        "bot_loop", "budget_exceeded", tracing.REFUSED, shadow=False, detail="a\n\u202eb"
    )
    [(_, attributes)] = kept.instants
    assert attributes[tracing.DETAIL] == "a\\n\\u202eb"
    # Words that carry a count make a new verdict each time: the table starts over when full.
    for event in range(5_000):
        detail = f"event {event} over 20 per 60 s"
        tracing.guardrail(
            "bot_loop", "budget_exceeded", tracing.REFUSED, shadow=False, detail=detail
        )
    assert len(tracing._GUARDRAILS) <= tracing._GUARDRAILS_KEPT  # noqa: SLF001 - its bound
    assert kept.instants[-1][1][tracing.DETAIL] == "event 4999 over 20 per 60 s"


async def test_issue25_turns_in_one_room_share_their_spans_name_and_attributes(
    kept: Kept,
) -> None:
    rig = PipelineRig(rig_config(), {"parrot": ConstantAgent("hi")})
    await rig.start()
    connector = rig.connector()
    stage = AgentDispatchMiddleware(PipelineConfig(), DecisionLog(Metrics(), RecentRefusals()))

    async def turn(channel: str) -> None:
        ctx = rig.turn(connector.message("hello", channel_id=channel))
        assert await stage(ctx, rig.handler) is not None

    await turn("C1")
    await turn("C1")
    await turn("C2")
    kept.capture_content = True
    await turn("C1")
    first, again, other, captured = kept.spans
    assert first[0] == "invoke_agent parrot"
    assert again[1] is first[1]  # built once for the room
    assert first[1] == {
        tracing.OPERATION_NAME: tracing.INVOKE_AGENT,
        tracing.AGENT_NAME: "parrot",
        tracing.CONVERSATION_ID: "room:C1",
    }
    assert other[1][tracing.CONVERSATION_ID] == "room:C2"
    # The message text goes on a copy: the room's kept attributes stay without it.
    assert tracing.INPUT_MESSAGES in captured[1]
    assert tracing.INPUT_MESSAGES not in first[1]


def test_issue25_a_messages_room_is_made_once() -> None:
    msg = InboundMessage("slack", "parrot", "C1", None, "m1", "U1", "alice", False, "hi")
    assert msg.room == "slack:C1"
    assert msg.room is msg.room  # stored with the message, not made at each read
    moved = replace(msg, channel_id="C2")
    assert moved.room == "slack:C2"
    assert "room" not in repr(msg)  # derived: shown and compared through its parts
    assert replace(msg, text="other") != msg
    assert replace(msg) == msg


async def message_turn(msg: InboundMessage) -> TurnContext:
    """A turn of `msg` to the rig's parrot."""
    rig = PipelineRig(rig_config(), {"parrot": ConstantAgent("hi")})
    await rig.start()
    return rig.turn(msg)


async def answers(ctx: TurnContext) -> Reply | None:
    return Reply("hi")


async def fails(ctx: TurnContext) -> Reply | None:
    raise ValueError("a user's words")


MESSAGE_ATTRIBUTES = {
    tracing.PLATFORM: "slack",
    tracing.ROOM: "slack:C1",
    tracing.BOT: "parrot",
    tracing.MESSAGE_ID: "m1",
    tracing.SENDER_IS_BOT: True,
}


async def test_issue25_a_message_spans_attributes_are_read_off_the_message(
    receiver: OtlpReceiver,
) -> None:
    """The root span's attributes, read at the export, are all five, failed turn or not."""
    stage = ErrorsMiddleware(Metrics())
    msg = InboundMessage("slack", "parrot", "C1", None, "m1", "U1", "alice", True, "hi")
    assert await stage(await message_turn(msg), answers) is not None
    assert await stage(await message_turn(msg), fails) is None
    assert await asyncio.to_thread(tracing.tracer().force_flush)
    answered, failed = sorted(
        (span for spans in receiver.traces().values() for span in spans),
        key=lambda span: tracing.ERROR_TYPE in span.attributes,
    )
    assert answered.name == failed.name == "message slack"
    assert answered.attributes == MESSAGE_ATTRIBUTES
    assert failed.attributes == {**MESSAGE_ATTRIBUTES, tracing.ERROR_TYPE: "ValueError"}


async def test_issue25_the_message_spans_attributes_are_a_mapping(kept: Kept) -> None:
    """Any tracer is handed the root span's attributes as the mapping they stand for."""
    msg = InboundMessage("slack", "parrot", "C1", None, "m1", "U1", "alice", True, "hi")
    await ErrorsMiddleware(Metrics())(await message_turn(msg), answers)
    [(name, attributes)] = kept.spans
    assert name == "message slack"
    assert len(attributes) == len(MESSAGE_ATTRIBUTES)
    assert list(attributes) == list(MESSAGE_ATTRIBUTES)
    assert attributes[tracing.ROOM] == "slack:C1"
    assert dict(attributes.items()) == dict(attributes) == MESSAGE_ATTRIBUTES
    assert attributes == MESSAGE_ATTRIBUTES


async def test_issue25_a_span_is_current_from_its_start_until_it_ends(
    receiver: OtlpReceiver,
) -> None:
    """`span()` starts the span and makes it current; `end()` ends it as leaving a block."""
    tracer = tracing.tracer()
    outer = tracer.span("outer", {}, root=True)
    assert tracer.current() is outer
    inner = tracer.span("inner", {"n": 1})
    assert tracer.current() is inner
    inner.set_error("timeout")
    inner.end()
    assert tracer.current() is outer
    with tracer.span("block", {}) as block:
        assert tracer.current() is block
    assert tracer.current() is outer
    outer.end()
    assert tracer.current() is tracing.NO_SPAN
    tracing.NO_SPAN.end()  # the no-op span ends too
    assert await asyncio.to_thread(tracer.force_flush)
    [spans] = receiver.traces().values()
    by_name = {span.name: span for span in spans}
    assert by_name["inner"].parent_id == by_name["block"].parent_id == by_name["outer"].span_id
    assert by_name["inner"].attributes == {"n": 1, tracing.ERROR_TYPE: "timeout"}
    assert by_name["inner"].error
    assert not by_name["outer"].error
