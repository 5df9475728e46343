"""Silence filter: NO_REPLY and silence narration never reach the platform.

The agent's reply passes through `apply_silence` with the room's SilencePolicy
(`ctx.resolved.silence`, derived once with the room's policy): a reply
that is only a silence token (or narration such as `(no reply)`) becomes nothing, and a
token alone on the first or last line is stripped. An agent that returns no text at all
chose silence too. When silence meets a human who addressed the bot (mention, reply to
it, direct message), `on_addressed_human_turn: notice` answers with a short notice so the
person is not left wondering; `silent` stays silent. A turn a guard ended without a
reply (a budget's notice already posted this period) gets no notice either.
`silence.enabled: false` passes every reply through as the agent wrote it, but for its
reasoning blocks: reasoning never reaches a room (DESIGN.md §3), whatever the silence
settings.

A reply the agent streams (`ctx.stream`, gateway.delivery.streaming) passes a `SilenceStreamFilter`
of the same policy on its way to the room, so nothing is posted while it may still be
silence; the whole reply still comes back through `apply_silence` here to finish it.
"""

from __future__ import annotations

from dataclasses import replace

from gateway.app import messages
from gateway.app.context import TurnContext
from gateway.app.pipeline import Handler
from gateway.app.refusals import DecisionLog
from gateway.app.types import Reply
from guards.reasoning import ReasoningFilter, strip_reasoning
from guards.silence import SilenceStreamFilter, apply_silence


class SilenceMiddleware:
    """Filters the agent's reply; may turn an addressed human's silence into a notice."""

    name = "silence"

    def __init__(self, decisions: DecisionLog) -> None:
        self._decisions = decisions
        self._metrics = decisions.metrics

    async def __call__(self, ctx: TurnContext, call_next: Handler) -> Reply | None:
        settings = ctx.policy.silence
        if ctx.stream is not None:
            if settings.enabled:
                policy = ctx.resolved.silence
                ctx.stream.hold_back(lambda: SilenceStreamFilter(policy))
            else:
                ctx.stream.hold_back(ReasoningFilter)
        reply = await call_next(ctx)
        if ctx.result is None:
            return reply
        if reply is None and ctx.result.halted:  # the guard that ended the turn chose silence
            return None
        if not settings.enabled:
            return _without_reasoning(reply)
        if reply is not None:
            kept = apply_silence(reply.text, ctx.resolved.silence)
            if kept == reply.text:
                self._metrics.guard_decision("silence", "sent")
                return reply
            if kept is not None:
                self._decisions.guard(ctx, "silence", "stripped", "silence token stripped")
                return replace(reply, text=kept)
        msg = ctx.message
        if settings.on_addressed_human_turn == "notice" and msg.addressed and not msg.sender_is_bot:
            self._decisions.guard(ctx, "silence", "notice", "silence for an addressed human")
            return Reply(messages.SILENCE_NOTICE, thread_id=msg.thread_id, reply_to=msg.message_id)
        self._decisions.guard(ctx, "silence", "silent", "the agent chose silence")
        return None


def _without_reasoning(reply: Reply | None) -> Reply | None:
    """The reply with its reasoning blocks removed; None when nothing else was in it."""
    if reply is None:
        return None
    text = strip_reasoning(reply.text)
    if text == reply.text:
        return reply
    return replace(reply, text=text) if text.strip() else None
