"""Dedupe: redeliveries and concurrent duplicates are answered once."""

from __future__ import annotations

import asyncio

import pytest

from gateway.app.context import TurnContext
from gateway.app.middlewares import DedupeMiddleware
from gateway.app.pipeline import build_pipeline
from gateway.app.refusals import DecisionLog
from gateway.app.types import AgentResult, Reply
from tests.fakes.inmemory import ConstantAgent, PipelineRig, rig_config


class SlowAgent:
    """Yields to the event loop mid-turn, so concurrent duplicates really overlap."""

    def __init__(self) -> None:
        self.turns = 0

    async def respond(self, turn: TurnContext) -> AgentResult:
        self.turns += 1
        await asyncio.sleep(0)
        return AgentResult("once")

    async def aclose(self) -> None:
        """Nothing to close."""


async def test_issue3_concurrent_duplicate_deliveries_answered_once() -> None:
    agent = SlowAgent()
    rig = PipelineRig(rig_config(), {"parrot": agent})
    await rig.start()
    connector = rig.connector()
    message = connector.message("hello", event_id="evt-1")
    await asyncio.gather(*(connector.push(message) for _ in range(20)))
    assert agent.turns == 1
    assert connector.texts() == ["once"]
    assert rig.metrics.value("refusals_total", stage="dedupe", reason="duplicate") == 19


@pytest.mark.parametrize(("later", "turns"), [(30, 1), (61, 2)])
async def test_redelivery_within_the_receipt_ttl_is_dropped(later: float, turns: int) -> None:
    agent = ConstantAgent("hi")
    rig = PipelineRig(rig_config("pipeline: {dedupe_ttl_seconds: 60}"), {"parrot": agent})
    await rig.start()
    connector = rig.connector()
    message = connector.message("hello")
    await connector.push(message)
    rig.clock.advance(later)
    await connector.push(message)
    assert len(agent.turns) == turns


async def test_same_message_to_two_hosted_bots_is_not_a_duplicate() -> None:
    rig = PipelineRig(rig_config(bots=("parrot", "echo")))
    await rig.start()
    for bot_id in ("parrot", "echo"):
        connector = rig.connector(bot_id)
        await connector.push(connector.message("hello", message_id="shared-1"))
    assert rig.connector("parrot").texts() == ["pong"]
    assert rig.connector("echo").texts() == ["pong"]


async def test_dedupe_can_be_switched_off() -> None:
    agent = ConstantAgent("hi")
    rig = PipelineRig(rig_config("pipeline: {dedupe: false}"), {"parrot": agent})
    await rig.start()
    connector = rig.connector()
    message = connector.message("hello", message_id="m-3")
    await connector.push(message)
    await connector.push(message)
    assert len(agent.turns) == 2


class ReceiptsOnly:
    """A test double of `ReceiptStore` alone: nothing else of the StateStore seam."""

    def __init__(self) -> None:
        self.held: dict[str, str] = {}

    async def receive(self, key: str, ttl: float) -> bool:
        if key in self.held:
            return False
        self.held[key] = "in flight"
        return True

    async def confirm(self, key: str, ttl: float) -> None:
        self.held[key] = "answered"


async def test_issue21_dedupe_stage_runs_on_a_store_of_receipts_only() -> None:
    # mypy strict checks this file: DedupeMiddleware accepts a double with two methods.
    rig = PipelineRig(rig_config())
    receipts = ReceiptsOnly()
    answered: list[str] = []

    async def answer(ctx: TurnContext) -> Reply | None:
        answered.append(ctx.message.text)
        return Reply("hi")

    stage = DedupeMiddleware(receipts, 60, DecisionLog(rig.metrics, rig.recent))
    handler = build_pipeline([stage], innermost=answer)
    connector = rig.connector()

    def turn(text: str, event_id: str) -> TurnContext:
        return rig.turn(connector.message(text, event_id=event_id))

    receipts.held["dedupe:" + turn("x", "evt-old").message.delivery_key] = "answered"
    assert await handler(turn("again", "evt-old")) is None
    assert await handler(turn("new", "evt-new")) == Reply("hi")
    assert answered == ["new"]
    new_key = "dedupe:" + turn("x", "evt-new").message.delivery_key
    assert receipts.held[new_key] == "answered"
    assert rig.metrics.value("refusals_total", stage="dedupe", reason="duplicate") == 1
