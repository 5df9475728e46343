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

`on_decision`, when given, is called with each decision the guard makes for the call, in
order: the pre-check, then (if the tool ran) the post-check. A caller that reports which
verdict settled a call (see `settling_decision`) needs nothing more than a list's
`append`.

With `shadow=True` (the guard in shadow mode, DESIGN.md §5) the guard decides exactly
the same, every decision goes to `on_decision`, and nothing is acted on: the tool runs
whatever the pre-check said, its result (or its exception) reaches the caller untouched,
and no verdict raises. Each call is counted once, as in enforce: a call whose pre-check
said BLOCK was counted by that check and is not recorded again; any other call is
recorded once it ran.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence

from guards.loop_guard import (
    GuardAction,
    LoopGuard,
    LoopGuardDecision,
    ToolExecutionError,
    apply_decision,
)

DecisionHook = Callable[[LoopGuardDecision], None]
"""Called with each decision the guard makes for one call (pre-check, post-check)."""


def settling_decision(decisions: Sequence[LoopGuardDecision]) -> LoopGuardDecision | None:
    """The decision that settled a call: a pre-check BLOCK or HALT, else the last one."""
    if not decisions:
        return None
    first = decisions[0]
    return first if first.action in (GuardAction.BLOCK, GuardAction.HALT) else decisions[-1]


def _failure_text(exc: BaseException) -> str:
    """A failed call's recorded result: identical failures build a streak."""
    return f"{type(exc).__name__}: {exc}"


class _GuardedCall:
    """One call's steps of the protocol, each decision also passed to the hook."""

    __slots__ = ("_args", "_counted", "_guard", "_on_decision", "_shadow", "_tool_name")

    def __init__(
        self,
        guard: LoopGuard,
        tool_name: str,
        args: Mapping[str, object],
        on_decision: DecisionHook | None,
        shadow: bool,
    ) -> None:
        self._guard = guard
        self._tool_name = tool_name
        self._args = args
        self._on_decision = on_decision
        self._shadow = shadow
        self._counted = False  # shadow: the pre-check BLOCKed, so counted the call itself

    def _seen(self, decision: LoopGuardDecision) -> LoopGuardDecision:
        """Pass a decision to the hook, if any, and return it."""
        if self._on_decision is not None:
            self._on_decision(decision)
        return decision

    def start(self) -> object | None:
        """Pre-check; the block result when the call must not run (HALT raises)."""
        decision = self._seen(self._guard.check(self._tool_name, self._args))
        if self._shadow:
            self._counted = decision.action is GuardAction.BLOCK
            return None
        if decision.action is GuardAction.HALT:
            raise ToolExecutionError.from_decision(decision)
        if decision.action is GuardAction.BLOCK:
            return apply_decision(decision, None)
        return None

    def failed(self, exc: Exception) -> None:
        """Record a raised tool call; raise on HALT, else note the verdict on the exception."""
        if self._counted:
            return
        decision = self._seen(
            self._guard.record(
                self._tool_name, self._args, success=False, result=_failure_text(exc)
            )
        )
        if self._shadow:
            return
        if decision.action is GuardAction.HALT:
            raise ToolExecutionError.from_decision(decision) from exc
        if decision.action is not GuardAction.ALLOW:
            exc.add_note(f"[loop-guard] {decision.message}")

    def finish(self, result: object) -> object:
        """Record a call that returned; the result as the post-check lets the caller see it."""
        if self._counted:
            return result
        record = self._seen(
            self._guard.record(self._tool_name, self._args, success=True, result=result)
        )
        return result if self._shadow else apply_decision(record, result)


async def guarded_call(
    guard: LoopGuard,
    tool_name: str,
    fn: Callable[..., object],
    args: Mapping[str, object],
    *,
    on_decision: DecisionHook | None = None,
    shadow: bool = False,
) -> object:
    """Run `fn(**args)` (sync or async) under the guard; see the module docstring."""
    call = _GuardedCall(guard, tool_name, args, on_decision, shadow)
    if (blocked := call.start()) is not None:
        return blocked
    try:
        result = fn(**args)
        if inspect.isawaitable(result):
            result = await result
    except Exception as exc:
        call.failed(exc)
        raise
    return call.finish(result)


def guarded_call_sync(
    guard: LoopGuard,
    tool_name: str,
    fn: Callable[..., object],
    args: Mapping[str, object],
    *,
    on_decision: DecisionHook | None = None,
    shadow: bool = False,
) -> object:
    """Run a synchronous `fn(**args)` under the guard; see the module docstring."""
    call = _GuardedCall(guard, tool_name, args, on_decision, shadow)
    if (blocked := call.start()) is not None:
        return blocked
    try:
        result = fn(**args)
    except Exception as exc:
        call.failed(exc)
        raise
    if inspect.iscoroutine(result):
        result.close()  # never awaited: close it so it does not warn later
        raise TypeError(f"{tool_name} is async: call it with guarded_call, not guarded_call_sync")
    return call.finish(result)
