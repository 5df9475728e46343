"""The state the `circuits`, `calls` and `spend` commands open beside a running server.

They open the CallStore of the configured state backend directly, so they work while a
proxy or gateway runs and share its circuits, request log and spend: sqlite (the same
file) or redis (the same server and key prefix). With memory state all of it lives
inside the running process, so these commands say so (exit 2) and point at the admin
API; an unreachable backend exits 1.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable, Coroutine
from typing import TypeVar

from gateway.app.errors import LoopwardenError, StateError
from gateway.calls.factory import build_call_store
from gateway.calls.store import CallStore
from gateway.config import Config
from guards.call_loop import CallLoopPolicy

NEEDS_SHARED_STATE = (
    "error: with state.backend: memory the circuits and the request log live inside the "
    "running proxy or gateway. Use its admin API (GET /admin/circuits, POST "
    "/admin/circuits/reopen) or /loop circuits in chat, or set state.backend to sqlite "
    "or redis to use this command."
)
T = TypeVar("T")


class NoSharedState(LoopwardenError):
    """The command needs a state backend other processes can open (sqlite or redis)."""


def run_command(command: Coroutine[object, object, int]) -> int:
    """Run one command to its exit code; no shared state is 2, unreachable state 1."""
    try:
        return asyncio.run(command)
    except NoSharedState:
        print(NEEDS_SHARED_STATE, file=sys.stderr)
        return 2
    except StateError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


async def using(config: Config, work: Callable[[CallStore], Awaitable[T]]) -> T:
    """Run `work` on the config's shared CallStore, opened for it and closed after."""
    if config.state.backend == "memory":
        raise NoSharedState
    proxy = config.proxy
    policy = proxy.call_loop.policy() if proxy is not None else CallLoopPolicy()
    store = build_call_store(config.state, policy, proxy.rules if proxy is not None else ())
    await store.start()
    try:
        return await work(store)
    finally:
        await store.aclose()
