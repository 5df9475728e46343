"""TurnContext: the typed context one inbound message carries through the pipeline, and the
Agent protocol a turn is handed to (one async call per turn: the reply and its tool calls).

`policy` is the room's effective Policy and `resolved` the same policy with the guard
policies derived from it: the channel-policy stage sets both at once from the policy
cache (`ctx.resolved = …`). A turn built with a policy of its own (the runtime starts
every turn on the config's defaults; tests build turns directly) derives `resolved` once,
on first use, from whatever `policy` holds then, so the two never disagree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from gateway.app.policies import ResolvedPolicy
from gateway.app.types import AgentResult, HistoryEntry, InboundMessage
from gateway.config import BotConfig, Config, Policy

if TYPE_CHECKING:
    from gateway.app.connector import Connector
    from gateway.delivery.streaming import ReplyStream
    from gateway.state.base import DecisionStore


@dataclass(frozen=True, slots=True)
class Decision:
    """One stage's verdict on a turn, kept so every outcome can be explained.

    `shadow`: a verdict of a guard in shadow mode, which let the turn go on.
    """

    stage: str
    code: str
    reason: str
    retry_after: float = 0.0
    count: int = 0
    shadow: bool = False


@dataclass(slots=True)
class TurnContext:
    """Everything a middleware may read or set for one message to one hosted bot."""

    message: InboundMessage
    policy: Policy
    state: DecisionStore
    """The guards' counters and claims (the bot-loop stages', the agent's spend notices);
    every other stage is handed the store it uses when the pipeline is built."""
    config: Config
    bot: BotConfig
    connector: Connector
    agent: Agent
    decisions: list[Decision] = field(default_factory=list)
    result: AgentResult | None = None
    bot_turns: int = 0
    """Bot messages in a row in the room, this one included (set by the `bot_turns` stage)."""
    history: tuple[HistoryEntry, ...] = ()
    """The room's recent transcript before this message, oldest first, for the agent."""
    stream: ReplyStream | None = None
    """Where a streaming agent writes its reply as it comes (set where the platform edits)."""
    _resolved: ResolvedPolicy | None = field(default=None, init=False, repr=False)
    _scope: str = field(default="", init=False, repr=False)
    _scope_of: InboundMessage | None = field(default=None, init=False, repr=False)

    @property
    def scope(self) -> str:
        """The key the room's budgets, pause and overrides are kept under (`RoomLinks.scope`).

        Worked out once per message (several stages read it), again only for a new `message`.
        """
        msg = self.message
        if self._scope_of is not msg:
            self._scope = self.config.room_links.scope(msg.room)
            self._scope_of = msg
        return self._scope

    @property
    def resolved(self) -> ResolvedPolicy:
        """`policy` with its guard policies: the cache's entry, else derived once from it."""
        resolved = self._resolved
        if resolved is None or resolved.policy is not self.policy:
            resolved = self._resolved = ResolvedPolicy.derive(self.policy)
        return resolved

    @resolved.setter
    def resolved(self, resolved: ResolvedPolicy) -> None:
        self.policy = resolved.policy
        self._resolved = resolved

    def decide(
        self,
        stage: str,
        code: str,
        reason: str,
        *,
        retry_after: float = 0.0,
        count: int = 0,
        shadow: bool = False,
    ) -> Decision:
        """Record a stage's decision on this turn and return it."""
        decision = Decision(stage, code, reason, retry_after, count, shadow)
        self.decisions.append(decision)
        return decision


class Agent(Protocol):
    """Produces the reply to one turn. Must not raise for ordinary failures of its own."""

    async def respond(self, turn: TurnContext) -> AgentResult: ...

    async def aclose(self) -> None: ...


@runtime_checkable
class StartingAgent(Agent, Protocol):
    """An agent with connections to open when the gateway starts (the openai agent's MCP
    servers), so its first turn does not wait for them; a failure there is its own to log."""

    async def start(self) -> None: ...
