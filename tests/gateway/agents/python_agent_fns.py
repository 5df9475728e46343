"""Functions the python-agent tests name as `module:function`."""

from __future__ import annotations

import asyncio

from gateway.app.context import TurnContext
from gateway.app.types import AgentResult, ToolCall

NOT_CALLABLE = "just a string"


def shout(turn: TurnContext) -> str:
    """A sync agent: upper-cases the message."""
    return turn.message.text.upper()


async def greet(turn: TurnContext) -> str:
    """An async agent: greets the sender."""
    await asyncio.sleep(0)
    return f"hello {turn.message.sender_name}"


def silent(turn: TurnContext) -> None:
    """An agent that chooses silence."""
    return


def full_result(turn: TurnContext) -> AgentResult:
    """An agent that reports a tool call itself."""
    return AgentResult(text="done", tool_calls=(ToolCall("lookup", "{}", "allow", "ok"),))


def wrong_type(turn: TurnContext) -> int:
    """An agent that returns something the gateway cannot send."""
    return 42
