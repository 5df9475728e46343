"""Run one tool call through the whole LoopGuard protocol: check, run, record, check.

`guarded_call` (async; the tool may be sync or async) and `guarded_call_sync` behave alike:
- pre-check HALT raises `ToolExecutionError` (not retryable) and the tool does not run;
- pre-check BLOCK returns the block result without running the tool (the pre-check
  counted the blocked call, so retrying it escalates);
- otherwise (ALLOW or WARN) the tool runs and is recorded, and the post-check decides
  what the caller gets: WARN annotates the result, BLOCK replaces it, HALT raises
  `ToolExecutionError`. A pre-check WARN is not attached: if the result changed, the
  call made progress and the post-check says so.

A tool that raises (a timeout included: `TimeoutError` raised inside the tool) is
recorded as a failure with "ExceptionType: message" as its result, so identical failures
build a streak. Its exception is then re-raised as-is, so the caller's usual error
handling still applies, unless the post-check is HALT, which raises
`ToolExecutionError` chained to it. A WARN or BLOCK verdict on a failed call is added to
the exception as a note (`exc.__notes__`). Cancellation is not a tool failure: it
propagates unrecorded.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping

from guards.loop_guard import GuardAction, LoopGuard, ToolExecutionError, apply_decision


def _failure_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _start(guard: LoopGuard, tool_name: str, args: Mapping[str, object]) -> object | None:
    """Pre-check; the block result when the call must not run (HALT raises)."""
    decision = guard.check(tool_name, args)
    if decision.action is GuardAction.HALT:
        raise ToolExecutionError.from_decision(decision)
    if decision.action is GuardAction.BLOCK:
        return apply_decision(decision, None)
    return None


def _failed(guard: LoopGuard, tool_name: str, args: Mapping[str, object], exc: Exception) -> None:
    """Record a raised tool call; raise on HALT, else note the verdict on the exception."""
    decision = guard.record(tool_name, args, success=False, result=_failure_text(exc))
    if decision.action is GuardAction.HALT:
        raise ToolExecutionError.from_decision(decision) from exc
    if decision.action is not GuardAction.ALLOW:
        exc.add_note(f"[loop-guard] {decision.message}")


def _finish(guard: LoopGuard, tool_name: str, args: Mapping[str, object], result: object) -> object:
    return apply_decision(guard.record(tool_name, args, success=True, result=result), result)


async def guarded_call(
    guard: LoopGuard,
    tool_name: str,
    fn: Callable[..., object],
    args: Mapping[str, object],
) -> object:
    """Run `fn(**args)` (sync or async) under the guard; see the module docstring."""
    blocked = _start(guard, tool_name, args)
    if blocked is not None:
        return blocked
    try:
        result = fn(**args)
        if inspect.isawaitable(result):
            result = await result
    except Exception as exc:
        _failed(guard, tool_name, args, exc)
        raise
    return _finish(guard, tool_name, args, result)


def guarded_call_sync(
    guard: LoopGuard,
    tool_name: str,
    fn: Callable[..., object],
    args: Mapping[str, object],
) -> object:
    """Run a synchronous `fn(**args)` under the guard; see the module docstring."""
    blocked = _start(guard, tool_name, args)
    if blocked is not None:
        return blocked
    try:
        result = fn(**args)
    except Exception as exc:
        _failed(guard, tool_name, args, exc)
        raise
    if inspect.iscoroutine(result):
        result.close()  # never awaited: close it so it does not warn later
        raise TypeError(f"{tool_name} is async: call it with guarded_call, not guarded_call_sync")
    return _finish(guard, tool_name, args, result)
