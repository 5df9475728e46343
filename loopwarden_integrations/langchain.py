"""loopwarden's LoopGuard around LangChain tools: `guard_tools(tools, guard)`.

Each wrapped tool keeps its name, description and argument schema, and runs every call
through check → run → record → check (`guards.tool_wrapper`), sync (`invoke`) and async
(`ainvoke`) alike. WARN and BLOCK reach the model in the tool's answer, as text;
HALT raises `guards.ToolExecutionError`, which LangChain's agents (`create_agent`, a
LangGraph `ToolNode` with its default error handling) let through, so the run stops.

`guard` is a `LoopGuard` or a zero-argument factory of one (`loopwarden_integrations.run_guards`);
each agent run gets a fresh turn. A run is one root LangChain invocation (`agent.invoke`,
or a tool invoked on its own): a LangChain configure hook, as LangSmith uses for its
tracer, puts an `AgentRun` marker on every root run's callbacks, inherited by everything
inside it, so the tool calls of one run find the same marker and the next run a new one.
An agent run inside a tool of another belongs to the outer run's turn.

The guard sees the arguments the model sent. Tools whose own arguments are injected
(`ToolRuntime`, `InjectedToolArg`, `InjectedState`) are not supported: the wrapper does not
pass injections on. A tool answering `content_and_artifact` is seen by the model through
its content alone.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextvars import ContextVar
from typing import Any, cast

from guards.tool_wrapper import guarded_call, guarded_call_sync
from loopwarden_integrations.extras import missing_extra
from loopwarden_integrations.run_guards import GuardSource, RunGuards

try:
    from langchain_core.callbacks import BaseCallbackHandler
    from langchain_core.callbacks.base import BaseCallbackManager
    from langchain_core.runnables import RunnableConfig
    from langchain_core.runnables.config import patch_config
    from langchain_core.tools import BaseTool, StructuredTool
    from langchain_core.tracers.context import register_configure_hook
except ImportError as exc:
    raise missing_extra("loopwarden_integrations.langchain", "langchain-core", "langchain") from exc


class AgentRun(BaseCallbackHandler):
    """Marks one root LangChain run for the guard; it handles no events."""

    run_inline = True

    # LangChain does not call a handler for the kinds of event it ignores.

    @property
    def ignore_llm(self) -> bool:
        return True

    @property
    def ignore_retry(self) -> bool:
        return True

    @property
    def ignore_chain(self) -> bool:
        return True

    @property
    def ignore_agent(self) -> bool:
        return True

    @property
    def ignore_retriever(self) -> bool:
        return True

    @property
    def ignore_chat_model(self) -> bool:
        return True

    @property
    def ignore_custom_event(self) -> bool:
        return True


class _NewRunMarker:
    """Read like a ContextVar by LangChain's configure hook: a fresh marker each time.

    The hook adds what `get()` returns to a callback manager that has no `AgentRun` yet,
    which is a root run's (inside a run, the marker is inherited).
    """

    def get(self, default: object = None) -> AgentRun:
        return AgentRun()


register_configure_hook(
    cast("ContextVar[Any]", _NewRunMarker()), inheritable=True, handle_class=AgentRun
)


# The turn of calls from runs that began before this module registered its hook.
_UNMARKED = AgentRun()


def _run_of(callbacks: object) -> AgentRun:
    """The marker of the run these callbacks belong to."""
    if isinstance(callbacks, BaseCallbackManager):
        for handler in callbacks.handlers:
            if isinstance(handler, AgentRun):
                return handler
    return _UNMARKED


def guard_tools(tools: Iterable[BaseTool], guard: GuardSource) -> list[BaseTool]:
    """Wrap LangChain tools so loopwarden's LoopGuard decides each call (see the module doc)."""
    runs = RunGuards(guard)
    wrapped: list[BaseTool] = []
    for tool in tools:
        if not isinstance(tool, BaseTool):
            raise TypeError(
                f"guard_tools wraps LangChain tools (BaseTool), got {type(tool).__name__}; "
                "make one with @tool first"
            )
        wrapped.append(_guarded(tool, runs))
    return wrapped


def _guarded(tool: BaseTool, runs: RunGuards) -> BaseTool:
    """A tool like `tool` whose calls pass through its run's guard."""
    name = tool.name

    def run(*, config: RunnableConfig, callbacks: Any = None, **args: Any) -> object:
        inner = patch_config(config, callbacks=callbacks)
        return guarded_call_sync(
            runs.of(_run_of(callbacks)), name, lambda **_: tool.invoke(args, inner), args
        )

    async def arun(*, config: RunnableConfig, callbacks: Any = None, **args: Any) -> object:
        inner = patch_config(config, callbacks=callbacks)
        return await guarded_call(
            runs.of(_run_of(callbacks)), name, lambda **_: tool.ainvoke(args, inner), args
        )

    return StructuredTool(
        name=name,
        description=tool.description,
        args_schema=tool.args_schema if tool.args_schema is not None else tool.get_input_schema(),
        func=run,
        coroutine=arun,
        return_direct=tool.return_direct,
        tags=tool.tags,
        metadata=tool.metadata,
    )
