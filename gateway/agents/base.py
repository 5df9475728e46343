"""The Agent protocol: one async call per turn, returning the reply and its tool calls."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

from gateway.types import AgentResult

if TYPE_CHECKING:
    from gateway.context import TurnContext


class Agent(Protocol):
    """Produces the reply to one turn. Must not raise for ordinary failures of its own."""

    async def respond(self, turn: TurnContext) -> AgentResult: ...

    async def aclose(self) -> None: ...


@runtime_checkable
class StartingAgent(Agent, Protocol):
    """An agent with connections to open when the gateway starts (the openai agent's MCP
    servers), so its first turn does not wait for them; a failure there is its own to log."""

    async def start(self) -> None: ...
