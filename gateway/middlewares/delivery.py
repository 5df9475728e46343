"""Delivery stage: whatever reply the inner stages return is sent to the platform here.

It sits outside every stage that can speak (admin acknowledgements and refusals, the
cooldown notice, the silence notice, the agent's reply), so each reply takes this one
path: chunking, retries and the replies-out count apply to all of them alike.
"""

from __future__ import annotations

from gateway.context import TurnContext
from gateway.delivery import Delivery
from gateway.pipeline import Handler
from gateway.types import Reply


class DeliveryMiddleware:
    """Sends the reply of the inner layers through `Delivery`, then passes it outwards."""

    name = "delivery"

    def __init__(self, delivery: Delivery) -> None:
        self._delivery = delivery

    async def __call__(self, ctx: TurnContext, call_next: Handler) -> Reply | None:
        reply = await call_next(ctx)
        if reply is not None:
            await self._delivery.deliver(ctx.connector, ctx.message.channel_id, reply)
        return reply
