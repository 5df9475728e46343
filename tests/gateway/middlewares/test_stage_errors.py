"""The errors stage: nothing raised inside a turn escapes, and it is counted by stage name."""

from __future__ import annotations

import logging

import pytest

from gateway.app import middlewares
from gateway.app.context import TurnContext
from gateway.app.middlewares import AdmissionMiddleware, ErrorsMiddleware
from gateway.app.pipeline import Handler, build_pipeline
from gateway.app.types import AgentResult, Reply
from gateway.state.memory import MemoryStateStore
from tests.fakes.inmemory import ConstantAgent, PipelineRig, rig_config
from tests.gateway.middlewares.stage_rig import rig_with


class FailingAgent:
    """Raises from inside the agent, with the user's text in the message."""

    async def respond(self, turn: TurnContext) -> AgentResult:
        raise ValueError(f"cannot handle {turn.message.text}")

    async def aclose(self) -> None:
        """Nothing to close."""


async def test_issue3_agent_that_raises_does_not_crash(caplog: pytest.LogCaptureFixture) -> None:
    rig, _ = await rig_with(agent=FailingAgent())
    connector = rig.connector()
    with caplog.at_level(logging.INFO):
        result = await connector.push(connector.message("private words"))
    assert result is None
    assert connector.sent == []
    assert rig.metrics.value("errors_total", stage="agent_dispatch") == 1
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1
    line = errors[0].getMessage()
    assert "ValueError" in line
    assert "agent_dispatch" in line
    assert "private words" not in line
    assert errors[0].exc_info is None
    # The gateway keeps working afterwards.
    rig.agents["parrot"] = ConstantAgent("fine")
    await connector.push(connector.message("again"))
    assert connector.texts() == ["fine"]


class BrokenStage:
    """A stage outside `gateway.app.middlewares` that fails: it is known by its name alone."""

    name = "broken_stage"

    async def __call__(self, ctx: TurnContext, call_next: Handler) -> Reply | None:
        raise RuntimeError("inside a stage")


async def test_issue10_an_error_is_counted_under_the_name_of_the_stage_it_escaped() -> None:
    rig, _ = await rig_with()
    broken = BrokenStage()
    handler = build_pipeline([ErrorsMiddleware(rig.metrics), broken])
    connector = rig.connector()
    turn = rig.turn(connector.message("x"))
    assert await handler(turn) is None
    assert rig.metrics.value("errors_total", stage="broken_stage") == 1


class PausedStateFails(MemoryStateStore):
    """A state store whose pause lookup fails: the admission stage's first call."""

    async def pause_remaining(self, scope: str) -> float | None:
        raise OSError("disk gone")


async def test_issue10_a_gateway_stage_failure_is_counted_under_its_name() -> None:
    agent = ConstantAgent("hi")
    rig = PipelineRig(rig_config(), {"parrot": agent}, state=PausedStateFails())
    await rig.start()
    connector = rig.connector()
    await connector.push(connector.message("hello"))
    assert agent.turns == []
    assert rig.metrics.value("errors_total", stage=AdmissionMiddleware.name) == 1
    assert AdmissionMiddleware.name == "admission"


def test_issue10_every_stage_names_itself_uniquely() -> None:
    stages = [getattr(middlewares, name) for name in middlewares.__all__]
    names = [stage.name for stage in stages]
    assert all(isinstance(name, str) and name for name in names)
    assert len(set(names)) == len(names)
    # The names metrics and logs have always used.
    assert set(names) == {
        "admin",
        "admission",
        "agent_dispatch",
        "bot_loop",
        "bot_turns",
        "channel_policy",
        "dedupe",
        "delivery",
        "errors",
        "history",
        "self_filter",
        "silence",
        "transcript",
    }


class _SharedCall:
    """Stages that share one `__call__` (a common base): told apart by their names."""

    name = "shared"

    def __init__(self, *, fails: bool) -> None:
        self._fails = fails

    async def __call__(self, ctx: TurnContext, call_next: Handler) -> Reply | None:
        if self._fails:
            raise RuntimeError("inside a shared stage")
        return await call_next(ctx)


class OuterShared(_SharedCall):
    name = "outer_shared"


class InnerShared(_SharedCall):
    name = "inner_shared"


async def test_issue21_the_failing_stage_is_named_by_the_stage_not_by_its_code() -> None:
    rig, _ = await rig_with()
    handler = build_pipeline(
        [ErrorsMiddleware(rig.metrics), InnerShared(fails=True), OuterShared(fails=False)]
    )
    connector = rig.connector()
    turn = rig.turn(connector.message("x"))
    assert await handler(turn) is None
    assert rig.metrics.value("errors_total", stage="inner_shared") == 1
    assert rig.metrics.value("errors_total", stage="outer_shared") == 0
