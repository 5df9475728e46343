"""Self filter: a bot never handles a message its own platform user wrote.

It goes by author id, never by display name, so a message the bot sent from anywhere
(another replica, another integration using the same account) is dropped too. These
drops are routine (every platform echoes a bot's own posts), so they log at DEBUG.

It is also where the sender's bot-ness is settled for the inner stages: on a platform
that cannot tell bots from humans (`capabilities.knows_bots` false) every other sender is
treated as a bot (fail closed), whatever the connector reported. A message let through
has reached this hosted bot: the decision log records it for the Activity feed.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from gateway.app.context import TurnContext
from gateway.app.pipeline import Handler
from gateway.app.refusals import DecisionLog
from gateway.app.types import Reply


class SelfFilterMiddleware:
    """Drops messages authored by the hosted bot itself (code `self`)."""

    name = "self_filter"

    def __init__(self, decisions: DecisionLog) -> None:
        self._decisions = decisions

    async def __call__(self, ctx: TurnContext, call_next: Handler) -> Reply | None:
        msg = ctx.message
        connector = ctx.connector
        me = msg.bot_user_id or connector.bot_user_id
        if me and msg.sender_id == me:
            self._decisions.refuse(ctx, self.name, "self", "own message", level=logging.DEBUG)
            return None
        if not msg.sender_is_bot and not connector.capabilities.knows_bots:
            ctx.message = replace(msg, sender_is_bot=True)
        self._decisions.arrived(ctx)
        return await call_next(ctx)
