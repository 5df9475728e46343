"""build_agent: each `kind` gets its agent class, and import errors surface at build time."""

from __future__ import annotations

import pytest

from gateway.agents.factory import build_agent
from gateway.agents.openai import OpenAIAgent
from gateway.agents.python_fn import PythonAgent
from gateway.agents.scripted import ScriptedAgent
from gateway.app.errors import ConfigError
from gateway.config import OpenAIAgentConfig, PythonAgentConfig, ScriptedAgentConfig


async def test_each_kind_builds_its_agent() -> None:
    scripted = build_agent("parrot", ScriptedAgentConfig(kind="scripted", default="echo"))
    python = build_agent(
        "fn",
        PythonAgentConfig(kind="python", function="tests.gateway.agents.python_agent_fns:shout"),
    )
    openai = build_agent(
        "llm",
        OpenAIAgentConfig(
            kind="openai",
            model="m",
            tools=("tests.gateway.agents.tools_for_tests:get_status",),
        ),
    )
    assert isinstance(scripted, ScriptedAgent)
    assert isinstance(python, PythonAgent)
    assert isinstance(openai, OpenAIAgent)
    assert list(openai.tools) == ["get_status"]
    for agent in (scripted, python, openai):
        await agent.aclose()


def test_bad_function_fails_at_build_time_naming_the_agent() -> None:
    config = PythonAgentConfig(kind="python", function="tests.gateway.agents.python_agent_fns:x")
    with pytest.raises(ConfigError) as caught:
        build_agent("helper", config)
    assert caught.value.path == "agents.helper.function"
