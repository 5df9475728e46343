"""The per-message path with tracing off costs no coroutine or call it does not need (issue 21).

bench/pipeline_bench.py measures the cost; these tests hold the shape that makes it: the
bot-turn step hands back the state's own call, the agent stage runs the turn without a
coroutine of its own, and a guard verdict does not reach the span builder.
"""

from __future__ import annotations

import inspect

import pytest

from gateway.app.context import TurnContext
from gateway.app.middlewares.agent_dispatch import AgentDispatchMiddleware
from gateway.app.middlewares.bot_loop import count_bot_turn
from gateway.app.refusals import DecisionLog, RecentRefusals
from gateway.app.types import Reply
from gateway.config import BotLoopSettings, PipelineConfig
from gateway.observability import tracing
from gateway.observability.metrics import Metrics
from gateway.state.memory import MemoryStateStore
from tests.fakes.inmemory import ConstantAgent, PipelineRig, rig_config


async def test_issue21_count_bot_turn_hands_back_the_state_call() -> None:
    state = MemoryStateStore()
    pending = count_bot_turn(
        state, BotLoopSettings(), "room:C1", is_bot=True, message_key="room:C1:1"
    )
    assert inspect.iscoroutine(pending)
    assert pending.cr_code is MemoryStateStore.bot_turn.__code__
    assert await pending == 1
    off = BotLoopSettings(enabled=False)
    assert await count_bot_turn(state, off, "room:C1", is_bot=True, message_key=None) == 0


async def test_issue21_agent_stage_runs_the_turn_without_a_coroutine_of_its_own() -> None:
    rig = PipelineRig(rig_config(), {"parrot": ConstantAgent("hi")})
    await rig.start()
    connector = rig.connector()
    stage = AgentDispatchMiddleware(PipelineConfig(), DecisionLog(Metrics(), RecentRefusals()))
    turns: list[TurnContext] = []

    async def spy(ctx: TurnContext) -> Reply | None:
        turns.append(ctx)
        return None

    ctx = rig.turn(connector.message("hello"))
    pending = stage(ctx, spy)
    assert inspect.iscoroutine(pending)
    assert pending.cr_code is AgentDispatchMiddleware._turn.__code__
    reply = await pending
    assert reply is not None
    assert reply.text == "hi"
    assert turns == []  # the agent stage is the innermost: it calls no further stage


async def test_issue21_guard_verdicts_build_no_span_with_tracing_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_span(*args: object, **kwargs: object) -> None:
        raise AssertionError("a span was built with tracing off")

    monkeypatch.setattr(tracing, "guardrail", no_span)
    rig = PipelineRig(rig_config(), {"parrot": ConstantAgent("hi")})
    await rig.start()
    connector = rig.connector()
    await connector.push(
        connector.message("ping", sender_id="U_ECHO", sender_name="echo", sender_is_bot=True)
    )
    assert connector.texts() == ["hi"]
    assert rig.metrics.value("guard_decisions_total", guard="bot_loop", code="ok") == 1
