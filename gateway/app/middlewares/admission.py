"""Admission: is this room paused, and does this bot answer this kind of sender here?

`respond_to.humans` and `respond_to.bots` are each `all`, `mentions` or `none`. A human
counts as addressing the bot by mention, reply to the bot, or direct message. A bot
counts only by an explicit mention or a direct message: replying to a message adds an
automatic mention on some platforms (Discord's reply ping, Telegram's reply), and a bot
that merely replies is how loops start, so `reply_to_bot` from a bot is not a mention.
A sender whose bot-ness the platform cannot tell arrives with `sender_is_bot=True`
(connectors fail closed, and the self filter does for platforms that never tell), so the
bot rules apply to it.

A room linked with others (`links:`) is paused when its link is (`ctx.scope`).

Admission only decides; it keeps no count. The room's consecutive-bot-turn count is the
bot-loop module's (`bot_turns`, the stage just outside this one), which has already
counted the message, so a human message refused here still resets it.
"""

from __future__ import annotations

from gateway.app import messages
from gateway.app.context import TurnContext
from gateway.app.pipeline import Handler
from gateway.app.refusals import DecisionLog
from gateway.app.types import Reply
from gateway.config import RespondToPolicy
from gateway.state.base import ControlStore


class AdmissionMiddleware:
    """Drops messages in paused rooms and from senders the policy does not answer."""

    name = "admission"

    def __init__(self, controls: ControlStore, decisions: DecisionLog) -> None:
        self._controls = controls
        self._decisions = decisions

    async def __call__(self, ctx: TurnContext, call_next: Handler) -> Reply | None:
        msg = ctx.message
        paused = await self._controls.pause_remaining(ctx.scope)
        if paused is not None:
            self._decisions.refuse(ctx, self.name, "paused", messages.paused_detail(paused))
            return None
        refusal = turned_away(
            ctx.policy.respond_to,
            sender_is_bot=msg.sender_is_bot,
            mentions_bot=msg.mentions_bot,
            reply_to_bot=msg.reply_to_bot,
            is_direct=msg.is_direct,
        )
        if refusal is None:
            return await call_next(ctx)
        code, detail = refusal
        # Not kept for `status`: every hosted bot turns away every message not meant for
        # it, and those routine refusals would push the guards' out of the short list.
        self._decisions.refuse(ctx, self.name, code, detail)
        return None


def turned_away(
    respond: RespondToPolicy,
    *,
    sender_is_bot: bool,
    mentions_bot: bool,
    reply_to_bot: bool,
    is_direct: bool,
) -> tuple[str, str] | None:
    """(code, detail) when `respond_to` does not answer this sender, None when it does.

    Shared with `loopwarden_integrations.RoomGuard`, so a guarded bot answers whom a hosted
    one would.
    """
    if sender_is_bot:
        mode = respond.bots
        addressed = mentions_bot or is_direct
        kind = "bots"
    else:
        mode = respond.humans
        addressed = mentions_bot or reply_to_bot or is_direct
        kind = "humans"
    if mode == "all" or (mode == "mentions" and addressed):
        return None
    if mode == "none":
        return f"{kind}_off", messages.answers_none_detail(kind)
    return "not_addressed", messages.must_mention_detail(kind)
