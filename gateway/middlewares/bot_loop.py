"""Bot loop guard: a pair budget per room, a cap on consecutive bot turns, one notice per cooldown.

For a bot sender, `state.pair_decide` records the exchange between the hosted bot and the
sender (their platform user ids, direction-independent, scoped to the room) and decides
it atomically. The one exchange that exceeds the budget opens the cooldown and is the only
one answered `budget_exceeded`; every later exchange of the pair until the cooldown ends is
answered `cooldown`, by whichever replica or hosted bot asks, and a reset starts the pair
afresh. So the `budget_exceeded` refusal posts the room's one short notice for that cooldown
(when `announce_cooldown` is on and the cooldown is longer than 0) with no claim of its own,
and `cooldown` refusals are silent.

The consecutive-bot-turn count (`state.bot_turn`) is updated for every admitted message:
a bot message adds one, a human message resets it to 0 (admission resets it for the human
messages it refuses, too). The update is keyed by the message, so a message that several
hosted bots see counts once and every one of them gets the same count. Each bot message is
counted by the hosted bots that receive it, so a bot's own posts count through the other
hosted bots (the self filter runs earlier); with a single hosted bot, only the other bots'
messages count. Bot messages beyond `max_consecutive_bot_turns` (0 turns the cap off) are
dropped (`bot_turn_cap`) until a human speaks; the pair budget is not charged for them.
"""

from __future__ import annotations

from gateway import messages
from gateway.config import BotConfig, BotLoopSettings, RoomBotConfig
from gateway.context import TurnContext
from gateway.middlewares.channel_policy import PolicyCache
from gateway.pipeline import Handler
from gateway.refusals import DecisionLog
from gateway.types import Reply
from guards.bot_loop import PairDecision

_SLACK = "slack"


class BotLoopMiddleware:
    """Drops bot messages over the pair budget, in cooldown, or beyond the bot-turn cap."""

    def __init__(self, policies: PolicyCache, decisions: DecisionLog) -> None:
        self._policies = policies
        self._decisions = decisions

    async def __call__(self, ctx: TurnContext, call_next: Handler) -> Reply | None:
        settings = ctx.policy.bot_loop
        if not settings.enabled:
            return await call_next(ctx)
        msg = ctx.message
        state = ctx.state
        turns = await state.bot_turn(
            msg.room, is_bot=msg.sender_is_bot, message_key=msg.message_key
        )
        if not msg.sender_is_bot:
            return await call_next(ctx)
        cap = settings.max_consecutive_bot_turns
        if cap and turns > cap:
            self._refuse(
                ctx,
                "bot_turn_cap",
                f"{turns} bot turns in a row, cap {cap}; a human message resets it",
                count=turns,
            )
            return None
        decision = await state.pair_decide(
            scope=msg.room,
            self_bot_id=msg.bot_user_id or ctx.connector.bot_user_id,
            sender_bot_id=msg.sender_id,
            policy=self._policies.derived(ctx.policy).bot_loop,
        )
        if decision.allowed:
            self._decisions.guard(
                ctx, "bot_loop", decision.reason, "within the pair budget", count=decision.count
            )
            return await call_next(ctx)
        self._refuse(
            ctx,
            decision.reason,
            _detail(decision, settings),
            retry_after=decision.retry_after,
            count=decision.count,
        )
        if (
            decision.reason == "budget_exceeded"
            and settings.announce_cooldown
            and settings.cooldown_seconds > 0
        ):
            return self._notice(ctx, settings)
        return None

    def _refuse(
        self, ctx: TurnContext, code: str, detail: str, *, retry_after: float = 0.0, count: int
    ) -> None:
        """A refusal of this stage: a guard verdict, a refusal, and one of `status`'s lines."""
        self._decisions.metrics.guard_decision("bot_loop", code)
        self._decisions.refuse(
            ctx,
            "bot_loop",
            code,
            detail,
            who=_pair(ctx),
            retry_after=retry_after,
            count=count,
            remember=True,
        )

    def _notice(self, ctx: TurnContext, settings: BotLoopSettings) -> Reply:
        """The one notice of the cooldown this turn's `budget_exceeded` opened."""
        msg = ctx.message
        cooldown = settings.cooldown_seconds
        self._decisions.note(
            ctx,
            "bot_loop",
            "cooldown_notice",
            f"cooldown opened for {messages.format_duration(cooldown)}, notice posted "
            + _pair(ctx),
        )
        text = messages.cooldown_notice(
            _display_name(ctx.bot),
            msg.sender_name or msg.sender_id,
            cooldown=cooldown,
            budget=settings.max_events_per_window,
            window=settings.window_seconds,
            prefix="!loop" if msg.platform == _SLACK else "/loop",
        )
        return Reply(text, thread_id=msg.thread_id)


def _detail(decision: PairDecision, settings: BotLoopSettings) -> str:
    """Why the pair was refused, in words, for the decision log and `status`."""
    budget = settings.max_events_per_window
    window = messages.format_duration(settings.window_seconds)
    if decision.reason == "budget_exceeded":
        return (
            f"event {decision.count + 1} over {budget} per {window}, "
            f"cooldown {messages.format_duration(decision.retry_after)}"
        )
    return f"cooling down, {messages.format_duration(decision.retry_after)} left"


def _pair(ctx: TurnContext) -> str:
    """`pair=parrot↔echo`: the hosted bot and the sender, for decision log lines."""
    msg = ctx.message
    return f"pair={msg.bot_id}↔{msg.sender_name or msg.sender_id}"


def _display_name(bot: BotConfig) -> str:
    """How the hosted bot is named in notices: its room name when it has one, else its id."""
    if isinstance(bot, RoomBotConfig) and bot.name:
        return bot.name
    return bot.id
