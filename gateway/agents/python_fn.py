"""The `python` agent: a `module:function` of yours called with the turn.

Decisions where DESIGN.md is silent:
- The function is imported once, when the agent is built (at start-up), so a typo fails
  before anything connects, with a `ConfigError` naming `agents.<name>.function`.
- It may be sync or async and may return `str`, `None` (stay silent) or an
  `AgentResult` (to report tool calls or a halt). A sync function runs in a worker thread
  (`asyncio.to_thread`) so a blocking call in it cannot stall every other room.
- Exceptions it raises propagate to the pipeline's error stage, which logs them with
  the traceback; returning any other type is a `TypeError` naming the function.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING

from gateway.app.errors import ConfigError
from gateway.app.types import AgentResult
from gateway.config import PythonAgentConfig

if TYPE_CHECKING:
    from gateway.app.context import TurnContext


def import_callable(ref: str, *, field: str) -> Callable[..., object]:
    """Import `module:function`; a failure is a ConfigError on `field` saying what is wrong."""
    module_name, sep, attribute = ref.partition(":")
    if not sep or not module_name or not attribute:
        raise ConfigError(field, f"{ref!r} must be written module:function")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            field, f"cannot import module {module_name!r} ({exc}); is it on PYTHONPATH?"
        ) from None
    except Exception as exc:  # user code may raise anything at import: still a config error
        raise ConfigError(
            field, f"importing module {module_name!r} failed: {type(exc).__name__}: {exc}"
        ) from exc
    target: object = getattr(module, attribute, None)
    if target is None:
        raise ConfigError(field, f"module {module_name!r} has no attribute {attribute!r}")
    if not callable(target):
        raise ConfigError(field, f"{ref!r} is not callable")
    return target


class PythonAgent:
    """Calls a configured `module:function` with the TurnContext and wraps what it returns."""

    def __init__(self, config: PythonAgentConfig, *, name: str) -> None:
        self._ref = config.function
        self._function = import_callable(config.function, field=f"agents.{name}.function")
        self._is_async = inspect.iscoroutinefunction(self._function)

    async def respond(self, turn: TurnContext) -> AgentResult:
        """Call the function (awaiting it when async) and normalise its answer."""
        if self._is_async:
            outcome = self._function(turn)
        else:
            outcome = await asyncio.to_thread(self._function, turn)
        if inspect.isawaitable(outcome):
            outcome = await outcome
        if outcome is None or isinstance(outcome, str):
            return AgentResult(text=outcome)
        if isinstance(outcome, AgentResult):
            return outcome
        raise TypeError(
            f"{self._ref} returned {type(outcome).__name__}; expected str, None or AgentResult"
        )

    async def aclose(self) -> None:
        """Nothing to release."""
