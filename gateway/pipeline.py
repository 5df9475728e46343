"""The middleware onion, built once at start-up.

A middleware is `async (ctx, call_next) -> Reply | None`; it short-circuits by returning
without calling `call_next`, and code after `await call_next(ctx)` runs after the inner
layers (a real onion, unlike slack-bolt's flag-setting `next()`). Every middleware names
itself (`name`, a class attribute): its decisions, refusals and errors are counted and
logged under that name, never under its module path.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Protocol

from gateway.context import TurnContext
from gateway.types import Reply

Handler = Callable[[TurnContext], Awaitable[Reply | None]]


class Middleware(Protocol):
    """One pipeline stage, named for metrics and logs (`refusals_total{stage=name}`)."""

    name: str

    async def __call__(self, ctx: TurnContext, call_next: Handler) -> Reply | None: ...


async def _end(ctx: TurnContext) -> Reply | None:
    """The innermost handler: nothing more to do."""
    return None


def build_pipeline(middlewares: Sequence[Middleware], innermost: Handler = _end) -> Handler:
    """Compose middlewares outermost-first into one handler; done once, not per message."""
    handler = innermost
    for middleware in reversed(middlewares):
        handler = partial(middleware, call_next=handler)
    return handler
