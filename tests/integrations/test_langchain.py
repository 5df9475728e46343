"""loopwarden_integrations.langchain with a real LangChain agent (`create_agent`), fake model."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import httpx
import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import InputAgentState
from langchain_core.messages import HumanMessage
from langchain_core.tools import BaseTool, tool
from langchain_openai import ChatOpenAI

from guards import LoopGuard, ToolExecutionError
from loopwarden_integrations.langchain import guard_tools
from tests.fakes.llm_upstream import FakeLLM, text_response, tool_call_response
from tests.integrations.missing_library import import_without

FROZEN: Callable[[], float] = lambda: 0.0  # noqa: E731 - no test depends on wall time


@pytest.fixture(autouse=True)
def _no_tracing(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("LANGSMITH_TRACING", "LANGCHAIN_TRACING_V2", "LANGCHAIN_TRACING"):
        monkeypatch.setenv(name, "false")


@dataclass
class Model:
    fake: FakeLLM
    chat: ChatOpenAI


@pytest.fixture
async def model() -> AsyncIterator[Model]:
    """A ChatOpenAI on the fake server, with HTTP clients this test closes."""
    async with FakeLLM() as fake, httpx.AsyncClient() as async_http:
        with httpx.Client() as http:
            chat = ChatOpenAI(
                model="gpt-4o-mini",
                base_url=fake.base_url,
                api_key="sk-test-not-a-secret",  # type: ignore[arg-type]
                http_client=http,
                http_async_client=async_http,
                max_retries=0,
            )
            yield Model(fake, chat)


class Jobs:
    """A stuck status tool (the same answer every time), counting its runs."""

    def __init__(self) -> None:
        self.runs = 0

        @tool
        def check_status(job: str) -> str:
            """Check a build job's status."""
            self.runs += 1
            return "pending"

        self.tool: BaseTool = check_status


def stuck(model: Model, calls: int) -> None:
    """The model asks for check_status(job=7) `calls` times, then answers."""
    model.fake.enqueue(*(tool_call_response(("check_status", {"job": "7"})) for _ in range(calls)))
    model.fake.enqueue(text_response("done"))


def question() -> InputAgentState:
    """An agent's input: the user asks about build 7."""
    return {"messages": [HumanMessage("Is build 7 done?")]}


def tool_results(model: Model) -> list[str]:
    """The tool results the model was sent in its last request."""
    return [m["content"] for m in model.fake.calls("/v1/chat/completions")[-1].tool_messages]


async def test_issue15_langchain_agent_run_halts_a_stuck_tool(model: Model) -> None:
    jobs = Jobs()
    guard = LoopGuard(clock=FROZEN)
    agent = create_agent(model.chat, guard_tools([jobs.tool], guard))
    stuck(model, 20)

    with pytest.raises(ToolExecutionError, match=r"\[loop-guard\] check_status") as caught:
        await agent.ainvoke(question())

    assert caught.value.tool_name == "check_status"
    # Seven runs; the 8th call was blocked (not run), the 9th halted the run.
    assert jobs.runs == 7
    results = tool_results(model)
    assert results[:3] == ["pending"] * 3
    assert results[3].startswith("pending [loop-guard] check_status returned the same result")
    assert '"loop_blocked": true' in results[-1]
    assert "this call was not run" in results[-1]


async def test_issue15_langchain_sync_invoke_is_guarded_too(model: Model) -> None:
    jobs = Jobs()
    agent = create_agent(model.chat, guard_tools([jobs.tool], lambda: LoopGuard(clock=FROZEN)))
    stuck(model, 20)

    with pytest.raises(ToolExecutionError, match=r"\[loop-guard\]"):
        await asyncio.to_thread(lambda: agent.invoke(question()))

    assert jobs.runs == 7


async def test_issue15_langchain_each_agent_run_gets_a_fresh_turn(model: Model) -> None:
    jobs = Jobs()
    shared = LoopGuard(clock=FROZEN)
    made: list[LoopGuard] = []

    def factory() -> LoopGuard:
        made.append(LoopGuard(clock=FROZEN))
        return made[-1]

    for source in (shared, factory):
        agent = create_agent(model.chat, guard_tools([jobs.tool], source))
        for _ in range(3):
            # Three runs of three stuck calls: nine in one turn would have warned.
            stuck(model, 3)
            result = await agent.ainvoke(question())
            assert result["messages"][-1].content == "done"
            assert tool_results(model) == ["pending"] * 3

    assert shared.get_stats().tool_counts == {"check_status": 3}
    assert len(made) == 3
    assert [guard.get_stats().tool_counts for guard in made] == [{"check_status": 3}] * 3


async def test_issue15_langchain_wrapped_tool_keeps_its_face_and_is_its_own_run() -> None:
    jobs = Jobs()
    guard = LoopGuard(clock=FROZEN)
    [wrapped] = guard_tools([jobs.tool], guard)

    assert wrapped.name == "check_status"
    assert wrapped.description == jobs.tool.description
    assert wrapped.tool_call_schema.model_json_schema() == (  # type: ignore[union-attr]
        jobs.tool.tool_call_schema.model_json_schema()  # type: ignore[union-attr]
    )
    # Invoked on its own, each call is a run of its own.
    assert wrapped.invoke({"job": "7"}) == "pending"
    assert await wrapped.ainvoke({"job": "7"}) == "pending"
    assert guard.get_stats().tool_counts == {"check_status": 1}
    assert jobs.runs == 2


def test_issue15_langchain_guard_tools_refuses_what_it_cannot_wrap() -> None:
    jobs = Jobs()
    with pytest.raises(TypeError, match="LangChain tools \\(BaseTool\\), got builtin_function"):
        guard_tools([len], LoopGuard())  # type: ignore[list-item]
    with pytest.raises(TypeError, match="LoopGuard or a zero-argument function"):
        guard_tools([jobs.tool], "strict")  # type: ignore[arg-type]


def test_issue15_import_without_langchain_names_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(ImportError, match=r"pip install 'loopwarden\[langchain\]'"):
        import_without(monkeypatch, "loopwarden_integrations.langchain", "langchain_core")
