"""Build the agent a config names: one place that maps `kind` to its class."""

from __future__ import annotations

from gateway.agents.http import HttpAgent
from gateway.agents.openai import OpenAIAgent
from gateway.agents.python_fn import PythonAgent
from gateway.agents.scripted import ScriptedAgent
from gateway.agents.spend import AgentBudgets
from gateway.app.context import Agent
from gateway.calls.store import CallStore
from gateway.config import (
    AgentConfig,
    HttpAgentConfig,
    OpenAIAgentConfig,
    PythonAgentConfig,
    ScriptedAgentConfig,
)
from gateway.proxy.request_log import RequestLog


def build_agent(
    name: str,
    config: AgentConfig,
    *,
    calls: CallStore | None = None,
    budgets: AgentBudgets | None = None,
    request_log: RequestLog | None = None,
) -> Agent:
    """The agent for `agents.<name>`; import errors surface here as ConfigError, at start-up.

    `calls` is where `openai` agents count their LLM calls (default: their own, in memory),
    `budgets` how they price and charge them under `policy.spend` (default: genai-prices),
    `request_log` where they log them (default: nowhere).
    """
    if isinstance(config, ScriptedAgentConfig):
        return ScriptedAgent(config)
    if isinstance(config, PythonAgentConfig):
        return PythonAgent(config, name=name)
    if isinstance(config, OpenAIAgentConfig):
        return OpenAIAgent(name, config, calls=calls, budgets=budgets, request_log=request_log)
    if isinstance(config, HttpAgentConfig):
        return HttpAgent(name, config)
    raise TypeError(f"unknown agent config {type(config).__name__}")
