"""ReplyStream on an in-memory platform that edits: failures, restarts, and the pipeline."""

from __future__ import annotations

from gateway.app.context import TurnContext
from gateway.app.errors import DeliveryError
from gateway.app.types import AgentResult, Reply
from gateway.delivery.sender import Delivery
from gateway.delivery.streaming import ReplyStream
from gateway.observability.metrics import Metrics
from tests.connectors.stream_cases import ManualClock
from tests.fakes.editing_room import EditingRoom
from tests.fakes.inmemory import PipelineRig, rig_config


def stream_into(room: EditingRoom, clock: ManualClock) -> tuple[ReplyStream, Delivery]:
    delivery = Delivery(Metrics(), sleep=clock.sleep, clock=clock)
    stream = ReplyStream(delivery, room, "c1", thread_id="t1", reply_to="m1")
    stream.begin(1.0)
    return stream, delivery


async def test_issue11_a_post_refused_for_good_ends_the_stream_and_is_counted() -> None:
    room, clock = EditingRoom(), ManualClock()
    stream, delivery = stream_into(room, clock)
    room.fail_next(DeliveryError("channel gone"))
    await stream.write("Hello")
    clock.now += 5
    await stream.write(" world")
    assert room.calls == [], "nothing more is tried after a post failed for good"
    assert not await stream.finish(Reply("Hello world"))
    assert room.calls == []
    assert b'delivery_failures_total{platform="memory"} 1.0' in delivery.metrics.render()


async def test_issue11_a_rate_limit_longer_than_worth_waiting_gives_up() -> None:
    room, clock = EditingRoom(), ManualClock()
    stream, _ = stream_into(room, clock)
    room.fail_next(DeliveryError("429", retryable=True, retry_after=3600))
    await stream.write("Hello")
    assert not await stream.finish(Reply("Hello"))
    assert clock.slept == [], "an hour is not waited for"


async def test_issue11_a_restart_rewrites_the_posted_message() -> None:
    room, clock = EditingRoom(), ManualClock()
    stream, _ = stream_into(room, clock)
    await stream.write("Let me check the orders.")
    stream.restart()
    clock.now += 2
    await stream.write("Three orders are late.")
    assert await stream.finish(Reply("Three orders are late."))
    assert room.calls == [("send", "Let me check the orders."), ("edit", "Three orders are late.")]


async def test_issue11_nothing_streamed_is_sent_whole() -> None:
    room, clock = EditingRoom(), ManualClock()
    stream, _ = stream_into(room, clock)
    assert await stream.finish(Reply("a scripted answer"))
    assert room.calls == [("send", "a scripted answer")]


class _Inspecting:
    """An agent that notes whether its turn came with a stream."""

    def __init__(self) -> None:
        self.streams: list[object] = []

    async def respond(self, turn: TurnContext) -> AgentResult:
        self.streams.append(turn.stream)
        return AgentResult(text="whole")

    async def aclose(self) -> None:
        """Nothing to close."""


async def test_issue11_where_the_platform_cannot_edit_the_turn_has_no_stream() -> None:
    agent = _Inspecting()
    rig = PipelineRig(rig_config(), {"parrot": agent})
    await rig.start()
    connector = rig.connector()
    await connector.push(connector.message("hello"))
    assert agent.streams == [None]
    assert connector.texts() == ["whole"]
