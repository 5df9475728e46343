"""Delivery stage: whatever reply the inner stages return is sent to the platform here.

It sits outside every stage that can speak (admin acknowledgements and refusals, the
cooldown notice, the silence notice, the agent's reply), so each reply takes this one
path: chunking, retries and the replies-out count apply to all of them alike.

Where the platform edits messages (`Capabilities.edits`) the turn gets a `ReplyStream`
(`ctx.stream`) a streaming agent writes into as its reply comes (gateway.delivery.streaming); the
reply the inner stages return then finishes that stream, and is sent whole as ever when
nothing was streamed. A reply delivered in full is recorded in the Activity feed, when
there is one (gateway/observability/activity.py).
"""

from __future__ import annotations

from gateway.app.connector import MessageEditor
from gateway.app.context import TurnContext
from gateway.app.pipeline import Handler
from gateway.app.types import Reply
from gateway.delivery.sender import Delivery
from gateway.delivery.streaming import ReplyStream
from gateway.observability.activity import ActivityFeed


class DeliveryMiddleware:
    """Sends the reply of the inner layers through `Delivery`, then passes it outwards."""

    name = "delivery"

    def __init__(self, delivery: Delivery, activity: ActivityFeed | None = None) -> None:
        self._delivery = delivery
        self._activity = activity

    async def __call__(self, ctx: TurnContext, call_next: Handler) -> Reply | None:
        connector = ctx.connector
        if connector.capabilities.edits and isinstance(connector, MessageEditor):
            msg = ctx.message
            stream = ctx.stream = ReplyStream(
                self._delivery,
                connector,
                msg.channel_id,
                thread_id=msg.thread_id,
                reply_to=msg.message_id,
            )
            reply = await call_next(ctx)
            delivered = await stream.finish(reply)
        else:
            reply = await call_next(ctx)
            delivered = reply is not None and await self._delivery.deliver(
                connector, ctx.message.channel_id, reply
            )
        if delivered and reply is not None and self._activity is not None:
            self._activity.reply(ctx.message, reply.text)
        return reply
