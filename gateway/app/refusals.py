"""Recording a stage's verdict: the decision log line, its counter, and recent refusals.

Every refusal goes to the `loopwarden.decision` logger with a line a person can read in
a terminal (`discord:123 bot_loop refused budget_exceeded (event 21 over 20 per 60 s,
cooldown 60 s) pair=parrot↔echo`) and structured `extra` fields (`decision`, `stage`,
`room`, `bot`, `sender`) for JSON log handlers; admitted guard verdicts go there at DEBUG.
The refusals of the bot-loop and spend stages are also kept, a few per room, in an
in-process ring buffer that `/loop status` shows. The message text is never logged.

A guard in shadow mode (DESIGN.md §5) refuses nothing: what it would have refused is
logged at INFO as `… bot_loop shadow: would have refused budget_exceeded (…)` with
`shadow: "true"` among the structured fields, counted under
`guard_decisions_total{shadow="true"}`, and counted per room and guard for `status`
("shadow: would have refused N", since this process started).

With an Activity feed (gateway/observability/activity.py), refusals (but those logged
at DEBUG), shadow verdicts, notices and each message that reaches a hosted bot
(`arrived`) go there too.

With tracing on, each verdict recorded here (a refusal, an admitted guard verdict, a
shadow verdict, a halt of the agent's turn) is an `apply_guardrail <guard>` span in the
turn's trace: `gen_ai.guardrail.name`, `.code`, `.result` (`allowed`, `refused`, or
`shadow_refused` for what a guard in shadow mode would have refused) and `.shadow`.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gateway.app.context import TurnContext
from gateway.observability import tracing
from gateway.observability.metrics import Metrics
from gateway.observability.visible import visible

if TYPE_CHECKING:
    from gateway.observability.activity import ActivityFeed

decision_log = logging.getLogger("loopwarden.decision")


@dataclass(frozen=True, slots=True)
class Refusal:
    """One refused message, as `status` lists it: when, which stage, why, and between whom."""

    at: float
    stage: str
    code: str
    detail: str
    bot: str
    sender: str


class RecentRefusals:
    """The newest refusals per room, bounded both per room and in the number of rooms."""

    def __init__(
        self,
        *,
        per_room: int = 10,
        max_rooms: int = 10_000,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self._per_room = per_room
        self._max_rooms = max_rooms
        self.clock = clock or time.monotonic
        self._rooms: OrderedDict[str, deque[Refusal]] = OrderedDict()
        self._shadowed: OrderedDict[str, dict[str, int]] = OrderedDict()

    def add(self, room: str, stage: str, code: str, detail: str, *, bot: str, sender: str) -> None:
        """Remember one refusal; the least recently refused room goes when the cap is hit."""
        entries = self._rooms.get(room)
        if entries is None:
            if len(self._rooms) >= self._max_rooms:
                self._rooms.popitem(last=False)
            entries = self._rooms[room] = deque(maxlen=self._per_room)
        else:
            self._rooms.move_to_end(room)
        entries.append(Refusal(self.clock(), stage, code, detail, bot, sender))

    def add_shadowed(self, room: str, guard: str) -> None:
        """Count one refusal a guard in shadow mode would have made in the room."""
        counts = self._shadowed.get(room)
        if counts is None:
            if len(self._shadowed) >= self._max_rooms:
                self._shadowed.popitem(last=False)
            counts = self._shadowed[room] = {}
        else:
            self._shadowed.move_to_end(room)
        counts[guard] = counts.get(guard, 0) + 1

    def shadowed(self, room: str) -> dict[str, int]:
        """How many refusals each guard in shadow mode would have made in the room."""
        return dict(self._shadowed.get(room, {}))

    def recent(self, room: str, limit: int = 5) -> list[Refusal]:
        """The room's newest refusals, newest first."""
        entries = self._rooms.get(room)
        if not entries:
            return []
        return list(reversed(entries))[:limit]


class DecisionLog:
    """How stages record verdicts: on the turn, in the log, in metrics and for `status`."""

    def __init__(
        self, metrics: Metrics, recent: RecentRefusals, activity: ActivityFeed | None = None
    ) -> None:
        self.metrics = metrics
        self.recent = recent
        self.activity = activity

    def arrived(self, ctx: TurnContext) -> None:
        """Record that a message reached this hosted bot's pipeline (the Activity feed)."""
        if self.activity is not None:
            self.activity.message_in(ctx.message)

    def refuse(
        self,
        ctx: TurnContext,
        stage: str,
        code: str,
        detail: str,
        *,
        who: str = "",
        retry_after: float = 0.0,
        count: int = 0,
        level: int = logging.INFO,
        remember: bool = False,
    ) -> None:
        """Record that `stage` dropped this turn for `code`; `detail` explains it in words."""
        _verdict(ctx, stage, code, detail, tracing.REFUSED, retry_after=retry_after, count=count)
        self.metrics.refusal(stage, code)
        msg = ctx.message
        if remember:
            self.recent.add(msg.room, stage, code, detail, bot=msg.bot_id, sender=msg.sender_name)
        if self.activity is not None and level > logging.DEBUG:
            self.activity.decision("refusal", msg, stage, code, detail)
        _log(level, ctx, stage=stage, code=code, detail=detail, who=who, verb="refused ")

    def guard(
        self,
        ctx: TurnContext,
        guard: str,
        code: str,
        detail: str,
        *,
        who: str = "",
        retry_after: float = 0.0,
        count: int = 0,
        shadow: bool = False,
    ) -> None:
        """Record an admitted guard verdict: counted always, logged at DEBUG."""
        _verdict(
            ctx,
            guard,
            code,
            detail,
            tracing.ALLOWED,
            retry_after=retry_after,
            count=count,
            shadow=shadow,
        )
        self.metrics.guard_decision(guard, code, shadow=shadow)
        _log(logging.DEBUG, ctx, stage=guard, code=code, detail=detail, who=who, shadow=shadow)

    def shadow(
        self,
        ctx: TurnContext,
        guard: str,
        code: str,
        detail: str,
        *,
        who: str = "",
        retry_after: float = 0.0,
        count: int = 0,
    ) -> None:
        """Record what a guard in shadow mode would have refused; the turn goes on."""
        _verdict(
            ctx,
            guard,
            code,
            detail,
            tracing.SHADOW_REFUSED,
            retry_after=retry_after,
            count=count,
            shadow=True,
        )
        self.metrics.guard_decision(guard, code, shadow=True)
        self.recent.add_shadowed(ctx.message.room, guard)
        if self.activity is not None:
            self.activity.decision("shadow", ctx.message, guard, code, detail)
        _log(
            logging.INFO,
            ctx,
            stage=guard,
            code=code,
            detail=detail,
            who=who,
            verb="shadow: would have refused ",
            shadow=True,
        )

    def halted(self, ctx: TurnContext, guard: str, code: str) -> None:
        """Record that `guard` halted the agent's turn (`code`): on the turn and logged."""
        _verdict(ctx, guard, code, "the agent's turn was halted", tracing.REFUSED)
        self.note(ctx, guard, code, f"halted the agent's turn ({code})")

    def note(self, ctx: TurnContext, stage: str, code: str, text: str) -> None:
        """Log an event that is not a refusal (a notice posted, a command run) at INFO."""
        if self.activity is not None:
            self.activity.decision("notice", ctx.message, stage, code, text)
        if decision_log.isEnabledFor(logging.INFO):
            decision_log.info(
                "%s %s %s", ctx.message.room, stage, visible(text), extra=_extra(ctx, code, stage)
            )


def _verdict(
    ctx: TurnContext,
    guard: str,
    code: str,
    detail: str,
    result: str,
    *,
    retry_after: float = 0.0,
    count: int = 0,
    shadow: bool = False,
) -> None:
    """Put one verdict on the turn and, with tracing on, in its trace as a guardrail span."""
    ctx.decide(guard, code, detail, retry_after=retry_after, count=count, shadow=shadow)
    if tracing.tracer().enabled:  # tracing off: no call, no arguments built
        tracing.guardrail(guard, code, result, shadow=shadow, detail=detail)


def _log(
    level: int,
    ctx: TurnContext,
    *,
    stage: str,
    code: str,
    detail: str,
    who: str,
    verb: str = "",
    shadow: bool = False,
) -> None:
    """One decision line, `room stage [refused ]code (detail) who`, with structured fields.

    The detail and who are one line whatever a display name holds (`gateway.observability.visible`).
    """
    if decision_log.isEnabledFor(level):
        msg = ctx.message
        decision_log.log(
            level,
            "%s %s %s%s (%s) %s",
            msg.room,
            stage,
            verb,
            code,
            visible(detail),
            visible(who or f"bot={msg.bot_id} sender={msg.sender_name or msg.sender_id}"),
            extra=_extra(ctx, code, stage, shadow=shadow),
        )


def _extra(ctx: TurnContext, code: str, stage: str, *, shadow: bool = False) -> dict[str, object]:
    msg = ctx.message
    return {
        "decision": code,
        "stage": stage,
        "room": msg.room,
        "bot": msg.bot_id,
        "sender": msg.sender_id,
        "shadow": "true" if shadow else "false",
    }
