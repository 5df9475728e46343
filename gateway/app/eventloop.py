"""The event loop the serving commands (`run`, `proxy`, `demo`) run on: uvloop, else asyncio's.

Everything loopwarden serves is many small requests on one thread, so the loop's own work
(polling, callbacks, socket writes) is a fair share of each. uvloop runs the same asyncio
API on libuv and does that work in C: the proxy adds 0.04-0.09 ms less to a call at p50
(`bench/proxy_bench.py` measures both loops in one run).

Decisions where DESIGN.md is silent:
- `auto` (the default) is uvloop when it is installed and asyncio's own loop otherwise.
  uvloop is a dependency on every platform it supports (not Windows); without it the
  gateway behaves the same, a little slower.
- `--loop asyncio` picks the standard loop anyway, to rule uvloop out when chasing a
  bug; `--loop uvloop` without uvloop installed is a usage error (exit 2), not a silent
  fall-back.
- The short commands (`check-config`, `circuits`, `calls`, `spend`, `replay`) keep the
  standard loop: they make a handful of calls and exit.
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Callable, Coroutine
from typing import Any, Literal, TypeVar, cast

from gateway.app.errors import LoopwardenError

T = TypeVar("T")
LoopChoice = Literal["auto", "asyncio", "uvloop"]
LOOP_CHOICES: tuple[LoopChoice, ...] = ("auto", "asyncio", "uvloop")


class LoopUnavailableError(LoopwardenError):
    """The event loop asked for is not installed."""


def loop_name(choice: LoopChoice = "auto") -> Literal["asyncio", "uvloop"]:
    """The loop `choice` means on this machine.

    Raises LoopUnavailableError for `uvloop` when it is not installed.
    """
    installed = importlib.util.find_spec("uvloop") is not None
    if choice == "uvloop" and not installed:
        raise LoopUnavailableError("--loop uvloop: uvloop is not installed (pip install uvloop)")
    if choice == "asyncio" or not installed:
        return "asyncio"
    return "uvloop"


def running() -> Literal["asyncio", "uvloop"]:
    """The loop this code runs on, as the start-up log lines name it."""
    module = type(asyncio.get_running_loop()).__module__
    return "uvloop" if module.partition(".")[0] == "uvloop" else "asyncio"


def run(main: Coroutine[Any, Any, T], *, choice: LoopChoice = "auto") -> T:
    """Run `main` to completion on the loop `choice` means (see `loop_name`)."""
    try:
        name = loop_name(choice)
    except LoopUnavailableError:
        main.close()  # never started: no "coroutine was never awaited" warning
        raise
    runner: Callable[[Coroutine[Any, Any, T]], T] = asyncio.run
    if name == "uvloop":
        import uvloop

        runner = cast(Callable[[Coroutine[Any, Any, T]], T], uvloop.run)
    return runner(main)
