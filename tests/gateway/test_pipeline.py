"""build_pipeline: a real onion, and a middleware short-circuits by not calling next."""

from __future__ import annotations

from gateway.app.context import TurnContext
from gateway.app.pipeline import Handler, build_pipeline
from gateway.app.types import Reply
from tests.fakes.inmemory import PipelineRig
from tests.gateway.middlewares.stage_rig import rig_with


async def test_build_pipeline_is_an_onion() -> None:
    order: list[str] = []

    class Layer:
        def __init__(self, name: str) -> None:
            self.name = name

        async def __call__(self, ctx: TurnContext, call_next: Handler) -> Reply | None:
            order.append(f"{self.name} in")
            reply = await call_next(ctx)
            order.append(f"{self.name} out")
            return reply

    handler = build_pipeline([Layer("outer"), Layer("inner")])
    rig, _ = await rig_with()
    assert await handler(_turn(rig)) is None
    assert order == ["outer in", "inner in", "inner out", "outer out"]


async def test_issue3_a_middleware_short_circuits_by_not_calling_next() -> None:
    order: list[str] = []

    class Outer:
        name = "outer"

        async def __call__(self, ctx: TurnContext, call_next: Handler) -> Reply | None:
            order.append("outer in")
            reply = await call_next(ctx)
            order.append(f"outer out: {reply.text if reply else None}")
            return reply

    class Stop:
        name = "stop"

        async def __call__(self, ctx: TurnContext, call_next: Handler) -> Reply | None:
            order.append("stop")
            return Reply("stopped here")

    class Never:
        name = "never"

        async def __call__(self, ctx: TurnContext, call_next: Handler) -> Reply | None:
            order.append("never")
            return await call_next(ctx)

    handler = build_pipeline([Outer(), Stop(), Never()])
    rig, agent = await rig_with()
    assert await handler(_turn(rig)) == Reply("stopped here")
    assert order == ["outer in", "stop", "outer out: stopped here"]
    assert agent.turns == []


def _turn(rig: PipelineRig) -> TurnContext:
    connector = rig.connector()
    return rig.turn(connector.message("x"))
