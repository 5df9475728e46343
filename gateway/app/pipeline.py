"""The middleware onion, built once at start-up.

A middleware is `async (ctx, call_next) -> Reply | None`; it short-circuits by returning
without calling `call_next`, and code after `await call_next(ctx)` runs after the inner
layers (a real onion, unlike slack-bolt's flag-setting `next()`). Every middleware names
itself (`name`, a class attribute): its decisions, refusals and errors are counted and
logged under that name, never under its module path.

Each stage sits in a `_Layer` that marks an exception escaping it with the stage's name
(the innermost stage marks it first; outer ones leave the mark), so the errors stage
reads which stage failed from the stage itself (`failed_stage`), not from a traceback.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from gateway.app.context import TurnContext
from gateway.app.types import Reply

Handler = Callable[[TurnContext], Awaitable[Reply | None]]

OUTSIDE_STAGES = "pipeline"
_STAGE_MARK = "loopwarden_stage"


class Middleware(Protocol):
    """One pipeline stage, named for metrics and logs (`refusals_total{stage=name}`)."""

    name: str

    async def __call__(self, ctx: TurnContext, call_next: Handler) -> Reply | None: ...


async def _end(ctx: TurnContext) -> Reply | None:
    """The innermost handler: nothing more to do."""
    return None


class _Layer:
    """One stage bound to the rest of the onion; names the stage an exception escaped."""

    __slots__ = ("_next", "_stage")

    def __init__(self, stage: Middleware, call_next: Handler) -> None:
        self._stage = stage
        self._next = call_next

    async def __call__(self, ctx: TurnContext) -> Reply | None:
        try:
            return await self._stage(ctx, self._next)
        except Exception as exc:
            if not hasattr(exc, _STAGE_MARK):
                setattr(exc, _STAGE_MARK, self._stage.name)
            raise


def failed_stage(exc: BaseException) -> str:
    """The name of the innermost stage `exc` escaped from (`pipeline` when none)."""
    stage = getattr(exc, _STAGE_MARK, OUTSIDE_STAGES)
    return stage if isinstance(stage, str) else OUTSIDE_STAGES


def build_pipeline(middlewares: Sequence[Middleware], innermost: Handler = _end) -> Handler:
    """Compose middlewares outermost-first into one handler; done once, not per message."""
    handler = innermost
    for middleware in reversed(middlewares):
        handler = _Layer(middleware, handler)
    return handler
