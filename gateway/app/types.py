"""The data that flows through the gateway: inbound messages, replies, agent results."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass(frozen=True, slots=True)
class InboundMessage:
    """One message seen by one hosted bot, translated from a platform event.

    `bot_id` is the hosted bot's config id and `bot_user_id` its platform user id (the
    identity used for the self filter and the bot-loop pair key). `event_id` is the
    platform's delivery id when it has one (Telegram update_id, Slack event_id); dedupe
    falls back to `message_id`.
    """

    platform: str
    bot_id: str
    channel_id: str
    thread_id: str | None
    message_id: str
    sender_id: str
    sender_name: str
    sender_is_bot: bool
    text: str
    mentions_bot: bool = False
    reply_to_bot: bool = False
    is_direct: bool = False
    received_at: float = 0.0
    raw: object = field(default=None, repr=False, compare=False)
    bot_user_id: str = ""
    event_id: str | None = None
    room: str = field(init=False, repr=False, compare=False)
    """The room scope, `platform:channel`, that budgets and policies are kept per.

    Made once with the message (every message is asked for it, most more than once, and
    a property made the string each time).
    """

    def __post_init__(self) -> None:
        object.__setattr__(self, "room", f"{self.platform}:{self.channel_id}")

    @property
    def message_key(self) -> str:
        """Identity of the message itself, the same for every hosted bot that sees it."""
        return f"{self.platform}:{self.channel_id}:{self.message_id}"

    @property
    def delivery_key(self) -> str:
        """Identity of this delivery to this bot: what dedupe receipts are kept for."""
        return f"{self.platform}:{self.bot_id}:{self.event_id or self.message_key}"

    @property
    def addressed(self) -> bool:
        """True when the sender spoke to this bot directly (mention, reply, DM)."""
        return self.mentions_bot or self.reply_to_bot or self.is_direct


@dataclass(frozen=True, slots=True)
class Reply:
    """A reply to send into a room.

    `ephemeral_to` asks for a message only that user sees (Slack), where the platform
    supports it; other connectors post it normally. `system` marks the gateway's own
    answer (to a `/loop` command): a platform where the gateway may post as someone other
    than the bot (the web room) shows it from loopwarden itself; on the others a bot can
    only post as itself, and does.
    """

    text: str
    thread_id: str | None = None
    reply_to: str | None = None
    ephemeral_to: str | None = None
    system: bool = False


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    """One earlier message of the room as an agent sees it (DESIGN.md §3).

    `role` is `assistant` for the hosted bot's own messages and `user` for everyone
    else's; `name` is the sender's display name and `text` the message as posted.
    """

    role: Literal["user", "assistant"]
    name: str
    text: str


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call an agent made during a turn, with the guard's verdict.

    `shadow`: the guard ran in shadow mode, so the call ran and its result went back to
    the model unchanged whatever the verdict.
    """

    name: str
    arguments: str
    action: str
    code: str
    shadow: bool = False


@dataclass(frozen=True, slots=True)
class Halt:
    """Why an agent ended a turn early: the guard that stopped it and that guard's code.

    `guard` is `tool_loop` (the code is the tool call's HALT verdict, e.g.
    `no_progress_halt`), `call_loop` (`loop_detected`, `loop_paused`), `spend`
    (`budget_exceeded`: `detail` names the budget's group and figures, `retry_after` is the
    time to the period's end; `state_unavailable`: the budget could not be checked) or
    `agent` (the agent's own limit, e.g. `max_tool_rounds`).
    """

    guard: str
    code: str
    detail: str = ""
    retry_after: float = 0.0


@dataclass(frozen=True, slots=True)
class AgentResult:
    """What an agent produced for one turn: the reply text (None for nothing) and its tool calls.

    `halt` says why the agent stopped early, None when it finished the turn. `shadowed`
    lists, in order, the LLM-call refusals a call guard in shadow mode let through (each
    the `Halt` enforce mode would have ended the turn with); a tool-call guard's shadow
    verdicts are on its `tool_calls`.
    """

    text: str | None
    tool_calls: tuple[ToolCall, ...] = ()
    halt: Halt | None = None
    shadowed: tuple[Halt, ...] = ()

    @property
    def halted(self) -> bool:
        """True when a guard or a limit ended the turn before the agent finished."""
        return self.halt is not None
