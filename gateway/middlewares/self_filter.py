"""Self filter: a bot never handles a message its own platform user wrote.

It goes by author id, never by display name, so a message the bot sent from anywhere
(another replica, another integration using the same account) is dropped too. These
drops are routine (every platform echoes a bot's own posts), so they log at DEBUG.
"""

from __future__ import annotations

import logging

from gateway.context import TurnContext
from gateway.pipeline import Handler
from gateway.refusals import DecisionLog
from gateway.types import Reply


class SelfFilterMiddleware:
    """Drops messages authored by the hosted bot itself (code `self`)."""

    def __init__(self, decisions: DecisionLog) -> None:
        self._decisions = decisions

    async def __call__(self, ctx: TurnContext, call_next: Handler) -> Reply | None:
        msg = ctx.message
        me = msg.bot_user_id or ctx.connector.bot_user_id
        if me and msg.sender_id == me:
            self._decisions.refuse(ctx, "self_filter", "self", "own message", level=logging.DEBUG)
            return None
        return await call_next(ctx)
