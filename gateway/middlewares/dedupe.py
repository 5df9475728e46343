"""Dedupe: a platform's redelivery or retry of a message is handled once.

The receipt is claimed atomically in the state store (`dedupe:` + the delivery key: the
platform event id, else the message id, per hosted bot), so concurrent duplicates and
duplicates arriving at different replicas are answered once.
"""

from __future__ import annotations

from gateway.context import TurnContext
from gateway.pipeline import Handler
from gateway.refusals import DecisionLog
from gateway.types import Reply


class DedupeMiddleware:
    """Drops a delivery whose receipt was already claimed (code `duplicate`)."""

    def __init__(self, ttl: float, decisions: DecisionLog) -> None:
        self._ttl = ttl
        self._decisions = decisions

    async def __call__(self, ctx: TurnContext, call_next: Handler) -> Reply | None:
        if await ctx.state.claim("dedupe:" + ctx.message.delivery_key, self._ttl):
            return await call_next(ctx)
        self._decisions.refuse(ctx, "dedupe", "duplicate", "delivered before")
        return None
