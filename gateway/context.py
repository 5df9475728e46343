"""TurnContext: the typed context one inbound message carries through the pipeline."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gateway.config import BotConfig, Config, Policy
from gateway.types import AgentResult, InboundMessage

if TYPE_CHECKING:
    from gateway.agents.base import Agent
    from gateway.connector import Connector
    from gateway.state.base import StateStore


@dataclass(frozen=True, slots=True)
class Decision:
    """One stage's verdict on a turn, kept so every outcome can be explained."""

    stage: str
    code: str
    reason: str
    retry_after: float = 0.0
    count: int = 0


@dataclass(slots=True)
class TurnContext:
    """Everything a middleware may read or set for one message to one hosted bot."""

    message: InboundMessage
    policy: Policy
    state: StateStore
    config: Config
    bot: BotConfig
    connector: Connector
    agent: Agent
    decisions: list[Decision] = field(default_factory=list)
    result: AgentResult | None = None

    def decide(
        self, stage: str, code: str, reason: str, *, retry_after: float = 0.0, count: int = 0
    ) -> Decision:
        """Record a stage's decision on this turn and return it."""
        decision = Decision(stage, code, reason, retry_after, count)
        self.decisions.append(decision)
        return decision
