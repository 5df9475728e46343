"""The outermost stage: count every message in, and make sure no turn can crash a connector.

An exception from any inner stage (or an agent) is logged and counted under the `name` of
the innermost stage it escaped from (`errors_total{stage}`), and the turn ends with no
reply. The stages are handed over when the pipeline is built: which one a failure came
from is the innermost of their `__call__` frames it passed through, so moving or renaming
a module changes no metric. The ERROR line names the exception type and where it was
raised but not its message, which may quote the user's text; the full traceback goes to
DEBUG (where the CLI's redaction filter still masks secrets).
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Sequence
from types import CodeType, TracebackType

from gateway.context import TurnContext
from gateway.metrics import Metrics
from gateway.pipeline import Handler, Middleware
from gateway.types import Reply

log = logging.getLogger("loopwarden.pipeline")

_OUTSIDE_STAGES = "pipeline"


class ErrorsMiddleware:
    """Catches everything from the inner layers (`stages`); never re-raises."""

    name = "errors"

    def __init__(self, metrics: Metrics, stages: Sequence[Middleware] = ()) -> None:
        self._metrics = metrics
        self._stages: dict[CodeType, str] = {}
        for stage in stages:
            code = getattr(type(stage).__call__, "__code__", None)
            if isinstance(code, CodeType):
                self._stages[code] = stage.name

    async def __call__(self, ctx: TurnContext, call_next: Handler) -> Reply | None:
        self._metrics.message_in(ctx.message.platform)
        try:
            return await call_next(ctx)
        except Exception as exc:  # the whole point of this stage: nothing escapes it
            self._report(ctx, exc)
            return None

    def _report(self, ctx: TurnContext, exc: Exception) -> None:
        stage, where = self._origin(exc.__traceback__)
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

    def _origin(self, tb: TracebackType | None) -> tuple[str, str]:
        """The innermost stage the exception passed through, and where it was raised."""
        stage, where = _OUTSIDE_STAGES, "unknown"
        for frame, line in traceback.walk_tb(tb):
            code = frame.f_code
            stage = self._stages.get(code, stage)
            where = f"{frame.f_globals.get('__name__', '?')}:{code.co_name}:{line}"
        return stage, where
