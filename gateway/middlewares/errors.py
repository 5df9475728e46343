"""The outermost stage: count every message in, and make sure no turn can crash a connector.

An exception from any inner stage (or an agent) is logged and counted under the stage it
escaped from, and the turn ends with no reply. The ERROR line names the exception type
and where it was raised but not its message, which may quote the user's text; the full
traceback goes to DEBUG (where the CLI's redaction filter still masks secrets).
"""

from __future__ import annotations

import logging
import traceback
from types import TracebackType

from gateway.context import TurnContext
from gateway.metrics import Metrics
from gateway.pipeline import Handler
from gateway.types import Reply

log = logging.getLogger("loopwarden.pipeline")

_STAGE_MODULES = "gateway.middlewares."


class ErrorsMiddleware:
    """Catches everything from the inner layers; never re-raises."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    async def __call__(self, ctx: TurnContext, call_next: Handler) -> Reply | None:
        self._metrics.message_in(ctx.message.platform)
        try:
            return await call_next(ctx)
        except Exception as exc:  # the whole point of this stage: nothing escapes it
            _report(self._metrics, ctx, exc)
            return None


def _report(metrics: Metrics, ctx: TurnContext, exc: Exception) -> None:
    stage, where = _origin(exc.__traceback__)
    metrics.error(stage)
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


def _origin(tb: TracebackType | None) -> tuple[str, str]:
    """The innermost pipeline stage the exception passed through, and where it was raised."""
    stage, where = "pipeline", "unknown"
    for frame, line in traceback.walk_tb(tb):
        module = str(frame.f_globals.get("__name__", ""))
        if module.startswith(_STAGE_MODULES):
            stage = module.removeprefix(_STAGE_MODULES)
        where = f"{module}:{frame.f_code.co_name}:{line}"
    return stage, where
