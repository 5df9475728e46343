"""Admission: is this room paused, and does this bot answer this kind of sender here?

`respond_to.humans` and `respond_to.bots` are each `all`, `mentions` or `none`. A human
counts as addressing the bot by mention, reply to the bot, or direct message. A bot
counts only by an explicit mention or a direct message: replying to a message adds an
automatic mention on some platforms (Discord's reply ping, Telegram's reply), and a bot
that merely replies is how loops start, so `reply_to_bot` from a bot is not a mention.
A sender whose bot-ness the platform cannot tell arrives with `sender_is_bot=True`
(connectors fail closed, and the self filter does for platforms that never tell), so the
bot rules apply to it.

Admission only decides; it keeps no count. The room's consecutive-bot-turn count is the
bot-loop module's (`bot_turns`, the stage just outside this one), which has already
counted the message, so a human message refused here still resets it.
"""

from __future__ import annotations

from gateway import messages
from gateway.context import TurnContext
from gateway.pipeline import Handler
from gateway.refusals import DecisionLog
from gateway.types import Reply


class AdmissionMiddleware:
    """Drops messages in paused rooms and from senders the policy does not answer."""

    name = "admission"

    def __init__(self, decisions: DecisionLog) -> None:
        self._decisions = decisions

    async def __call__(self, ctx: TurnContext, call_next: Handler) -> Reply | None:
        msg = ctx.message
        paused = await ctx.state.pause_remaining(msg.room)
        if paused is not None:
            self._decisions.refuse(ctx, self.name, "paused", messages.paused_detail(paused))
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
            code, detail = f"{kind}_off", messages.answers_none_detail(kind)
        else:
            code, detail = "not_addressed", messages.must_mention_detail(kind)
        self._decisions.refuse(ctx, self.name, code, detail, remember=True)
        return None
