"""slack-bolt: `app.use(loopwarden_middleware(guard))` for `App` and `AsyncApp`.

    guard = RoomGuard(state="redis://127.0.0.1:6379/0", bot_id="U0MYBOT")
    app = AsyncApp(token=BOT_TOKEN)          # or App(token=BOT_TOKEN)
    app.use(loopwarden_middleware(guard))

A global middleware, run after bolt's own (authorization, self events): a message event
is read with the gateway's own translator (`connectors.slack.inbound.translate_payload`),
so bot senders, mentions, thread replies and DMs mean what they mean to a hosted bot. A
refused message is acknowledged to Slack (200, so it is not retried) and reaches no
listener; a refusal that opens a cooldown first posts the guard's notice in the channel
(its thread, if any). A message that mentions the app arrives twice (`message` and
`app_mention`, same channel and ts): the second copy is a `duplicate`, so the message is
handled once, as in the gateway. Payloads that are not messages pass through.

Replies: for a guarded message, the request's client (`client`, and `say`, which posts
through it) has `chat_postMessage` and `chat_update` filtered by `guard.outgoing`: a
reply that is only silence is not posted and the call returns None. `App` uses the
guard's sync face (`admit_sync`), `AsyncApp` the async one.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from loopwarden_integrations.extras import missing_extra

try:
    from slack_bolt.async_app import AsyncBoltRequest
    from slack_bolt.middleware import Middleware
    from slack_bolt.middleware.async_middleware import AsyncMiddleware
    from slack_bolt.request import BoltRequest
    from slack_bolt.response import BoltResponse
except ModuleNotFoundError as exc:
    raise missing_extra(__name__, "slack-bolt", "slack") from exc

from connectors.skips import Skip
from connectors.slack.inbound import BotIdentity, translate_payload
from gateway.app.types import InboundMessage
from loopwarden_integrations.room_guard import (
    Decision,
    RoomGuard,
    admit_inbound,
    admit_inbound_sync,
    wrong_bot_id,
)

__all__ = ["LoopwardenMiddleware", "loopwarden_middleware"]

log = logging.getLogger("loopwarden.integrations.slack")

# The client methods whose `text` is a reply the silence filter decides.
_TEXT_METHODS = ("chat_postMessage", "chat_update")


def loopwarden_middleware(guard: RoomGuard) -> LoopwardenMiddleware:
    """The guard as a bolt global middleware, for `App.use` and `AsyncApp.use` alike."""
    return LoopwardenMiddleware(guard)


class LoopwardenMiddleware(Middleware, AsyncMiddleware):
    """Admits message events through the guard; both bolt middleware faces in one object."""

    def __init__(self, guard: RoomGuard) -> None:
        self.guard = guard

    def process(
        self,
        *,
        req: BoltRequest,
        resp: BoltResponse,
        next: Callable[[], BoltResponse],
    ) -> BoltResponse | None:
        """`App`'s face: the sync guard."""
        inbound = self._inbound(req.body, req.context.bot_user_id, req.context.bot_id)
        if inbound is None:
            return next()
        if _misconfigured(self.guard, inbound):
            return BoltResponse(status=200, body="")
        client = req.context.client
        decision = admit_inbound_sync(self.guard, inbound)
        if decision.notice is not None:
            client.chat_postMessage(**_notice(inbound, decision))
        if not decision.allowed:
            return BoltResponse(status=200, body="")
        _filter_texts(client, self.guard, inbound.room)
        return next()

    async def async_process(
        self,
        *,
        req: AsyncBoltRequest,
        resp: BoltResponse,
        next: Callable[[], Awaitable[BoltResponse]],
    ) -> BoltResponse | None:
        """`AsyncApp`'s face: the async guard."""
        inbound = self._inbound(req.body, req.context.bot_user_id, req.context.bot_id)
        if inbound is None:
            return await next()
        if _misconfigured(self.guard, inbound):
            return BoltResponse(status=200, body="")
        client = req.context.client
        decision = await admit_inbound(self.guard, inbound)
        if decision.notice is not None:
            await client.chat_postMessage(**_notice(inbound, decision))
        if not decision.allowed:
            return BoltResponse(status=200, body="")
        _filter_texts(client, self.guard, inbound.room, awaited=True)
        return await next()

    def _inbound(
        self, body: Mapping[str, Any], user_id: str | None, app_bot_id: str | None
    ) -> InboundMessage | None:
        """The payload as a message for this app, None when it is not one to guard."""
        if not user_id or body.get("type") != "event_callback":
            return None
        identity = BotIdentity(self.guard.bot_id, user_id, app_bot_id or "")
        inbound = translate_payload(body, bot=identity)
        return None if isinstance(inbound, Skip) else inbound


def _misconfigured(guard: RoomGuard, msg: InboundMessage) -> bool:
    """True (and logged) when the guard holds another id than this app's bot user."""
    error = wrong_bot_id(guard, msg.bot_user_id, "Slack")
    if error is not None:
        log.error("%s", error)
    return error is not None


def _notice(msg: InboundMessage, decision: Decision) -> dict[str, Any]:
    """chat.postMessage arguments of the cooldown notice, in the message's thread if any."""
    args: dict[str, Any] = {"channel": msg.channel_id, "text": decision.notice}
    if msg.thread_id is not None:
        args["thread_ts"] = msg.thread_id
    return args


def _filter_texts(client: Any, guard: RoomGuard, room: str, *, awaited: bool = False) -> None:
    """Make this request's client post only what `guard.outgoing` keeps (None: nothing)."""
    for name in _TEXT_METHODS:
        method = getattr(client, name)
        wrapper = _async_filtered if awaited else _filtered
        setattr(client, name, functools.partial(wrapper, method, guard, room))


def _filtered(method: Callable[..., Any], guard: RoomGuard, room: str, **kwargs: Any) -> Any:
    kept = _kept(guard, room, kwargs)
    return None if kept is None else method(**kept)


async def _async_filtered(
    method: Callable[..., Awaitable[Any]], guard: RoomGuard, room: str, **kwargs: Any
) -> Any:
    kept = _kept(guard, room, kwargs)
    return None if kept is None else await method(**kept)


def _kept(guard: RoomGuard, room: str, kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """The call's arguments with its text filtered; None when nothing is left to post."""
    text = kwargs.get("text")
    if not isinstance(text, str):
        return kwargs
    kept = guard.outgoing(room, text)
    if kept is None and not kwargs.get("blocks"):
        return None
    return {**kwargs, "text": kept}
