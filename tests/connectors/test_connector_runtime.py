"""ConnectorRuntime: drops counted here and at /metrics, a hand-over that never raises,
and secrets masked in what a connector logs."""

from __future__ import annotations

import logging

import pytest
from aiohttp import web

from connectors.lanes import Lanes
from connectors.runtime import ConnectorRuntime, Outcome
from connectors.skips import Skip
from gateway.app.connector import ConnectorServices
from gateway.app.errors import GatewayStopping
from gateway.app.types import InboundMessage
from gateway.observability.metrics import Metrics

TOKEN = "123456:AAHsecretTokenNeverInALogLine_abcdef"
log = logging.getLogger("tests.connectors.runtime")


def message(text: str, channel: str = "C1") -> InboundMessage:
    return InboundMessage(
        platform="discord",
        bot_id="parrot",
        channel_id=channel,
        thread_id=None,
        message_id=f"m-{text}",
        sender_id="U1",
        sender_name="alice",
        sender_is_bot=False,
        text=text,
    )


def runtime(metrics: Metrics) -> ConnectorRuntime:
    services = ConnectorServices(http=web.Application(), metrics=metrics)
    return ConnectorRuntime("discord", "parrot", services, log=log, secrets=(TOKEN,))


def dropped(metrics: Metrics, reason: str) -> float:
    return metrics.value("events_dropped_total", platform="discord", reason=reason)


async def test_issue10_a_failing_sink_never_ends_the_lane_and_each_failure_is_a_counted_drop(
    caplog: pytest.LogCaptureFixture,
) -> None:
    metrics = Metrics()
    shared = runtime(metrics)
    taken: list[str] = []

    async def sink(item: InboundMessage) -> None:
        if item.text.startswith("boom"):
            raise RuntimeError(f"pipeline exploded near {TOKEN}")
        taken.append(item.text)

    shared.sink = sink
    lanes = Lanes(shared.hand_over)
    for text in ("boom", "after", "boom again", "last"):
        assert lanes.put("C1", message(text))
    with caplog.at_level(logging.DEBUG, logger=log.name):
        await lanes.join()
    assert taken == ["after", "last"]
    assert shared.dropped == {"sink_error": 2}
    assert dropped(metrics, "sink_error") == 2
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [r.getMessage() for r in warnings] == [
        "discord bot parrot: the pipeline failed on message m-boom (RuntimeError)",
        "discord bot parrot: the pipeline failed on message m-boom again (RuntimeError)",
    ]
    assert not any(r.exc_info for r in warnings)  # the traceback is at DEBUG only


async def test_issue10_a_stopping_gateway_is_refused_not_failed() -> None:
    metrics = Metrics()
    shared = runtime(metrics)

    async def stopping(item: InboundMessage) -> None:
        raise GatewayStopping("stopping")

    assert await shared.offer(message("x")) is Outcome.REFUSED  # no sink yet
    shared.sink = stopping
    assert await shared.offer(message("x")) is Outcome.REFUSED
    assert shared.dropped == {}  # offering counts nothing: the connector decides
    await shared.hand_over(message("y"))
    assert shared.dropped == {"stopping": 1}
    assert dropped(metrics, "stopping") == 1


async def test_issue10_accept_counts_skips_and_drops_a_translation_that_raises_alone() -> None:
    metrics = Metrics()
    shared = runtime(metrics)

    def broken() -> InboundMessage | Skip:
        raise TypeError("odd value in untrusted JSON")

    assert shared.accept(lambda: Skip.NO_TEXT, "a photo") is None
    assert shared.accept(broken, "an odd event") is None
    good = message("fine")
    assert shared.accept(lambda: good, "a message") is good
    assert shared.dropped == {"no_text": 1, "malformed": 1}
    assert dropped(metrics, "no_text") == 1
    assert dropped(metrics, "malformed") == 1


def test_issue10_describe_masks_the_token_in_every_form() -> None:
    shared = runtime(Metrics())
    error = ConnectionError(
        f"POST https://api.telegram.org/bot{TOKEN}/getUpdates failed; "
        f"token={TOKEN.replace(':', '%3A')}; other /bot999:OTHERtoken_x"
    )
    described = shared.describe(error)
    assert described.startswith("ConnectionError: POST https://api.telegram.org/bot***/getUpdates")
    assert TOKEN not in described
    assert "AAHsecret" not in described
    assert "OTHERtoken" not in described
