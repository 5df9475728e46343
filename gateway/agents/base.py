"""The Agent protocol: one async call per turn, returning the reply and its tool calls."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from gateway.types import AgentResult

if TYPE_CHECKING:
    from gateway.context import TurnContext


class Agent(Protocol):
    """Produces the reply to one turn. Must not raise for ordinary failures of its own."""

    async def respond(self, turn: TurnContext) -> AgentResult: ...

    async def aclose(self) -> None: ...
