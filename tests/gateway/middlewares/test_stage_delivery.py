"""Delivery: chunks in order, retries honouring retry_after, exactly once, never raising."""

from __future__ import annotations

import logging

import pytest

from gateway.app.errors import DeliveryError
from gateway.app.types import Reply
from gateway.delivery.sender import Delivery
from gateway.observability.metrics import Metrics
from tests.fakes.inmemory import ConstantAgent, InMemoryConnector, PipelineRig, rig_config


class Waits:
    """An injected sleep that records how long it was asked to wait."""

    def __init__(self) -> None:
        self.seconds: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.seconds.append(seconds)


def long_reply(paragraphs: int = 20) -> str:
    return "\n\n".join(
        f"Part {i}: " + " ".join(f"w{i}x{j}" for j in range(50)) for i in range(paragraphs)
    )


async def test_issue3_6000_char_reply_through_pipeline_chunked_in_order() -> None:
    text = long_reply()
    assert len(text) >= 6_000
    rig = PipelineRig(rig_config(), {"parrot": ConstantAgent(text)})
    await rig.start()
    connector = rig.connector()
    await connector.push(connector.message("tell me everything"))
    sent = connector.texts()
    assert len(sent) == 4
    assert all(len(chunk) <= 2_000 for chunk in sent)
    assert "\n\n".join(sent) == text
    assert rig.metrics.value("replies_out_total", platform="room") == 1


async def test_only_first_chunk_carries_reply_to() -> None:
    connector = InMemoryConnector("parrot", max_message_length=100)
    delivery = Delivery(Metrics(), sleep=Waits())
    reply = Reply("word " * 60, thread_id="T1", reply_to="M1")
    assert await delivery.deliver(connector, "C1", reply)
    replies = [sent.reply for sent in connector.sent]
    assert len(replies) > 1
    assert replies[0].reply_to == "M1"
    assert all(r.reply_to is None for r in replies[1:])
    assert all(r.thread_id == "T1" for r in replies)


async def test_issue3_429_then_success_delivers_exactly_once_after_retry_after() -> None:
    waits = Waits()
    metrics = Metrics()
    connector = InMemoryConnector("parrot")
    connector.rate_limit_next(retry_after=2.5)
    delivered = await Delivery(metrics, sleep=waits).deliver(connector, "C1", Reply("hello"))
    assert delivered
    assert waits.seconds == [2.5]
    assert connector.texts() == ["hello"]
    assert connector.send_attempts == 2
    assert metrics.value("delivery_retries_total", platform="room") == 1


async def test_issue3_429_mid_reply_keeps_chunk_order_without_duplicates() -> None:
    waits = Waits()
    connector = InMemoryConnector("parrot", max_message_length=2_000)
    text = long_reply()
    delivery = Delivery(Metrics(), sleep=waits)
    original_send = connector.send
    calls = 0

    async def send_with_429_on_second_chunk(channel_id: str, reply: Reply) -> str | None:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise DeliveryError("429", retryable=True, retry_after=1.0)
        return await original_send(channel_id, reply)

    connector.send = send_with_429_on_second_chunk  # type: ignore[method-assign]
    assert await delivery.deliver(connector, "C1", Reply(text))
    assert "\n\n".join(connector.texts()) == text
    assert waits.seconds == [1.0]


async def test_backoff_doubles_without_retry_after() -> None:
    waits = Waits()
    connector = InMemoryConnector("parrot")
    connector.fail_next(*(DeliveryError("502", retryable=True) for _ in range(3)))
    delivery = Delivery(Metrics(), sleep=waits, backoff_initial=0.5)
    assert await delivery.deliver(connector, "C1", Reply("hi"))
    assert waits.seconds == [0.5, 1.0, 2.0]
    assert connector.texts() == ["hi"]


async def test_reply_that_finally_fails_is_logged_counted_and_not_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    waits = Waits()
    metrics = Metrics()
    connector = InMemoryConnector("parrot")
    connector.fail_next(*(DeliveryError("503", retryable=True) for _ in range(3)))
    delivery = Delivery(metrics, sleep=waits, max_attempts=3)
    with caplog.at_level(logging.INFO, logger="loopwarden.delivery"):
        delivered = await delivery.deliver(connector, "C9", Reply("secret words here"))
    assert not delivered
    assert connector.send_attempts == 3
    assert len(waits.seconds) == 2
    assert metrics.value("delivery_failures_total", platform="room") == 1
    assert metrics.value("replies_out_total", platform="room") == 0
    [record] = [r for r in caplog.records if r.levelno >= logging.INFO]
    line = record.getMessage()
    assert "room:C9" in line
    assert "17 chars" in line
    assert "503" in line
    assert "secret words" not in line


async def test_non_retryable_error_is_not_retried() -> None:
    waits = Waits()
    connector = InMemoryConnector("parrot")
    connector.fail_next(DeliveryError("403 forbidden", retryable=False))
    assert not await Delivery(Metrics(), sleep=waits).deliver(connector, "C1", Reply("hi"))
    assert connector.send_attempts == 1
    assert waits.seconds == []


async def test_connector_bug_is_contained() -> None:
    connector = InMemoryConnector("parrot")
    connector.fail_next(RuntimeError("boom"))
    assert not await Delivery(Metrics(), sleep=Waits()).deliver(connector, "C1", Reply("hi"))


async def test_retry_after_beyond_the_cap_gives_up_at_once() -> None:
    waits = Waits()
    connector = InMemoryConnector("parrot")
    connector.rate_limit_next(retry_after=3_600)
    delivery = Delivery(Metrics(), sleep=waits, max_retry_after=300)
    assert not await delivery.deliver(connector, "C1", Reply("hi"))
    assert waits.seconds == []
    assert connector.send_attempts == 1


async def test_later_chunks_not_sent_after_a_failed_one() -> None:
    connector = InMemoryConnector("parrot", max_message_length=100)
    connector.fail_next(DeliveryError("403", retryable=False))
    assert not await Delivery(Metrics(), sleep=Waits()).deliver(
        connector, "C1", Reply("word " * 60)
    )
    assert connector.sent == []


async def test_429_through_the_pipeline_waits_on_the_injected_clock() -> None:
    rig = PipelineRig(rig_config(), {"parrot": ConstantAgent("pong")})
    await rig.start()
    connector = rig.connector()
    connector.rate_limit_next(retry_after=4.0, times=2)
    await connector.push(connector.message("ping"))
    assert rig.waits == [4.0, 4.0]
    assert connector.texts() == ["pong"]
