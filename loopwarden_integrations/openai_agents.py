"""loopwarden's LoopGuard around the OpenAI Agents SDK's function tools: `guard_tools`.

Each wrapped `FunctionTool` is the same tool with its `on_invoke_tool` run through check →
run → record → check (`guards.tool_wrapper`). WARN and BLOCK reach the model in the tool's
output, as text (BLOCK skips the tool). HALT raises `guards.ToolExecutionError` from the
tool, and the SDK ends the run: `Runner.run` raises its `UserError` with the HALT as
`__cause__` and the run so far in `run_data`.

`guard` is a `LoopGuard` or a zero-argument factory of one (`loopwarden_integrations.run_guards`);
each agent run gets a fresh turn. A run is known by its `Usage`, which the SDK makes
once per `Runner.run` and hands to every tool call of the run (agents used as tools share
their caller's, so their calls count in the caller's turn).

The guard fingerprints the arguments the model sent, parsed as JSON; arguments that are
not acceptable JSON (`gateway.app.jsonbody`) are fingerprinted as their text, and the tool
answers them as it always does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from gateway.app.jsonbody import JsonBodyError, parse_json
from guards.tool_wrapper import guarded_call
from loopwarden_integrations.extras import missing_extra
from loopwarden_integrations.run_guards import GuardSource, RunGuards

try:
    from agents import FunctionTool, Tool
    from agents.tool_context import ToolContext
except ImportError as exc:
    raise missing_extra(
        "loopwarden_integrations.openai_agents", "openai-agents", "openai-agents"
    ) from exc


def guard_tools(tools: Iterable[FunctionTool], guard: GuardSource) -> list[Tool]:
    """Wrap function tools so loopwarden's LoopGuard decides each call (see the module doc).

    The list is typed as `Agent(tools=...)` takes it.
    """
    runs = RunGuards(guard)
    wrapped: list[Tool] = []
    for tool in tools:
        if not isinstance(tool, FunctionTool):
            raise TypeError(
                f"guard_tools wraps the SDK's function tools (FunctionTool), got "
                f"{type(tool).__name__}; make one with @function_tool first"
            )
        wrapped.append(_guarded(tool, runs))
    return wrapped


def _arguments(raw: str) -> Mapping[str, object]:
    """The model's arguments as the guard fingerprints them."""
    try:
        value = parse_json(raw)
    except JsonBodyError:
        return {"arguments": raw}
    return value if isinstance(value, dict) else {"arguments": value}


def _guarded(tool: FunctionTool, runs: RunGuards) -> FunctionTool:
    """The same tool, its calls passing through their run's guard."""
    invoke = tool.on_invoke_tool
    name = tool.name

    async def on_invoke_tool(context: ToolContext[Any], raw: str) -> Any:
        return await guarded_call(
            runs.of(context.usage), name, lambda **_: invoke(context, raw), _arguments(raw)
        )

    return dataclasses.replace(tool, on_invoke_tool=on_invoke_tool)
