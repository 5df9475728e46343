"""The outermost stage: count every message in, and make sure no turn can crash a connector.

An exception from any inner stage (or an agent) is logged and counted under the `name` of
the innermost stage it escaped from (`errors_total{stage}`), as the pipeline marked it
(`gateway.app.pipeline.failed_stage`), and the turn ends with no reply. The ERROR line names
the exception type and where it was raised but not its message, which may quote the
user's text; the full traceback goes to DEBUG (where the CLI's redaction filter still
masks secrets).

With tracing on (`telemetry.otlp_endpoint`), each turn is one trace: this stage opens its
root span, `message <platform>`, with the platform, room, bot and message id (the text
never: `gateway.observability.tracing`); the inner stages' spans are its children, and a
failure escaping it marks it with the exception's type.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import ItemsView, Iterator, Mapping

from gateway.app.context import TurnContext
from gateway.app.pipeline import Handler, failed_stage
from gateway.app.types import InboundMessage, Reply
from gateway.observability import tracing
from gateway.observability.metrics import Metrics

log = logging.getLogger("loopwarden.pipeline")

_SPAN_NAMES: dict[str, str] = {}
"""`message <platform>` per platform seen (the connectors' names: a handful)."""
_SPAN_NAMES_KEPT = 64


class ErrorsMiddleware:
    """Catches everything from the inner layers; never re-raises."""

    name = "errors"

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    async def __call__(self, ctx: TurnContext, call_next: Handler) -> Reply | None:
        self._metrics.message_in(ctx.message.platform)
        tracer = tracing.tracer()
        try:
            if not tracer.enabled:
                return await call_next(ctx)  # no coroutine of ours between: the hot path
            # No coroutine of ours when traced either: the span is open in this one.
            msg = ctx.message
            attributes = _MessageAttributes()
            attributes.message = msg
            name = _SPAN_NAMES.get(msg.platform) or _span_name(msg.platform)
            # Ended in the `finally`, not a `with` block: entering one is a call more.
            span = tracer.span(name, attributes, root=True)
            try:
                return await call_next(ctx)
            except BaseException as exc:
                span.set_error(type(exc).__name__)
                raise
            finally:
                span.end()
        except Exception as exc:  # the whole point of this stage: nothing escapes it
            self._report(ctx, exc)
            return None

    def _report(self, ctx: TurnContext, exc: Exception) -> None:
        stage, where = failed_stage(exc), _raised_at(exc)
        self._metrics.error(stage)
        msg = ctx.message
        log.error(
            "%s turn of bot %s failed in %s: %s raised at %s (message %s)",
            msg.room,
            msg.bot_id,
            stage,
            type(exc).__name__,
            where,
            msg.message_id,
            extra={"decision": "error", "stage": stage, "room": msg.room, "bot": msg.bot_id},
        )
        log.debug("traceback of the failed turn", exc_info=exc)


def _raised_at(exc: BaseException) -> str:
    """Where `exc` was raised: module, function and line of its innermost frame."""
    frames = list(traceback.walk_tb(exc.__traceback__))
    if not frames:
        return "unknown"
    frame, line = frames[-1]
    return f"{frame.f_globals.get('__name__', '?')}:{frame.f_code.co_name}:{line}"


_MESSAGE_KEYS = (
    tracing.PLATFORM,
    tracing.ROOM,
    tracing.BOT,
    tracing.MESSAGE_ID,
    tracing.SENDER_IS_BOT,
)


class _MessageAttributes(Mapping[str, tracing.AttributeValue]):
    """The root span's attributes (platform, room, bot, message id, whether a bot sent
    it), read off the message when asked for: by the export thread, not the event loop.

    A traced message costs the loop this one-slot object (`message` is set after it is
    made: a constructor is a Python call) instead of a dict of five held until the
    export; the message is frozen, so what is read later is what it was at the turn.
    """

    __slots__ = ("message",)
    message: InboundMessage

    def _made(self) -> dict[str, tracing.AttributeValue]:
        msg = self.message
        return {
            tracing.PLATFORM: msg.platform,
            tracing.ROOM: msg.room,
            tracing.BOT: msg.bot_id,
            tracing.MESSAGE_ID: msg.message_id,
            tracing.SENDER_IS_BOT: msg.sender_is_bot,
        }

    def __getitem__(self, key: str) -> tracing.AttributeValue:
        return self._made()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(_MESSAGE_KEYS)

    def __len__(self) -> int:
        return len(_MESSAGE_KEYS)

    def items(self) -> ItemsView[str, tracing.AttributeValue]:
        """All of them from one read of the message (the OTLP encoder's way in)."""
        return self._made().items()


def _span_name(platform: str) -> str:
    """The turn's root span's name, `message <platform>`, kept per platform."""
    name = f"{tracing.MESSAGE} {platform}"
    if len(_SPAN_NAMES) < _SPAN_NAMES_KEPT:
        _SPAN_NAMES[platform] = name
    return name
