"""guarded_call / guarded_call_sync: the whole LoopGuard protocol around one tool call."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

import pytest

from guards.loop_guard import (
    GuardAction,
    LoopGuard,
    LoopGuardConfig,
    LoopGuardDecision,
    ToolExecutionError,
)
from guards.tool_wrapper import guarded_call, guarded_call_sync, settling_decision


class Tool:
    """A tool that counts its runs and returns a fixed result (or raises a fixed error)."""

    def __init__(self, result: object = "same", error: BaseException | None = None) -> None:
        self.runs = 0
        self.result = result
        self.error = error

    def __call__(self, **_args: object) -> object:
        self.runs += 1
        if self.error is not None:
            raise self.error
        return self.result

    async def acall(self, **args: object) -> object:
        return self(**args)


ARGS = {"path": "/etc/x", "content": "y"}


def test_sync_call_returns_the_result_and_records_it() -> None:
    guard = LoopGuard()
    tool = Tool({"ok": True})

    assert guarded_call_sync(guard, "write_file", tool, ARGS) == {"ok": True}
    assert tool.runs == 1
    assert guard.get_stats().tool_counts == {"write_file": 1}


async def test_async_call_returns_the_result_and_records_it() -> None:
    guard = LoopGuard()
    tool = Tool("contents")

    assert await guarded_call(guard, "read_file", tool.acall, {"path": "a"}) == "contents"
    assert guard.get_stats().tool_counts == {"read_file": 1}


async def test_async_wrapper_runs_sync_tools_too() -> None:
    guard = LoopGuard()
    assert await guarded_call(guard, "read_file", Tool("contents"), {"path": "a"}) == "contents"


def test_sync_stuck_tool_is_blocked_without_running_then_halted() -> None:
    guard = LoopGuard()
    tool = Tool("same")
    results = [guarded_call_sync(guard, "write_file", tool, ARGS) for _ in range(6)]

    with pytest.raises(ToolExecutionError) as caught:
        guarded_call_sync(guard, "write_file", tool, ARGS)

    assert tool.runs == 4  # calls 5 and 6 were blocked and did not run
    assert isinstance(results[4], dict)
    assert results[4]["loop_blocked"] is True
    assert str(results[4]["error"]).startswith("[loop-guard] ")
    assert caught.value.is_retryable is False
    assert caught.value.tool_name == "write_file"


async def test_async_stuck_tool_is_blocked_without_running_then_halted() -> None:
    guard = LoopGuard()
    tool = Tool("same")
    results = [await guarded_call(guard, "write_file", tool.acall, ARGS) for _ in range(6)]

    with pytest.raises(ToolExecutionError) as caught:
        await guarded_call(guard, "write_file", tool.acall, ARGS)

    assert tool.runs == 4
    assert isinstance(results[5], dict)
    assert results[5]["loop_blocked"] is True
    assert caught.value.is_retryable is False


def test_warn_annotates_the_result() -> None:
    guard = LoopGuard()
    tool = Tool("done")
    results = [guarded_call_sync(guard, "write_file", tool, ARGS) for _ in range(3)]

    assert results[:2] == ["done", "done"]
    assert isinstance(results[2], str)
    assert results[2].startswith("done [loop-guard] write_file was called 3 times")


def test_a_post_check_block_withholds_the_result_of_a_call_that_ran() -> None:
    guard = LoopGuard()
    results = iter(["first", "same", "same", "same", "same"])

    def write_file(**_args: object) -> object:
        return next(results)

    outcomes = [guarded_call_sync(guard, "write_file", write_file, ARGS) for _ in range(5)]

    # The 5th call passed its pre-check (streak 3, so the count block was only a WARN),
    # ran, and returned the same result a 4th time: now the block is real.
    assert isinstance(outcomes[4], dict)
    assert outcomes[4]["loop_blocked"] is True
    assert "its result is withheld" in str(outcomes[4]["error"])


def test_failures_are_recorded_re_raised_and_escalate_to_halt() -> None:
    guard = LoopGuard()
    error = FileNotFoundError("missing.yaml")
    tool = Tool(error=error)
    for _ in range(7):
        with pytest.raises(FileNotFoundError):
            guarded_call_sync(guard, "read_file", tool, {"path": "missing.yaml"})
    assert any("[loop-guard]" in note for note in error.__notes__)

    blocked = guarded_call_sync(guard, "read_file", tool, {"path": "missing.yaml"})
    with pytest.raises(ToolExecutionError) as caught:
        guarded_call_sync(guard, "read_file", tool, {"path": "missing.yaml"})

    assert isinstance(blocked, dict)
    assert blocked["loop_blocked"] is True
    assert tool.runs == 7
    assert "8 times in a row" in str(caught.value)


# Count thresholds out of the way: the no-progress streak warns at 2 and halts at 3.
COUNT_THRESHOLDS = [
    f"{bucket}_{level}_threshold"
    for bucket in ("idempotent", "mutating")
    for level in ("warn", "block", "halt")
]
STREAK_ONLY = LoopGuardConfig.from_dict(
    {**dict.fromkeys(COUNT_THRESHOLDS, 100), "no_progress_warn": 2, "no_progress_halt": 3}
)


def test_a_failure_whose_post_check_halts_raises_chained_to_it() -> None:
    guard = LoopGuard(STREAK_ONLY)
    error = ValueError("bad input")
    tool = Tool(error=error)
    with pytest.raises(ValueError, match="bad input"):
        guarded_call_sync(guard, "parse_doc", tool, {"doc": 1})
    with pytest.raises(ValueError, match="bad input"):
        guarded_call_sync(guard, "parse_doc", tool, {"doc": 1})
    assert error.__notes__[-1].startswith("[loop-guard] parse_doc returned the same result")

    with pytest.raises(ToolExecutionError) as caught:
        guarded_call_sync(guard, "parse_doc", tool, {"doc": 1})

    assert caught.value.__cause__ is error
    assert tool.runs == 3


async def test_async_timeouts_are_recorded_as_failures_and_halt() -> None:
    guard = LoopGuard(STREAK_ONLY)
    timeout = TimeoutError("upstream took too long")
    tool = Tool(error=timeout)
    for _ in range(2):
        with pytest.raises(TimeoutError):
            await guarded_call(guard, "fetch_status", tool.acall, {"job": 1})

    with pytest.raises(ToolExecutionError) as caught:
        await guarded_call(guard, "fetch_status", tool.acall, {"job": 1})

    assert caught.value.__cause__ is timeout
    assert caught.value.is_retryable is False
    assert guard.get_stats().streak == 3


async def test_cancellation_is_not_recorded_as_a_failure() -> None:
    guard = LoopGuard()
    tool = Tool(error=asyncio.CancelledError())

    with pytest.raises(asyncio.CancelledError):
        await guarded_call(guard, "wait_for_job", tool.acall, {"job": 1})

    assert guard.get_stats().tool_counts == {}


def test_sync_wrapper_refuses_an_async_tool_without_recording_it() -> None:
    guard = LoopGuard()

    with pytest.raises(TypeError, match="guarded_call"):
        guarded_call_sync(guard, "read_file", Tool().acall, {"path": "a"})

    assert guard.get_stats().tool_counts == {}


# --- on_decision: which decisions the guard made for a call, and which one settled it ---


def actions(decisions: list[LoopGuardDecision]) -> list[str]:
    return [decision.action.value for decision in decisions]


def test_on_decision_sees_the_pre_check_then_the_post_check() -> None:
    guard = LoopGuard()
    tool = Tool("done")
    seen: list[list[LoopGuardDecision]] = []
    for _ in range(3):
        decisions: list[LoopGuardDecision] = []
        guarded_call_sync(guard, "write_file", tool, ARGS, on_decision=decisions.append)
        seen.append(decisions)

    assert [actions(decisions) for decisions in seen] == [
        ["allow", "allow"],
        ["allow", "allow"],
        ["warn", "warn"],  # the 3rd call of a mutating tool
    ]
    assert [d.code for d in seen[2]] == ["count_warn", "count_warn"]
    assert settling_decision(seen[2]) is seen[2][1]


async def test_on_decision_sees_only_the_pre_check_of_a_blocked_or_halted_call() -> None:
    guard = LoopGuard()
    tool = Tool("same")
    for _ in range(4):
        await guarded_call(guard, "write_file", tool.acall, ARGS)

    blocked: list[LoopGuardDecision] = []
    result = await guarded_call(guard, "write_file", tool.acall, ARGS, on_decision=blocked.append)
    assert isinstance(result, dict)
    assert actions(blocked) == ["block"]
    assert settling_decision(blocked) is blocked[0]

    await guarded_call(guard, "write_file", tool.acall, ARGS)
    halted: list[LoopGuardDecision] = []
    with pytest.raises(ToolExecutionError):
        await guarded_call(guard, "write_file", tool.acall, ARGS, on_decision=halted.append)
    assert actions(halted) == ["halt"]
    assert tool.runs == 4


def test_on_decision_sees_the_post_check_of_a_failed_call() -> None:
    guard = LoopGuard(STREAK_ONLY)
    tool = Tool(error=ValueError("bad input"))
    seen: list[list[LoopGuardDecision]] = []
    for _ in range(3):
        decisions: list[LoopGuardDecision] = []
        with pytest.raises((ValueError, ToolExecutionError)):
            guarded_call_sync(guard, "parse_doc", tool, {"doc": 1}, on_decision=decisions.append)
        seen.append(decisions)

    assert [actions(decisions) for decisions in seen] == [
        ["allow", "allow"],
        ["allow", "warn"],
        ["warn", "halt"],  # the post-check HALT raised ToolExecutionError
    ]
    assert [settling_decision(d) for d in seen] == [d[-1] for d in seen]


def test_settling_decision_is_a_pre_check_block_or_halt_else_the_last() -> None:
    assert settling_decision([]) is None
    warn = LoopGuardDecision(GuardAction.WARN, "count_warn", "careful", {})
    allow = LoopGuardDecision(GuardAction.ALLOW, "ok", "", {})
    assert settling_decision([warn, allow]) is allow


def test_issue9_a_tool_failing_with_new_errors_and_arguments_halts_at_failure_halt() -> None:
    # Different arguments and a different error each time: no streak, no count BLOCK; only
    # the failure streak sees that the tool never works.
    guard = LoopGuard(
        LoopGuardConfig(
            idempotent_warn_threshold=100,
            idempotent_block_threshold=100,
            idempotent_halt_threshold=100,
        )
    )
    notes: list[list[str]] = []
    for n in range(1, 8):
        with pytest.raises(ConnectionError) as raised:
            guarded_call_sync(
                guard, "fetch_url", Tool(error=ConnectionError(f"refused {n}")), {"n": n}
            )
        notes.append(getattr(raised.value, "__notes__", []))

    with pytest.raises(ToolExecutionError, match="fetch_url failed 8 times in a row"):
        guarded_call_sync(guard, "fetch_url", Tool(error=ConnectionError("refused 8")), {"n": 8})
    assert notes[:2] == [[], []]
    assert all("failed" in note[0] for note in notes[2:])


async def halting_call(
    guard: LoopGuard,
    tool_name: str,
    fn: Callable[..., object],
    args_of: Callable[[int], Mapping[str, object]],
) -> tuple[int, ToolExecutionError]:
    """Call the tool through the wrapper until it halts: the call number and the error."""
    for n in range(1, 61):
        try:
            await guarded_call(guard, tool_name, fn, args_of(n))
        except ToolExecutionError as error:
            return n, error
    pytest.fail(f"{tool_name} ran 60 times without a HALT")


async def test_issue20_the_wrapper_stops_a_reworded_exec_loop_by_call_12() -> None:
    tool = Tool("exit 1: connection refused")
    calls, error = await halting_call(
        LoopGuard(),
        "exec",
        tool.acall,
        lambda n: {"command": f"curl -sf --retry {n} https://ci.example.com/api/status"},
    )

    assert calls <= 12
    assert tool.runs < calls
    assert "nearly the same arguments" in error.message


async def test_issue20_the_wrapper_stops_sends_answered_with_fresh_small_ids_by_call_8() -> None:
    sent = 0

    def send(**_args: object) -> dict[str, object]:
        nonlocal sent
        sent += 1
        return {"ok": True, "messageId": 4520 + sent}

    calls, _ = await halting_call(
        LoopGuard(), "message.send", send, lambda _n: {"to": "chat-7", "text": "Done"}
    )

    assert calls <= 8
    assert sent <= 7


def test_issue20_the_wrapper_never_blocks_ten_writes_to_ten_files() -> None:
    guard = LoopGuard()
    tool = Tool("ok")
    results = [
        guarded_call_sync(guard, "write_file", tool, {"path": f"out/{n}.txt", "content": "x"})
        for n in range(10)
    ]

    assert tool.runs == 10
    assert all(not isinstance(result, dict) for result in results)
