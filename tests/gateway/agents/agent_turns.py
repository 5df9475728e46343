"""Helpers for agent tests: TurnContexts (only the message and policy matter to an agent)
and an injected sleep that records its waits."""

from __future__ import annotations

from gateway.app.context import TurnContext
from gateway.app.types import AgentResult, InboundMessage
from gateway.config import Config, Policy, RoomBotConfig
from gateway.state.memory import MemoryStateStore
from tests.fakes.inmemory import InMemoryConnector


class SleepRecorder:
    """An injected sleep that only records how long it was asked to wait."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


class NullAgent:
    """A placeholder for the turn's agent slot (the agent under test is called directly)."""

    async def respond(self, turn: TurnContext) -> AgentResult:
        """Say nothing."""
        return AgentResult(text=None)

    async def aclose(self) -> None:
        """Nothing to close."""


def make_turn(
    text: str,
    *,
    sender_name: str = "alice",
    sender_is_bot: bool = False,
    channel_id: str = "c1",
    thread_id: str | None = None,
    policy: Policy | None = None,
) -> TurnContext:
    """A turn for one human message in a room of the local `room` platform."""
    bot = RoomBotConfig(id="bot-1", platform="room", agent="a")
    message = InboundMessage(
        platform="room",
        bot_id="bot-1",
        channel_id=channel_id,
        thread_id=thread_id,
        message_id="m1",
        sender_id="u-alice",
        sender_name=sender_name,
        sender_is_bot=sender_is_bot,
        text=text,
    )
    return TurnContext(
        message=message,
        policy=policy or Policy(),
        state=MemoryStateStore(),
        config=Config(),
        bot=bot,
        connector=InMemoryConnector("bot-1"),
        agent=NullAgent(),
    )
