"""loopwarden_integrations.openai_agents: a real OpenAI Agents SDK run against the fake model.

The SDK's chat-completions model (`OpenAIChatCompletionsModel`) talks to the fake's
`/v1/chat/completions`; tracing is off, so nothing leaves loopback.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import pytest
from agents import (
    Agent,
    FunctionTool,
    OpenAIChatCompletionsModel,
    RunConfig,
    Runner,
    Tool,
    UserError,
    function_tool,
    set_tracing_disabled,
)
from agents.tool_context import ToolContext
from openai import AsyncOpenAI

from guards import LoopGuard, ToolExecutionError
from loopwarden_integrations.openai_agents import guard_tools
from tests.fakes.llm_upstream import FakeLLM, text_response, tool_call_response
from tests.integrations.missing_library import import_without

FROZEN: Callable[[], float] = lambda: 0.0  # noqa: E731 - no test depends on wall time
NO_TRACING = RunConfig(tracing_disabled=True)

set_tracing_disabled(True)


@dataclass
class Model:
    fake: FakeLLM
    model: OpenAIChatCompletionsModel


@pytest.fixture
async def model() -> AsyncIterator[Model]:
    """The SDK's chat-completions model on the fake server (its client closed after)."""
    async with (
        FakeLLM() as fake,
        AsyncOpenAI(
            base_url=fake.base_url, api_key="sk-test-not-a-secret", max_retries=0
        ) as client,
    ):
        yield Model(fake, OpenAIChatCompletionsModel(model="gpt-4o-mini", openai_client=client))


class Jobs:
    """A stuck status tool (the same answer every time), counting its runs."""

    def __init__(self) -> None:
        self.runs = 0

        @function_tool
        def check_status(job: str) -> str:
            """Check a build job's status."""
            self.runs += 1
            return "pending"

        self.tool: FunctionTool = check_status


def stuck(model: Model, calls: int, arguments: str = '{"job": "7"}') -> None:
    """The model asks for check_status `calls` times, then answers."""
    model.fake.enqueue(*(tool_call_response(("check_status", arguments)) for _ in range(calls)))
    model.fake.enqueue(text_response("done"))


def tool_results(model: Model) -> list[str]:
    """The tool results the model was sent in its last request."""
    return [m["content"] for m in model.fake.calls("/v1/chat/completions")[-1].tool_messages]


def agent_with(model: Model, tools: list[Tool]) -> Agent[None]:
    return Agent(name="builder", instructions="Watch the build.", model=model.model, tools=tools)


async def test_issue15_openai_agents_run_with_a_stuck_tool_ends_with_the_halt(
    model: Model,
) -> None:
    jobs = Jobs()
    agent = agent_with(model, guard_tools([jobs.tool], LoopGuard(clock=FROZEN)))
    stuck(model, 20)

    with pytest.raises(UserError) as caught:
        await Runner.run(agent, "Is build 7 done?", run_config=NO_TRACING, max_turns=30)

    halt = caught.value.__cause__
    assert isinstance(halt, ToolExecutionError)
    assert halt.tool_name == "check_status"
    assert halt.message.startswith("[loop-guard] check_status returned the same result")
    assert jobs.runs == 7
    # The run so far, WARNs and the BLOCK included, comes with the error.
    assert caught.value.run_data is not None
    outputs = [
        str(item.output) for item in caught.value.run_data.new_items if hasattr(item, "output")
    ]
    assert outputs[3].startswith("pending [loop-guard]")
    assert "this call was not run" in outputs[-1]
    results = tool_results(model)
    assert results[:3] == ["pending"] * 3
    assert "'loop_blocked': True" in results[-1]


async def test_issue15_openai_agents_each_run_gets_a_fresh_turn(model: Model) -> None:
    jobs = Jobs()
    made: list[LoopGuard] = []

    def factory() -> LoopGuard:
        made.append(LoopGuard(clock=FROZEN))
        return made[-1]

    shared = LoopGuard(clock=FROZEN)
    for source in (shared, factory):
        agent = agent_with(model, guard_tools([jobs.tool], source))
        for _ in range(3):
            # Three runs of three stuck calls: nine in one turn would have warned.
            stuck(model, 3)
            result = await Runner.run(agent, "Is build 7 done?", run_config=NO_TRACING)
            assert result.final_output == "done"
            assert tool_results(model) == ["pending"] * 3

    assert shared.get_stats().tool_counts == {"check_status": 3}
    assert [guard.get_stats().tool_counts for guard in made] == [{"check_status": 3}] * 3


@pytest.mark.parametrize(
    "arguments",
    [
        '{"job": ' + "9" * 5000 + "}",
        "[" * 100_000,
        '{"job": NaN}',
        '{"job": 1e999}',
        '{"job": "\udcff"}',
        "not json",
    ],
    ids=["5000-digits", "deep-nesting", "nan", "overflow", "lone-surrogate", "not-json"],
)
async def test_issue15_openai_agents_hostile_arguments_are_fingerprinted_as_text(
    arguments: str,
) -> None:
    jobs = Jobs()
    guard = LoopGuard(clock=FROZEN)
    [wrapped] = guard_tools([jobs.tool], guard)
    assert isinstance(wrapped, FunctionTool)
    context = ToolContext(
        context=None, tool_name="check_status", tool_call_id="call_1", tool_arguments=arguments
    )

    unguarded = await jobs.tool.on_invoke_tool(context, arguments)

    # The tool answers as it always does; the guard counted both calls as one repeat.
    for _ in range(2):
        assert await wrapped.on_invoke_tool(context, arguments) == unguarded
    assert guard.get_stats().tool_counts == {"check_status": 2}
    assert guard.get_stats()["streak"] == 2


def test_issue15_openai_agents_guard_tools_refuses_what_it_cannot_wrap() -> None:
    with pytest.raises(TypeError, match=r"function tools \(FunctionTool\), got function"):
        guard_tools([json.dumps], LoopGuard())  # type: ignore[list-item]


def test_issue15_import_without_openai_agents_names_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(ImportError, match=r"pip install 'loopwarden\[openai-agents\]'"):
        import_without(monkeypatch, "loopwarden_integrations.openai_agents", "agents")
