"""Admission: is this room paused, and does this bot answer this kind of sender here?

`respond_to.humans` and `respond_to.bots` are each `all`, `mentions` or `none`. A human
counts as addressing the bot by mention, reply to the bot, or direct message. A bot
counts only by an explicit mention or a direct message: replying to a message adds an
automatic mention on some platforms (Discord's reply ping, Telegram's reply), and a bot
that merely replies is how loops start, so `reply_to_bot` from a bot is not a mention.
A sender whose bot-ness the platform cannot tell arrives with `sender_is_bot=True`
(connectors fail closed, and the self filter does for platforms that never tell), so the
bot rules apply to it.

A human message refused here still resets the room's consecutive-bot-turn count (when
the bot-loop guard is on): the cap counts bot turns without a human message in the room,
not without one this bot answered.
"""

from __future__ import annotations

from gateway.context import TurnContext
from gateway.messages import format_duration
from gateway.pipeline import Handler
from gateway.refusals import DecisionLog
from gateway.types import Reply


class AdmissionMiddleware:
    """Drops messages in paused rooms and from senders the policy does not answer."""

    def __init__(self, decisions: DecisionLog) -> None:
        self._decisions = decisions

    async def __call__(self, ctx: TurnContext, call_next: Handler) -> Reply | None:
        msg = ctx.message
        paused = await ctx.state.pause_remaining(msg.room)
        if paused is not None:
            self._decisions.refuse(
                ctx, "admission", "paused", f"room paused, {format_duration(paused)} left"
            )
            await _human_spoke(ctx)
            return None
        respond = ctx.policy.respond_to
        if msg.sender_is_bot:
            mode = respond.bots
            addressed = msg.mentions_bot or msg.is_direct
            kind = "bots"
        else:
            mode = respond.humans
            addressed = msg.addressed
            kind = "humans"
        if mode == "all" or (mode == "mentions" and addressed):
            return await call_next(ctx)
        if mode == "none":
            code, detail = f"{kind}_off", f"this room answers no {kind}"
        else:
            code, detail = "not_addressed", f"{kind} must mention the bot here"
        self._decisions.refuse(ctx, "admission", code, detail, remember=True)
        await _human_spoke(ctx)
        return None


async def _human_spoke(ctx: TurnContext) -> None:
    """Reset the room's bot-turn count for a refused human message, as the guard would."""
    msg = ctx.message
    if not msg.sender_is_bot and ctx.policy.bot_loop.enabled:
        await ctx.state.bot_turn(msg.room, is_bot=False, message_key=msg.message_key)
