"""Agent dispatch: the innermost stage, where the hosted bot's agent produces the reply.

The typing indicator is started alongside the agent (its errors are ignored: a typing
indicator is never worth failing a turn) when `pipeline.typing_indicator` is on and the
platform has one. The agent's turn is bounded by `pipeline.turn_timeout_seconds`; a turn
that runs out answers with a short notice and is counted under `errors_total`. Tool
calls and LLM calls are guarded inside the agents (LoopGuard, CallLoopGuard); the
verdicts they report are counted here under `guard_decisions_total` (one `tool_loop`
verdict per tool call, and the halt that ended a turn early under its guard), and a
halt is logged with its code. Verdicts of a guard in shadow mode are counted with
`shadow="true"`; those that would have refused (a tool call's BLOCK or HALT, a model
call the call guard or a budget refused) are recorded as shadow refusals
(`DecisionLog.shadow`). A turn a budget ended (`policy.spend`, `gateway.agents.spend`) is a
refusal of the `spend` stage: counted under `refusals_total`, logged with the budget's
figures and kept for `status`.

The timeout is kept by one watchdog for all turns in flight instead of a timer per turn
(`asyncio.timeout` costs about 4 µs a turn, a seventh of the whole pipeline's budget):
the watchdog wakes every `timeout / 4` seconds (at most every second) and cancels the
turns past their deadline, so a turn ends within a quarter of the timeout (at most a
second) after it. It runs only while turns are in flight.

With tracing on, the turn is an `invoke_agent` span (the agent's name, the room as the
conversation; the message and the reply as `gen_ai.*.messages` only with
`telemetry.capture_content`), the parent of the agent's `chat` and `execute_tool` spans
and of the guard decisions accounted here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

from gateway.agents.spend import SPEND
from gateway.app import messages
from gateway.app.context import TurnContext
from gateway.app.errors import LoopwardenError
from gateway.app.pipeline import Handler
from gateway.app.refusals import DecisionLog
from gateway.app.types import AgentResult, InboundMessage, Reply
from gateway.config import PipelineConfig
from gateway.observability import tracing
from guards.loop_guard import GuardAction

log = logging.getLogger("loopwarden.pipeline")

_REFUSING = frozenset({GuardAction.BLOCK.value, GuardAction.HALT.value})
"""The tool-call verdicts that refuse the call (in shadow mode: would have)."""
_LOOP_GUARDS = frozenset({"tool_loop", "call_loop"})
"""The guards whose halt of an agent's turn is a loop cut (`loops_cut_total`)."""
_SPANS_KEPT = 4096
"""The rooms whose `invoke_agent` span name and attributes a stage keeps at most."""


class TurnTimeoutError(LoopwardenError):
    """The agent did not answer within the turn timeout."""


class Deadlines:
    """Cancels the tasks of turns that outlive `timeout`: one watchdog for every turn."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._period = min(1.0, timeout / 4)
        self._due: dict[asyncio.Task[object], float] = {}
        self._expired: set[asyncio.Task[object]] = set()
        self._watchdog: asyncio.Task[None] | None = None

    async def run(self, ctx: TurnContext) -> AgentResult:
        """The agent's answer, or TurnTimeoutError once the deadline has passed."""
        task = asyncio.current_task()
        if task is None:  # not inside a task: nothing to cancel, so no deadline to keep
            return await ctx.agent.respond(ctx)
        loop = task.get_loop()
        cancelling = task.cancelling()
        self._due[task] = loop.time() + self.timeout
        watchdog = self._watchdog
        if watchdog is None or watchdog.done() or watchdog.get_loop() is not loop:
            self._watchdog = loop.create_task(self._watch())
        try:
            return await ctx.agent.respond(ctx)
        except asyncio.CancelledError:
            # Ours only when no one else cancelled the task too (as asyncio.timeout does).
            if task in self._expired:
                self._expired.discard(task)
                if task.uncancel() <= cancelling:
                    raise TurnTimeoutError from None
            raise
        finally:
            del self._due[task]
            if task in self._expired:  # the agent swallowed our cancellation
                self._expired.discard(task)
                task.uncancel()

    async def _watch(self) -> None:
        """Cancel overdue turns until none is in flight."""
        loop = asyncio.get_running_loop()
        while self._due:
            await asyncio.sleep(self._period)
            now = loop.time()
            for task, due in list(self._due.items()):
                if due <= now and task not in self._expired:
                    self._expired.add(task)
                    task.cancel()


class AgentDispatchMiddleware:
    """Calls `ctx.agent.respond(ctx)` within the turn timeout; sets `ctx.result`."""

    name = "agent_dispatch"

    def __init__(self, pipeline: PipelineConfig, decisions: DecisionLog) -> None:
        self._deadlines = Deadlines(pipeline.turn_timeout_seconds)
        self._typing = pipeline.typing_indicator
        self._decisions = decisions
        self._metrics = decisions.metrics
        self._typing_tasks: set[asyncio.Task[None]] = set()
        self._spans: dict[tuple[str, str, str], tuple[str, tracing.Attributes]] = {}
        """A traced turn's span name and attributes by agent, platform and channel."""

    def __call__(self, ctx: TurnContext, call_next: Handler) -> Coroutine[Any, Any, Reply | None]:
        """The turn itself with tracing off (no coroutine of its own); traced otherwise."""
        tracer = tracing.tracer()
        if not tracer.enabled:
            return self._turn(ctx)
        return self._traced(ctx, tracer)

    async def _turn(self, ctx: TurnContext) -> Reply | None:
        if self._typing and ctx.connector.capabilities.typing:
            self._start_typing(ctx)
        try:
            result = await self._deadlines.run(ctx)
        except TurnTimeoutError:
            return self._timed_out(ctx)
        return self._answered(ctx, result)

    async def _traced(self, ctx: TurnContext, tracer: tracing.Tracer) -> Reply | None:
        """The turn inside its `invoke_agent` span.

        `_turn`'s steps written out again, so that a traced turn is one coroutine too (a
        second one, awaited, costs a traced message more than its span does).
        """
        msg = ctx.message
        agent = ctx.bot.agent
        made = self._spans.get((agent, msg.platform, msg.channel_id))
        if made is None:
            made = self._span_of(agent, msg)
        name, attributes = made
        if tracer.capture_content:
            text = tracing.text_messages("user", msg.text)
            attributes = {**attributes, tracing.INPUT_MESSAGES: text}
        span = tracer.span(name, attributes)  # ended in the `finally`: no `with` to enter
        try:
            if self._typing and ctx.connector.capabilities.typing:
                self._start_typing(ctx)
            try:
                result = await self._deadlines.run(ctx)
            except TurnTimeoutError:
                return self._timed_out(ctx)
            reply = self._answered(ctx, result)
        except BaseException as exc:
            span.set_error(type(exc).__name__)
            raise
        else:
            if tracer.capture_content and reply is not None:
                span.set_attribute(
                    tracing.OUTPUT_MESSAGES, tracing.text_messages("assistant", reply.text)
                )
            return reply
        finally:
            span.end()

    def _span_of(self, agent: str, msg: InboundMessage) -> tuple[str, tracing.Attributes]:
        """A turn's span name and attributes in a room, kept for its next turns there.

        They are the same for every turn of an agent in a room (the message text, when
        captured, is added to a copy); the table starts over past `_SPANS_KEPT` rooms.
        """
        attributes: dict[str, tracing.AttributeValue] = {
            tracing.OPERATION_NAME: tracing.INVOKE_AGENT,
            tracing.AGENT_NAME: agent,
            tracing.CONVERSATION_ID: msg.room,
        }
        made = (f"{tracing.INVOKE_AGENT} {agent}", attributes)
        if len(self._spans) >= _SPANS_KEPT:
            self._spans.clear()
        self._spans[agent, msg.platform, msg.channel_id] = made
        return made

    def _answered(self, ctx: TurnContext, result: AgentResult) -> Reply | None:
        """The reply to the agent's answer, its guard verdicts accounted first."""
        ctx.result = result
        if result.tool_calls or result.halt is not None or result.shadowed:
            self._account(ctx, result)
        if result.text is None:
            return None
        msg = ctx.message
        return Reply(result.text, thread_id=msg.thread_id, reply_to=msg.message_id)

    def _account(self, ctx: TurnContext, result: AgentResult) -> None:
        """Count the guard verdicts the agent reports; log the halt that ended its turn."""
        count = self._metrics.guard_decision
        for call in result.tool_calls:
            if call.shadow and call.action in _REFUSING:
                detail = messages.shadow_tool_detail(call.action, call.name)
                self._decisions.shadow(ctx, "tool_loop", call.code, detail)
            else:
                count("tool_loop", call.code, shadow=call.shadow)
        for waived in result.shadowed:
            detail = waived.detail or messages.SHADOW_CALL_DETAIL
            self._decisions.shadow(ctx, waived.guard, waived.code, detail)
        halt = result.halt
        if halt is None:
            return
        if halt.guard == SPEND:
            self._decisions.refuse(
                ctx, SPEND, halt.code, halt.detail, retry_after=halt.retry_after, remember=True
            )
            return
        if halt.guard != "tool_loop":  # a tool-loop halt is a tool call's verdict, counted above
            count(halt.guard, halt.code)
        if halt.guard in _LOOP_GUARDS:
            self._metrics.loop_cut(halt.guard, ctx.message.room)
        self._decisions.halted(ctx, halt.guard, halt.code)

    def _timed_out(self, ctx: TurnContext) -> Reply:
        msg = ctx.message
        timeout = self._deadlines.timeout
        self._metrics.error(self.name)
        log.warning(
            "%s agent of bot %s timed out after %.0f s (message %s)",
            msg.room,
            msg.bot_id,
            timeout,
            msg.message_id,
        )
        ctx.decide(self.name, "timeout", f"no answer within {timeout:g} s")
        tracing.tracer().current().set_error("timeout")
        return Reply(messages.TIMEOUT_NOTICE, thread_id=msg.thread_id, reply_to=msg.message_id)

    def _start_typing(self, ctx: TurnContext) -> None:
        """Show the typing indicator without delaying the agent; failures are only logged."""
        msg = ctx.message
        task = asyncio.create_task(ctx.connector.typing(msg.channel_id, msg.thread_id))
        self._typing_tasks.add(task)
        task.add_done_callback(self._typing_done)

    def _typing_done(self, task: asyncio.Task[None]) -> None:
        self._typing_tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.debug("typing indicator failed: %s: %s", type(exc).__name__, exc)
