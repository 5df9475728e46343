"""Channel policy: the room's effective policy, with its guard policies, onto the turn.

`ctx.resolved` (and so `ctx.policy`) becomes the room's entry in the `PolicyCache`
(gateway/app/policies.py): defaults, the first matching channel rule, then the global and
the room's runtime overrides (its link's for a linked room: `ctx.scope`), resolved once
per room and overrides and shared with the `/loop` commands. The inner stages and the
agent read `ctx.resolved`, never the cache.
"""

from __future__ import annotations

from gateway.app.context import TurnContext
from gateway.app.pipeline import Handler
from gateway.app.policies import PolicyCache, merged
from gateway.app.types import Reply
from gateway.state.base import GLOBAL_SCOPE, ControlStore


class ChannelPolicyMiddleware:
    """Sets `ctx.resolved` (and `ctx.policy`) to the room's effective policy."""

    name = "channel_policy"

    def __init__(self, policies: PolicyCache, controls: ControlStore) -> None:
        self._policies = policies
        self._controls = controls

    async def __call__(self, ctx: TurnContext, call_next: Handler) -> Reply | None:
        # `PolicyCache.room`, inlined: one coroutine fewer per message on the hot path.
        msg = ctx.message
        controls = self._controls
        overrides = merged(
            await controls.get_overrides(GLOBAL_SCOPE), await controls.get_overrides(ctx.scope)
        )
        ctx.resolved = self._policies.resolve(
            msg.platform, msg.channel_id, msg.thread_id, overrides
        )
        return await call_next(ctx)
