"""Bot loop guard: pair and room budgets, a cap on consecutive bot turns, a notice per cooldown.

Two stages, both this module's. `bot_turns` (before admission) keeps the room's
consecutive-bot-turn count, and is its only writer in the pipeline: every message that
reaches it updates `state.bot_turn` (a bot message adds one, a human message resets it to
0), answered or not, so a human message admission refuses still resets the count, and
bot messages no hosted bot answers (a paused room, `respond_to`) still count as bot turns
in the room. The update is keyed by the message, so a message that several hosted bots
see counts once and every one of them gets the same count (`ctx.bot_turns`). Each bot
message is counted by the hosted bots that receive it, so a bot's own posts count through
the other hosted bots (the self filter runs earlier); with a single hosted bot, only the
other bots' messages count.

`bot_loop` (after admission) decides the admitted bot messages. Bot messages beyond
`max_consecutive_bot_turns` (0 turns the cap off) are dropped (`bot_turn_cap`) until a
human speaks; the pair budget is not charged for them. Otherwise `state.pair_decide`
records the exchange between the hosted bot and the sender (their platform user ids,
direction-independent, scoped to the room) and decides it atomically. The one exchange
that exceeds the budget opens the cooldown and is the only one answered
`budget_exceeded`; every later exchange of the pair until the cooldown ends is answered
`cooldown`, by whichever replica or hosted bot asks, and a reset starts the pair afresh.

A bot message its pair admitted is then charged to the room budget (guards/room_budget.py,
issue 20): `state.room_decide` records it under the room, keyed by the message (so it
counts once however many hosted bots or replicas receive it) with the sender's name (at
most 64 characters), whatever the pair. The message over `room_max_events_per_window` in
`room_window_seconds` is refused `room_budget_exceeded` and opens the room cooldown
(`room_cooldown` after it, with the seconds left as `retry_after` and the window's count
as `count`); its guard verdicts are `guard_decisions_total{guard="bot_loop"}` with those
codes (an admitted message counts once, as the pair's `ok`). Its notice is claimed like
the pair's, by the room and the cooldown's end (`RoomDecision.until`), and names the bots
of the window (`messages.room_cooldown_notice`). In shadow mode it is decided alike,
logged and counted with `shadow="true"`, and no notice is posted.

The cooldown notice (when `announce_cooldown` is on and the cooldown is longer than 0)
is posted once per cooldown: the refusal that wins the cooldown's notice claim
(`state.claim` of the pair and the cooldown's end, `PairDecision.until`, for the rest of
the cooldown) posts it. That is the `budget_exceeded` refusal that opens it, unless a
replica's `cooldown` refusal of the same cooldown claimed it first (it then posts it
instead: one notice either way), or, for a cooldown opened in shadow mode, the first
enforce-mode refusal of it. The notice names the hosted bot
by its display name and the admin command by the platform's prefix
(`capabilities.command_prefix`): this module knows no platform.

In shadow mode (`bot_loop.mode: shadow`) the stage decides exactly as in enforce (the
same `pair_decide`, so the same counts, and a cooldown opened as far as the state goes;
a message over the bot-turn cap is not charged to the pair, as in enforce), records what
it would have refused (`DecisionLog.shadow`), posts no notice and hands the message on.
A switch to enforce takes effect on the next message, with the state built in shadow: a
pair in a cooldown opened in shadow is refused at once, and that refusal posts the notice.
A reset ends a cooldown: the pair's next cooldown is another one, with a notice of its
own.
"""

from __future__ import annotations

from gateway.app import messages
from gateway.app.context import TurnContext
from gateway.app.pipeline import Handler
from gateway.app.refusals import DecisionLog
from gateway.app.types import InboundMessage, Reply
from gateway.config import BotLoopSettings
from guards.bot_loop import PairDecision, pair_key
from guards.room_budget import RoomDecision

_GUARD = "bot_loop"
# A sender's name as the room budget keeps it (and its notice shows it) is cut to this.
_LABEL_CHARS = 64


class BotTurnsMiddleware:
    """Counts the room's consecutive bot turns for every message, into `ctx.bot_turns`."""

    name = "bot_turns"

    async def __call__(self, ctx: TurnContext, call_next: Handler) -> Reply | None:
        if ctx.policy.bot_loop.enabled:
            msg = ctx.message
            ctx.bot_turns = await ctx.state.bot_turn(
                msg.room, is_bot=msg.sender_is_bot, message_key=msg.message_key
            )
        return await call_next(ctx)


class BotLoopMiddleware:
    """Drops bot messages over the pair budget, in cooldown, or beyond the bot-turn cap."""

    name = "bot_loop"

    def __init__(self, decisions: DecisionLog) -> None:
        self._decisions = decisions

    async def __call__(self, ctx: TurnContext, call_next: Handler) -> Reply | None:
        msg = ctx.message
        settings = ctx.policy.bot_loop
        if not msg.sender_is_bot or not settings.enabled:
            return await call_next(ctx)
        resolved = ctx.resolved
        shadow = resolved.bot_loop_shadow
        cap = settings.max_consecutive_bot_turns
        turns = ctx.bot_turns
        if cap and turns > cap:
            detail = messages.bot_turn_cap_detail(turns, cap)
            if shadow:
                self._decisions.shadow(
                    ctx, _GUARD, "bot_turn_cap", detail, who=_pair(ctx), count=turns
                )
                return await call_next(ctx)
            self._refuse(ctx, "bot_turn_cap", detail, count=turns)
            return None
        self_bot_id = msg.bot_user_id or ctx.connector.bot_user_id
        decision = await ctx.state.pair_decide(
            scope=msg.room,
            self_bot_id=self_bot_id,
            sender_bot_id=msg.sender_id,
            policy=resolved.bot_loop,
        )
        if decision.allowed:
            room = await ctx.state.room_decide(
                scope=msg.room,
                bot=_label(msg),
                message_key=msg.message_key,
                policy=resolved.bot_loop,
            )
            if not room.allowed:
                return await self._room_refused(ctx, call_next, room, settings, shadow=shadow)
            self._decisions.guard(
                ctx,
                _GUARD,
                decision.reason,
                "within the pair budget",
                count=decision.count,
                shadow=shadow,
            )
            return await call_next(ctx)
        detail = _detail(decision, settings)
        if shadow:
            self._decisions.shadow(
                ctx,
                _GUARD,
                decision.reason,
                detail,
                who=_pair(ctx),
                retry_after=decision.retry_after,
                count=decision.count,
            )
            return await call_next(ctx)
        self._refuse(
            ctx, decision.reason, detail, retry_after=decision.retry_after, count=decision.count
        )
        if settings.announce_cooldown and settings.cooldown_seconds > 0:
            key = _notice_key(msg.room, self_bot_id, msg.sender_id, decision.until)
            if await ctx.state.claim(key, decision.retry_after):
                return self._notice(ctx, settings, decision.retry_after)
        return None

    async def _room_refused(
        self,
        ctx: TurnContext,
        call_next: Handler,
        room: RoomDecision,
        settings: BotLoopSettings,
        *,
        shadow: bool,
    ) -> Reply | None:
        """A bot message over the room budget: refused (or, in shadow, logged and handed on)."""
        if room.reason == "room_budget_exceeded":
            detail = messages.room_budget_exceeded_detail(
                room.count + 1,
                settings.room_max_events_per_window,
                window=settings.room_window_seconds,
                cooldown=room.retry_after,
                bots=room.bots,
            )
        else:
            detail = messages.room_cooling_down_detail(room.retry_after)
        if shadow:
            self._decisions.shadow(
                ctx,
                _GUARD,
                room.reason,
                detail,
                who=_pair(ctx),
                retry_after=room.retry_after,
                count=room.count,
            )
            return await call_next(ctx)
        self._refuse(ctx, room.reason, detail, retry_after=room.retry_after, count=room.count)
        if not (settings.announce_cooldown and settings.cooldown_seconds > 0):
            return None
        end = "unknown" if room.until is None else repr(room.until)
        if not await ctx.state.claim(f"room-notice:{ctx.message.room}:{end}", room.retry_after):
            return None
        names = messages.bot_names(room.bots)
        self._decisions.note(
            ctx,
            self.name,
            "room_cooldown_notice",
            f"room cooldown opened for {messages.format_duration(room.retry_after)}, "
            f"notice posted, bots={names}",
        )
        text = messages.room_cooldown_notice(
            room.bots,
            cooldown=room.retry_after,
            budget=settings.room_max_events_per_window,
            window=settings.room_window_seconds,
            prefix=ctx.connector.capabilities.command_prefix,
        )
        return Reply(text, thread_id=ctx.message.thread_id)

    def _refuse(
        self, ctx: TurnContext, code: str, detail: str, *, retry_after: float = 0.0, count: int
    ) -> None:
        """A refusal of this stage: a guard verdict, a refusal, and one of `status`'s lines."""
        self._decisions.metrics.guard_decision(_GUARD, code)
        self._decisions.refuse(
            ctx,
            self.name,
            code,
            detail,
            who=_pair(ctx),
            retry_after=retry_after,
            count=count,
            remember=True,
        )

    def _notice(self, ctx: TurnContext, settings: BotLoopSettings, cooldown: float) -> Reply:
        """The one notice of the pair's cooldown, which has `cooldown` seconds left."""
        msg = ctx.message
        self._decisions.note(
            ctx,
            self.name,
            "cooldown_notice",
            f"cooldown opened for {messages.format_duration(cooldown)}, notice posted "
            + _pair(ctx),
        )
        text = messages.cooldown_notice(
            ctx.bot.display_name,
            msg.sender_name or msg.sender_id,
            cooldown=cooldown,
            budget=settings.max_events_per_window,
            window=settings.window_seconds,
            prefix=ctx.connector.capabilities.command_prefix,
        )
        return Reply(text, thread_id=msg.thread_id)


def _detail(decision: PairDecision, settings: BotLoopSettings) -> str:
    """Why the pair was refused, in words, for the decision log and `status`."""
    if decision.reason == "budget_exceeded":
        return messages.budget_exceeded_detail(
            decision.count + 1,
            settings.max_events_per_window,
            window=settings.window_seconds,
            cooldown=decision.retry_after,
        )
    return messages.cooling_down_detail(decision.retry_after)


def _notice_key(room: str, self_bot_id: str, sender_bot_id: str, until: float | None) -> str:
    """The claim of one cooldown's notice: the pair (direction-independent) and its end.

    The end is read from the state, so it is the same on every replica. Two cooldowns of
    a pair ending at the same instant (a reset and a new cooldown with no time passing,
    as under a frozen clock) share one notice.
    """
    a, b = pair_key(self_bot_id, sender_bot_id)
    end = "unknown" if until is None else repr(until)
    return f"cooldown-notice:{room}:{a}:{b}:{end}"


def _label(msg: InboundMessage) -> str:
    """How the room budget records a sender, for its notice: the name, at most 64 characters."""
    return (msg.sender_name or msg.sender_id)[:_LABEL_CHARS]


def _pair(ctx: TurnContext) -> str:
    """`pair=parrot↔echo`: the hosted bot and the sender, for decision log lines."""
    msg = ctx.message
    return f"pair={msg.bot_id}↔{msg.sender_name or msg.sender_id}"
