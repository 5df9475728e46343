"""Dedupe: a platform's redelivery or retry of a message is handled once, and none is lost.

The receipt (`dedupe:` + the delivery key: the platform event id, else the message id,
per hosted bot) is taken in flight atomically in the state store before the turn runs,
so concurrent duplicates and duplicates arriving at different replicas are answered
once. It is confirmed when the inner stages return: the reply was delivered (or given up
after the delivery's retries), or the turn decided not to answer. A turn that raised or
was cancelled leaves it in flight: this process refuses duplicates meanwhile, and after a
crash or restart the platform's redelivery of the message is let through and answered
(gateway/state/receipts.py).
"""

from __future__ import annotations

from gateway.app.context import TurnContext
from gateway.app.pipeline import Handler
from gateway.app.refusals import DecisionLog
from gateway.app.types import Reply
from gateway.state.base import ReceiptStore


class DedupeMiddleware:
    """Drops a delivery whose receipt is held (code `duplicate`); confirms the others."""

    name = "dedupe"

    def __init__(self, receipts: ReceiptStore, ttl: float, decisions: DecisionLog) -> None:
        self._receipts = receipts
        self._ttl = ttl
        self._decisions = decisions

    async def __call__(self, ctx: TurnContext, call_next: Handler) -> Reply | None:
        key = "dedupe:" + ctx.message.delivery_key
        if not await self._receipts.receive(key, self._ttl):
            self._decisions.refuse(ctx, self.name, "duplicate", "delivered before")
            return None
        reply = await call_next(ctx)
        await self._receipts.confirm(key, self._ttl)
        return reply
