"""The python agent: sync and async functions, return types, and clear import errors."""

from __future__ import annotations

import pytest

from gateway.agents.python_fn import PythonAgent
from gateway.app.errors import ConfigError
from gateway.app.types import AgentResult, ToolCall
from gateway.config import PythonAgentConfig
from tests.gateway.agents.agent_turns import make_turn

_FNS = "tests.gateway.agents.python_agent_fns"


def _agent(function: str, name: str = "helper") -> PythonAgent:
    return PythonAgent(PythonAgentConfig(kind="python", function=function), name=name)


async def test_sync_function() -> None:
    agent = _agent(f"{_FNS}:shout")
    assert await agent.respond(make_turn("hey")) == AgentResult(text="HEY")


async def test_async_function() -> None:
    agent = _agent(f"{_FNS}:greet")
    result = await agent.respond(make_turn("hey", sender_name="Ada"))
    assert result.text == "hello Ada"


async def test_none_is_silence() -> None:
    assert await _agent(f"{_FNS}:silent").respond(make_turn("x")) == AgentResult(text=None)


async def test_agent_result_passes_through() -> None:
    result = await _agent(f"{_FNS}:full_result").respond(make_turn("x"))
    assert result.tool_calls == (ToolCall("lookup", "{}", "allow", "ok"),)


async def test_wrong_return_type_names_the_function() -> None:
    with pytest.raises(TypeError, match="python_agent_fns:wrong_type returned int"):
        await _agent(f"{_FNS}:wrong_type").respond(make_turn("x"))


def test_missing_function_names_the_field() -> None:
    with pytest.raises(ConfigError, match="has no attribute 'nope'") as caught:
        _agent(f"{_FNS}:nope", name="helper")
    assert caught.value.path == "agents.helper.function"


def test_missing_module_names_the_field() -> None:
    with pytest.raises(ConfigError, match="cannot import module 'no_such_module_xyz'") as caught:
        _agent("no_such_module_xyz:run", name="bot")
    assert caught.value.path == "agents.bot.function"


def test_not_callable_is_refused() -> None:
    with pytest.raises(ConfigError, match="is not callable"):
        _agent(f"{_FNS}:NOT_CALLABLE")
