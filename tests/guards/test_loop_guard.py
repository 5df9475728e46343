"""LoopGuard: the per-turn tool-call guard (counts, no-progress streaks, cycles, turn time)."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from guards.loop_guard import (
    GuardAction,
    LoopGuard,
    LoopGuardConfig,
    LoopGuardDecision,
    ToolExecutionError,
    apply_decision,
    canonical_args,
    result_hash,
)
from tests.fakes.inmemory import FakeClock

ALLOW, WARN, BLOCK, HALT = GuardAction.ALLOW, GuardAction.WARN, GuardAction.BLOCK, GuardAction.HALT

# Thresholds so high that only the rule under test can fire.
QUIET = LoopGuardConfig(
    idempotent_warn_threshold=10_000,
    idempotent_block_threshold=10_000,
    idempotent_halt_threshold=10_000,
    mutating_warn_threshold=10_000,
    mutating_block_threshold=10_000,
    mutating_halt_threshold=10_000,
    no_progress_warn=10_000,
    no_progress_halt=10_000,
    cycle_warn_laps=9_999,
    cycle_halt_laps=10_000,
    failure_warn=10_000,
    failure_halt=10_000,
    no_progress_similar_warn=10_000,
    no_progress_similar_halt=10_000,
)


# The defaults without the failure streak, for the rules that predate it.
NO_FAILURE_STREAK = replace(LoopGuardConfig(), failure_warn=10_000, failure_halt=10_000)


@dataclass(frozen=True)
class Step:
    """One call as an agent saw it: the pre-check, and the post-check when the call ran."""

    pre: LoopGuardDecision
    post: LoopGuardDecision | None


def drive(
    guard: LoopGuard,
    tool: str,
    args: dict[str, object],
    outcome: Callable[[int], tuple[bool, object]],
    calls: int,
    *,
    record_blocked: bool = True,
) -> list[Step]:
    """Act like an agent: check first, skip blocked calls (recording the block result if
    `record_blocked`), record what ran, stop at HALT."""
    steps: list[Step] = []
    for n in range(1, calls + 1):
        pre = guard.check(tool, args)
        if pre.action is HALT:
            steps.append(Step(pre, None))
            break
        if pre.action is BLOCK:
            if record_blocked:
                blocked = guard.record(tool, args, success=False, result=apply_decision(pre, None))
                assert blocked.code == "blocked"
            steps.append(Step(pre, None))
            continue
        success, result = outcome(n)
        steps.append(Step(pre, guard.record(tool, args, success=success, result=result)))
    return steps


def pre_actions(steps: list[Step]) -> list[GuardAction]:
    return [step.pre.action for step in steps]


def same_error(_n: int) -> tuple[bool, object]:
    return False, "FileNotFoundError: [Errno 2] No such file or directory: 'missing.yaml'"


def test_polling_tool_with_changing_results_is_never_blocked_or_halted() -> None:
    guard = LoopGuard()

    def poll(n: int) -> tuple[bool, object]:
        if n == 20:
            return True, {"job": 42, "status": "COMPLETE"}
        return True, {"job": 42, "status": "IN_PROGRESS", "progress": n * 5}

    steps = drive(guard, "check_status", {"job": 42}, poll, 20)

    assert len(steps) == 20
    seen = {step.pre.action for step in steps} | {s.post.action for s in steps if s.post}
    assert seen <= {ALLOW, WARN}


# The issue's agent "checks before each call, skips blocked calls, records what ran";
# an agent that also records the block result must get exactly the same decisions.
@pytest.mark.parametrize("record_blocked", [False, True], ids=["skips", "records"])
def test_issue2_stuck_read_warns_from_5th_blocks_at_8th_halts_at_9th(
    record_blocked: bool,
) -> None:
    # Defaults: idempotent 5/8/12, no_progress 4/8. Calls 1-7 run and fail identically
    # (streak 7); the 8th is blocked (count 8, streak 7 >= 4) and still counts, so the
    # 9th pre-check sees streak 8 = no_progress_halt. The failure streak (issue 9, which
    # warns from the 4th call) is out of the way here.
    guard = LoopGuard(NO_FAILURE_STREAK)
    runs: list[int] = []

    def fail(n: int) -> tuple[bool, object]:
        runs.append(n)
        return same_error(n)

    steps = drive(
        guard, "read_file", {"path": "missing.yaml"}, fail, 20, record_blocked=record_blocked
    )

    assert pre_actions(steps) == [ALLOW] * 4 + [WARN] * 3 + [BLOCK, HALT]
    assert [step.pre.code for step in steps[-2:]] == ["count_block", "no_progress_halt"]
    assert [s.pre.code for s in steps[4:7]] == ["no_progress_warn"] * 3
    assert runs == [1, 2, 3, 4, 5, 6, 7]
    # The 4th identical result makes the post-check and the 5th call's pre-check WARN.
    assert [s.post.action for s in steps[:4] if s.post] == [ALLOW] * 3 + [WARN]
    assert steps[3].post is not None
    assert steps[3].post.code == "no_progress_warn"
    assert (steps[4].pre.action, steps[4].pre.metadata["streak"]) == (WARN, 4)
    stats = guard.get_stats()
    assert (stats.tool_counts["read_file"], stats.streak) == (8, 8)


@pytest.mark.parametrize("record_blocked", [False, True], ids=["skips", "records"])
def test_issue2_stuck_mutating_tool_warns_from_3rd_blocks_at_5th_halts_at_7th(
    record_blocked: bool,
) -> None:
    guard = LoopGuard()
    runs: list[int] = []

    def fail(n: int) -> tuple[bool, object]:
        runs.append(n)
        return False, "PermissionError: read-only file system"

    args: dict[str, object] = {"path": "/etc/x", "content": "y"}
    steps = drive(guard, "write_file", args, fail, 20, record_blocked=record_blocked)

    assert pre_actions(steps) == [ALLOW] * 2 + [WARN] * 2 + [BLOCK] * 2 + [HALT]
    assert runs == [1, 2, 3, 4]  # the blocked 5th and 6th calls never ran
    assert [s.pre.code for s in steps[4:]] == ["count_block", "count_block", "count_halt"]
    assert [s.pre.metadata["tool_count"] for s in steps] == [1, 2, 3, 4, 5, 6, 7]


def test_issue2_a_blocked_call_is_counted_once_whether_or_not_it_is_recorded() -> None:
    skipping, recording = LoopGuard(), LoopGuard()
    for guard in (skipping, recording):
        for _ in range(7):
            guard.record("read_file", {"path": "a"}, success=True, result="same")
    assert skipping.check("read_file", {"path": "a"}).action is BLOCK
    pre = recording.check("read_file", {"path": "a"})
    block = apply_decision(pre, None)
    recorded = recording.record("read_file", {"path": "a"}, success=False, result=block)

    assert recorded.code == "blocked"
    for guard in (skipping, recording):
        stats = guard.get_stats()
        assert (dict(stats.tool_counts), stats.streak) == ({"read_file": 8}, 8)
        assert guard.check("read_file", {"path": "a"}).code == "no_progress_halt"


def test_issue2_a_block_result_recorded_without_its_pre_check_counts() -> None:
    guard = LoopGuard()
    for _ in range(3):
        guard.record("read_file", {"path": "a"}, success=True, result="same")
    block = {"error": "[loop-guard] blocked elsewhere", "loop_blocked": True}

    decision = guard.record("read_file", {"path": "a"}, success=False, result=block)

    assert (decision.action, decision.code) == (BLOCK, "blocked")
    stats = guard.get_stats()
    assert (stats.tool_counts["read_file"], stats.streak) == (4, 4)


def test_mutating_tool_with_changing_results_only_warns() -> None:
    guard = LoopGuard()

    steps = drive(guard, "write_file", {"path": "log.txt"}, lambda n: (True, f"wrote {n}"), 20)

    assert len(steps) == 20
    assert {step.pre.action for step in steps} <= {ALLOW, WARN}
    assert {step.post.action for step in steps if step.post} <= {ALLOW, WARN}
    assert steps[-1].pre.code == "count_warn"


def test_same_result_for_different_args_is_not_a_streak() -> None:
    guard = LoopGuard()
    cities = ["Paris", "Lima", "Oslo", "Pune", "Cairo", "Quito", "Perth", "Riga", "Seoul", "Tunis"]

    for city in cities:
        pre = guard.check("get_weather", {"city": city})
        post = guard.record("get_weather", {"city": city}, success=True, result="sunny")
        assert HALT not in (pre.action, post.action)
        assert BLOCK not in (pre.action, post.action)
    assert guard.get_stats().streak == 1


def test_args_differing_in_key_order_and_int_float_are_the_same_call() -> None:
    first = {"a": 1, "b": {"x": 1, "y": 2}}
    second = {"b": {"y": 2, "x": 1}, "a": 1.0}
    assert canonical_args(first) == canonical_args(second)

    guard = LoopGuard(LoopGuardConfig(no_progress_warn=2))
    guard.record("read_file", first, success=True, result="same")
    guard.record("read_file", second, success=True, result="same")
    assert guard.get_stats().streak == 2
    assert guard.check("read_file", first).code == "no_progress_warn"


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ({"flag": True}, {"flag": 1}),
        ({"n": 1}, {"n": "1"}),
        ({"v": None}, {}),
        ({"items": [1, 2]}, {"items": [2, 1]}),
        ({"outer": {"a": 1}}, {"outer": {"a": True}}),
    ],
)
def test_args_that_json_tells_apart_are_different_calls(
    first: dict[str, object], second: dict[str, object]
) -> None:
    assert canonical_args(first) != canonical_args(second)


def test_a_reused_args_dict_changed_between_calls_is_a_new_call() -> None:
    guard = LoopGuard()
    args: dict[str, object] = {"page": 0}
    for page in range(10):
        args["page"] = page
        guard.check("read_page", args)
        guard.record("read_page", args, success=True, result="same text")

    assert guard.get_stats().streak == 1


def test_tuples_count_as_lists_and_odd_values_by_repr() -> None:
    assert canonical_args({"xs": (1, 2)}) == canonical_args({"xs": [1, 2.0]})
    assert canonical_args({1: "a"}) == canonical_args({"1": "a"})
    assert canonical_args(None) == canonical_args(None)
    assert canonical_args("raw text") != canonical_args({"raw text": None})
    assert canonical_args({"when": range(3)}) == canonical_args({"when": range(3)})


def test_self_referencing_args_do_not_break_the_guard() -> None:
    looped: dict[str, object] = {"a": 1}
    looped["self"] = looped
    guard = LoopGuard()

    assert guard.check("read_file", looped).action is ALLOW
    assert guard.record("read_file", looped, success=True, result=looped).action is ALLOW


def test_results_differing_only_after_the_1000th_character_are_different() -> None:
    head = "x" * 1000
    assert result_hash(head + "A") != result_hash(head + "B")
    assert result_hash({"body": head + "A"}) != result_hash({"body": head + "B"})

    guard = LoopGuard()
    guard.record("read_file", {"path": "log"}, success=True, result=head + "A")
    guard.record("read_file", {"path": "log"}, success=True, result=head + "B")
    assert guard.get_stats().streak == 1


def test_results_equal_up_to_key_order_are_the_same_result() -> None:
    assert result_hash({"a": 1, "b": [1, 2]}) == result_hash({"b": [1, 2], "a": 1})
    assert result_hash({"a": (1, 2)}) == result_hash({"a": [1, 2]})
    assert result_hash({1: "x", (2, 3): "y"}) == result_hash({(2, 3): "y", 1: "x"})
    assert result_hash({"a": 1}) != result_hash({"a": 2})


@pytest.mark.parametrize("falsy", ["", [], {}, 0, False, None, b""], ids=repr)
def test_falsy_results_still_build_a_streak(falsy: object) -> None:
    guard = LoopGuard()
    decisions = [
        guard.record("list_files", {"dir": "empty"}, success=True, result=falsy) for _ in range(8)
    ]

    assert [d.action for d in decisions] == [ALLOW] * 3 + [WARN] * 4 + [HALT]
    assert decisions[-1].code == "no_progress_halt"


def test_falsy_results_of_different_kinds_differ() -> None:
    hashes = {result_hash(value) for value in ["", [], {}, 0, False, None, b""]}
    assert len(hashes) == 7
    assert result_hash("x", success=True) != result_hash("x", success=False)


def test_alternating_calls_with_identical_results_warn_then_halt_by_the_cycle_rule() -> None:
    guard = LoopGuard()
    calls = [("get_status", {"job": 1}, "pending"), ("list_jobs", {}, "job 1")]
    pre: list[LoopGuardDecision] = []
    post: list[LoopGuardDecision] = []
    for n in range(11):
        tool, args, result = calls[n % 2]
        pre.append(guard.check(tool, args))
        if pre[-1].action is HALT:
            break
        post.append(guard.record(tool, args, success=True, result=result))

    assert [d.action for d in pre] == [ALLOW] * 6 + [WARN] * 4 + [HALT]
    assert {d.code for d in pre[6:10]} == {"cycle_warn"}
    assert pre[-1].code == "cycle_halt"
    assert pre[-1].metadata["laps"] == 5
    assert post[5].code == "cycle_warn"  # the 3rd lap completes at the 6th call
    assert post[9].code == "cycle_halt"
    assert guard.get_stats().laps == 5


def test_a_cycle_whose_result_changes_is_progress() -> None:
    guard = LoopGuard()
    decisions: list[LoopGuardDecision] = []
    for lap in range(12):
        decisions.append(guard.check("get_status", {"job": 1}))
        decisions.append(guard.record("get_status", {"job": 1}, success=True, result="running"))
        decisions.append(guard.check("read_log", {"job": 1}))
        decisions.append(guard.record("read_log", {"job": 1}, success=True, result=f"line {lap}"))

    assert {d.action for d in decisions} <= {ALLOW, WARN}
    assert not any(d.code.startswith("cycle") for d in decisions)


@pytest.mark.parametrize("period", [3, 4])
def test_longer_cycles_are_caught_too(period: int) -> None:
    guard = LoopGuard()
    tools = [f"get_part_{i}" for i in range(period)]
    codes = []
    for n in range(period * 5):
        tool = tools[n % period]
        codes.append(guard.record(tool, {}, success=True, result="same").code)

    assert codes[period * 3 - 1] == "cycle_warn"
    assert codes[-1] == "cycle_halt"


def test_a_different_tool_ends_the_streak() -> None:
    guard = LoopGuard()
    for _ in range(3):
        guard.record("read_file", {"path": "a"}, success=True, result="same")
    guard.record("list_files", {"dir": "."}, success=True, result="same")
    guard.record("read_file", {"path": "a"}, success=True, result="same")

    assert guard.get_stats().streak == 1
    assert guard.check("read_file", {"path": "a"}).code == "count_warn"  # 5th call, not stuck


def test_mark_progress_ends_the_streak() -> None:
    guard = LoopGuard()
    for _ in range(4):
        guard.record("read_file", {"path": "a"}, success=True, result="same")
    assert guard.check("read_file", {"path": "a"}).code == "no_progress_warn"

    guard.mark_progress("stage-1-complete")

    decision = guard.check("read_file", {"path": "a"})
    assert (decision.code, decision.metadata["streak"]) == ("count_warn", 0)
    stats = guard.get_stats()
    assert (stats.streak, stats.progress_marks, stats.last_progress) == (0, 1, "stage-1-complete")


def test_reset_turn_clears_counts_streak_and_timer() -> None:
    clock = FakeClock(start=0.0)
    guard = LoopGuard(clock=clock)
    for _ in range(4):
        guard.record("read_file", {"path": "a"}, success=True, result="same")
    clock.now = 100.0

    guard.reset_turn()

    stats = guard.get_stats()
    assert (stats.turn_elapsed, dict(stats.tool_counts), stats.streak) == (0.0, {}, 0)
    clock.now = 200.0  # the next turn's timer starts at its first call
    assert guard.check("read_file", {"path": "a"}).action is ALLOW
    clock.now = 300.0
    assert guard.get_stats().turn_elapsed == 100.0


def test_turn_timer_halts_with_time_exceeded() -> None:
    clock = FakeClock(start=0.0)
    guard = LoopGuard(LoopGuardConfig(max_time_per_turn=120.0), clock=clock)
    assert guard.check("read_file", {"path": "a"}).action is ALLOW
    clock.now = 120.0
    assert guard.check("read_file", {"path": "b"}).action is ALLOW

    clock.now = 120.5
    decision = guard.check("read_file", {"path": "c"})

    assert (decision.action, decision.code) == (HALT, "time_exceeded")
    assert "120" in decision.message
    assert guard.record("read_file", {"path": "c"}, success=True, now=121.0).code == "time_exceeded"


def test_now_overrides_the_clock() -> None:
    guard = LoopGuard(LoopGuardConfig(max_time_per_turn=10.0), clock=lambda: 0.0)
    assert guard.check("read_file", {}, now=1000.0).action is ALLOW
    assert guard.check("read_file", {}, now=1011.0).code == "time_exceeded"


@pytest.mark.parametrize(
    "name", ["read_file", "list_files", "search_docs", "get_weather", "check_status", "show_config"]
)
def test_read_tools_are_idempotent(name: str) -> None:
    assert LoopGuard().classify(name) == "idempotent"


@pytest.mark.parametrize(
    "name",
    [
        "write_file",
        "forget_memory",
        "update_settings",
        "checkout_cart",
        "delete_listing",
        "frobnicate",
        "getOrCreateUser",
        "find-and-replace",
        "check_in",
    ],
)
def test_state_changing_and_unknown_tools_are_mutating(name: str) -> None:
    assert LoopGuard().classify(name) == "mutating"


@pytest.mark.parametrize("name", ["fetchPageTitle", "web.search", "git_log", "pwd", "db-query"])
def test_names_are_split_in_every_style(name: str) -> None:
    assert LoopGuard().classify(name) == "idempotent"


DESIGN_MUTATING_VERBS = [
    "write",
    "edit",
    "delete",
    "remove",
    "update",
    "set",
    "create",
    "send",
    "post",
    "put",
    "patch",
    "exec",
    "run",
    "install",
    "commit",
    "push",
    "forget",
    "checkout",
    "pay",
    "buy",
    "move",
    "rename",
    "drop",
    "insert",
]
DESIGN_READ_VERBS = [
    "read",
    "get",
    "list",
    "search",
    "find",
    "show",
    "view",
    "check",
    "fetch",
    "query",
    "describe",
    "status",
    "poll",
    "wait",
]


@pytest.mark.parametrize("verb", DESIGN_MUTATING_VERBS)
def test_issue2_every_design_mutating_verb_makes_a_tool_mutating(verb: str) -> None:
    guard = LoopGuard()
    camel = "get" + verb.capitalize() + "Thing"  # a read verb too: the mutating one wins
    for name in (f"{verb}_thing", camel, f"thing-{verb}", f"search_and_{verb}"):
        assert guard.classify(name) == "mutating", name


@pytest.mark.parametrize("verb", DESIGN_READ_VERBS)
def test_issue2_every_design_read_verb_makes_a_tool_idempotent(verb: str) -> None:
    guard = LoopGuard()
    for name in (f"{verb}_thing", verb + "Thing", f"thing-{verb}"):
        assert guard.classify(name) == "idempotent", name


def test_register_tool_overrides_classification() -> None:
    guard = LoopGuard()
    guard.register_tool("frobnicate", idempotent=True)
    guard.register_tool("read_file", idempotent=False)

    assert guard.classify("frobnicate") == "idempotent"
    assert guard.classify("read_file") == "mutating"
    assert LoopGuard().classify("read_file") == "idempotent"  # per guard, not global


def test_registered_bucket_sets_the_thresholds() -> None:
    guard = LoopGuard()
    guard.register_tool("frobnicate", idempotent=True)
    for n in range(4):
        guard.record("frobnicate", {"n": n}, success=True, result=n)

    assert guard.check("frobnicate", {"n": 4}).code == "count_warn"  # idempotent: 5th call


def test_registering_a_tool_already_called_changes_its_thresholds() -> None:
    guard = LoopGuard()
    for n in range(2):
        guard.record("frobnicate", {"n": n}, success=True, result=n)
    assert guard.check("frobnicate", {"n": 2}).code == "count_warn"  # mutating: 3rd call

    guard.register_tool("frobnicate", idempotent=True)

    assert guard.check("frobnicate", {"n": 2}).code == "ok"


@pytest.fixture
def fast_switching() -> Iterator[None]:
    """Switch threads as often as possible so that an unlocked update would lose counts."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(interval)


def run_threads(threads: int, work: Callable[[int], None]) -> None:
    start = threading.Barrier(threads)

    def worker(index: int) -> None:
        start.wait()
        work(index)

    pool = [threading.Thread(target=worker, args=(index,)) for index in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()


@pytest.mark.usefixtures("fast_switching")
def test_concurrent_check_and_record_lose_no_count() -> None:
    guard = LoopGuard(QUIET)
    threads, per_thread = 8, 400

    def agent(worker: int) -> None:
        for n in range(per_thread):
            tool = "read_file" if n % 2 else "write_file"
            guard.check(tool, {"worker": worker, "n": n})
            guard.record(tool, {"worker": worker, "n": n}, success=True, result=n)

    run_threads(threads, agent)

    counts = guard.get_stats().tool_counts
    assert counts == {
        "read_file": threads * per_thread // 2,
        "write_file": threads * per_thread // 2,
    }


@pytest.mark.usefixtures("fast_switching")
def test_concurrent_identical_calls_lose_no_streak_step() -> None:
    guard = LoopGuard(QUIET)
    threads, per_thread = 8, 400

    def agent(_worker: int) -> None:
        for _ in range(per_thread):
            guard.check("read_file", {"path": "a"})
            guard.record("read_file", {"path": "a"}, success=True, result="same")

    run_threads(threads, agent)

    stats = guard.get_stats()
    assert (stats.streak, stats.tool_counts["read_file"]) == (threads * per_thread,) * 2


def test_exceptions_recorded_as_failures_build_a_streak() -> None:
    def fetch_url() -> str:
        raise TimeoutError("upstream took too long")

    guard = LoopGuard()
    decisions = []
    for _ in range(8):
        try:
            fetch_url()
        except TimeoutError as exc:
            text = f"{type(exc).__name__}: {exc}"
            decisions.append(guard.record("fetch_url", {"url": "x"}, success=False, result=text))

    assert [d.code for d in decisions[3:]] == ["no_progress_warn"] * 4 + ["no_progress_halt"]


def test_a_blocked_call_counts_and_extends_the_streak() -> None:
    guard = LoopGuard()
    for _ in range(7):
        guard.record("read_file", {"path": "a"}, success=True, result="same")
    pre = guard.check("read_file", {"path": "a"})
    assert pre.action is BLOCK

    post = guard.record("read_file", {"path": "a"}, success=False, result=apply_decision(pre, None))

    assert (post.action, post.code) == (BLOCK, "blocked")
    stats = guard.get_stats()
    assert (stats.tool_counts["read_file"], stats.streak) == (8, 8)


def test_issue2_count_block_needs_the_streak_this_call_would_extend() -> None:
    guard = LoopGuard()
    for _ in range(7):
        guard.record("read_file", {"path": "a"}, success=True, result="same")

    other = guard.check("read_file", {"path": "b"})  # 8th call, but not the stuck one
    same = guard.check("read_file", {"path": "a"})

    assert (other.action, other.code, other.metadata["streak"]) == (WARN, "count_warn", 0)
    assert (same.action, same.code, same.metadata["streak"]) == (BLOCK, "count_block", 7)


def test_a_cycle_counts_only_for_the_call_that_continues_it() -> None:
    guard = LoopGuard()
    for n in range(6):  # A, B three times: three laps
        tool = ("get_status", "list_jobs")[n % 2]
        guard.record(tool, {}, success=True, result="same")

    assert guard.check("get_status", {}).code == "cycle_warn"  # continues the cycle
    assert guard.check("list_jobs", {}).code == "ok"  # B again would break it
    assert guard.check("read_file", {}).code == "ok"


def test_turn_timer_fires_only_past_the_limit() -> None:
    guard = LoopGuard(LoopGuardConfig(max_time_per_turn=120.0))
    for _ in range(4):
        guard.record("read_file", {"path": "a"}, success=True, result="same", now=0.0)

    at_limit = guard.check("read_file", {"path": "a"}, now=120.0)
    past_it = guard.check("read_file", {"path": "a"}, now=120.001)

    assert (at_limit.action, at_limit.code) == (WARN, "no_progress_warn")
    assert (past_it.action, past_it.code) == (HALT, "time_exceeded")


def test_count_block_is_downgraded_while_results_change() -> None:
    guard = LoopGuard()
    for n in range(11):
        guard.record("read_file", {"path": "a"}, success=True, result=n)

    decision = guard.check("read_file", {"path": "a"})

    assert (decision.action, decision.code) == (WARN, "count_warn")
    assert decision.metadata["tool_count"] == 12
    assert "results keep changing" in decision.message


def test_decisions_explain_tool_count_and_threshold() -> None:
    guard = LoopGuard()
    for _ in range(4):
        guard.record("read_file", {"path": "a"}, success=True, result="same")
    decision = guard.check("read_file", {"path": "a"})

    assert decision.metadata == {
        "tool": "read_file",
        "tool_count": 5,
        "streak": 4,
        "threshold": 4,
    }
    assert "read_file" in decision.message
    assert "4 times" in decision.message
    assert "change the arguments" in decision.message


def test_many_tool_names_share_one_count_past_the_cap() -> None:
    guard = LoopGuard(QUIET)
    for n in range(1100):
        guard.record(f"tool_{n}", {}, success=True, result=n)

    assert len(guard.get_stats().tool_counts) <= 1025


def test_disabled_guard_always_allows() -> None:
    guard = LoopGuard(LoopGuardConfig(enabled=False))
    for _ in range(50):
        assert guard.check("delete_file", {"path": "/"}).code == "disabled"
        assert guard.record("delete_file", {"path": "/"}, success=True).action is ALLOW
    assert guard.get_stats().tool_counts == {}


def test_config_defaults_match_the_design() -> None:
    config = LoopGuardConfig.from_dict(None)
    assert config == LoopGuardConfig()
    assert LoopGuardConfig.from_dict({}) == config
    assert (config.idempotent_warn_threshold, config.idempotent_block_threshold) == (5, 8)
    assert (config.idempotent_halt_threshold, config.mutating_warn_threshold) == (12, 3)
    assert (config.mutating_block_threshold, config.mutating_halt_threshold) == (5, 7)
    assert (config.no_progress_warn, config.no_progress_halt) == (4, 8)
    assert (config.cycle_warn_laps, config.cycle_halt_laps) == (3, 5)
    assert config.max_time_per_turn == 120.0
    assert config.enabled is True


def test_from_dict_ignores_unknown_keys_and_reads_text() -> None:
    config = LoopGuardConfig.from_dict(
        {"enabled": "no", "no_progress_halt": "10", "max_time_per_turn": "30", "colour": "red"}
    )
    assert (config.enabled, config.no_progress_halt, config.max_time_per_turn) == (
        False,
        10,
        30.0,
    )


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"enabled": "maybe"}, "enabled"),
        ({"idempotent_warn_threshold": 0}, "idempotent_warn_threshold"),
        ({"mutating_block_threshold": "many"}, "mutating_block_threshold"),
        ({"no_progress_warn": 2.5}, "no_progress_warn"),
        ({"no_progress_halt": True}, "no_progress_halt"),
        ({"max_time_per_turn": -1}, "max_time_per_turn"),
        ({"max_time_per_turn": "soon"}, "max_time_per_turn"),
        ({"max_time_per_turn": float("nan")}, "max_time_per_turn"),
        ({"cycle_warn_laps": 1}, "cycle_warn_laps"),
        ({"idempotent_warn_threshold": 9}, "idempotent_block_threshold"),
        ({"no_progress_warn": 9}, "no_progress_halt"),
    ],
)
def test_from_dict_names_the_bad_field(data: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        LoopGuardConfig.from_dict(data)


def test_get_stats_reports_the_turn() -> None:
    clock = FakeClock(start=0.0)
    guard = LoopGuard(clock=clock)
    assert guard.get_stats().turn_elapsed == 0.0
    guard.record("read_file", {"path": "a"}, success=True, result="x")
    guard.record("read_file", {"path": "a"}, success=True, result="x")
    guard.record("write_file", {"path": "b"}, success=True, result="ok")
    clock.now = 2.5

    stats = guard.get_stats()

    assert stats.turn_elapsed == 2.5
    assert dict(stats.tool_counts) == {"read_file": 2, "write_file": 1}
    assert stats.streak == 1
    assert stats.enabled is True


def warn_decision() -> LoopGuardDecision:
    return LoopGuardDecision(WARN, "count_warn", "read_file was called 5 times", {"tool": "x"})


def test_apply_decision_allow_returns_the_result_untouched() -> None:
    result = {"a": 1}
    allow = LoopGuardDecision(ALLOW, "ok", "allowed", {})
    assert apply_decision(allow, result) is result


def test_apply_decision_warn_annotates_a_copy_of_a_dict() -> None:
    result = {"a": 1}

    annotated = apply_decision(warn_decision(), result)

    assert annotated == {
        "a": 1,
        "_loop_guard": {
            "action": "warn",
            "code": "count_warn",
            "message": "read_file was called 5 times",
        },
    }
    assert result == {"a": 1}


def test_apply_decision_warn_appends_to_a_string() -> None:
    annotated = apply_decision(warn_decision(), "contents")
    assert annotated == "contents [loop-guard] read_file was called 5 times"


def test_apply_decision_warn_leaves_other_results_alone() -> None:
    assert apply_decision(warn_decision(), [1, 2]) == [1, 2]


def test_apply_decision_block_replaces_the_result() -> None:
    block = LoopGuardDecision(BLOCK, "count_block", "stop repeating", {"tool": "read_file"})
    assert apply_decision(block, "contents") == {
        "error": "[loop-guard] stop repeating",
        "loop_blocked": True,
    }


def test_apply_decision_halt_raises_a_non_retryable_error() -> None:
    halt = LoopGuardDecision(HALT, "no_progress_halt", "stuck", {"tool": "read_file"})

    with pytest.raises(ToolExecutionError, match="stuck") as caught:
        apply_decision(halt, "contents")

    assert caught.value.is_retryable is False
    assert caught.value.tool_name == "read_file"


json_leaf = st.none() | st.booleans() | st.integers() | st.text(max_size=5)
json_value = st.recursive(
    json_leaf | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=12,
)


def reversed_keys(value: object) -> object:
    """The same value with every dict built in the opposite key order, ints as floats."""
    if isinstance(value, dict):
        return {key: reversed_keys(value[key]) for key in reversed(list(value))}
    if isinstance(value, list):
        return [reversed_keys(item) for item in value]
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) < 2**53:
        return float(value)
    return value


@given(st.dictionaries(st.text(max_size=4), json_value, max_size=5))
@settings(max_examples=100, deadline=None)
def test_canonical_args_ignore_key_order_and_int_float(args: dict[str, object]) -> None:
    assert canonical_args(args) == canonical_args(reversed_keys(args))


@given(st.dictionaries(st.text(max_size=4), json_value, max_size=5))
@settings(max_examples=100, deadline=None)
def test_canonical_args_survive_a_json_round_trip(args: dict[str, object]) -> None:
    assert canonical_args(args) == canonical_args(json.loads(json.dumps(args)))


tool_calls = st.lists(
    st.tuples(
        st.sampled_from(["read_file", "write_file", "get_status", "run_tests"]),
        st.dictionaries(st.sampled_from(["path", "n"]), st.integers(0, 2), max_size=2),
    ),
    max_size=60,
)


@given(tool_calls)
@settings(max_examples=60, deadline=None)
def test_calls_whose_results_all_differ_are_never_blocked_or_halted(
    calls: list[tuple[str, dict[str, object]]],
) -> None:
    guard = LoopGuard()
    for n, (tool, args) in enumerate(calls):
        pre = guard.check(tool, args)
        post = guard.record(tool, args, success=True, result=f"result {n}")
        assert pre.action in (ALLOW, WARN)
        assert post.action in (ALLOW, WARN)


@given(
    warn=st.integers(1, 10),
    extra=st.integers(0, 10),
    length=st.integers(1, 25),
)
@settings(max_examples=80, deadline=None)
def test_a_streak_warns_and_halts_exactly_at_its_thresholds(
    warn: int, extra: int, length: int
) -> None:
    halt = warn + extra
    config = replace(QUIET, no_progress_warn=warn, no_progress_halt=halt)
    guard = LoopGuard(config)
    for _ in range(length):
        post = guard.record("read_file", {"path": "a"}, success=True, result="same")
    pre = guard.check("read_file", {"path": "a"})

    expected = HALT if length >= halt else WARN if length >= warn else ALLOW
    assert post.action is expected
    assert pre.action is expected


@given(
    warn=st.integers(1, 8),
    block=st.integers(0, 8),
    halt=st.integers(0, 8),
    streak_warn=st.integers(1, 8),
    streak_extra=st.integers(0, 8),
    mutating=st.booleans(),
    record_blocked=st.booleans(),
)
@settings(max_examples=100, deadline=None)
def test_issue2_a_stuck_call_always_ends_in_halt(
    *,
    warn: int,
    block: int,
    halt: int,
    streak_warn: int,
    streak_extra: int,
    mutating: bool,
    record_blocked: bool,
) -> None:
    # Every call either runs and repeats the result or is blocked and counts as a repeat,
    # so the streak grows by one per call: HALT comes by the (no_progress_halt + 1)-th.
    prefix = "mutating" if mutating else "idempotent"
    config = LoopGuardConfig.from_dict(
        {
            f"{prefix}_warn_threshold": warn,
            f"{prefix}_block_threshold": warn + block,
            f"{prefix}_halt_threshold": warn + block + halt,
            "no_progress_warn": streak_warn,
            "no_progress_halt": streak_warn + streak_extra,
        }
    )
    tool = "write_file" if mutating else "read_file"
    steps = drive(
        LoopGuard(config), tool, {"path": "x"}, same_error, 100, record_blocked=record_blocked
    )

    assert steps[-1].pre.action is HALT
    assert len(steps) <= config.no_progress_halt + 1
    # Once blocked, never allowed again: retrying a blocked call never resets.
    actions = pre_actions(steps)
    if BLOCK in actions:
        assert set(actions[actions.index(BLOCK) :]) <= {BLOCK, HALT}


# --- issue 9: results after normalisation, the failure streak, get_stats as a mapping ------

STREAK_ONLY = replace(QUIET, no_progress_warn=4, no_progress_halt=8)
FAILURES_ONLY = replace(QUIET, failure_warn=3, failure_halt=8)


def sent_message(n: int) -> dict[str, object]:
    """What a chat platform answers to one send_message: fresh ids and a timestamp."""
    return {
        "ok": True,
        "message_id": 1_234_567_890_123_456_000 + n,  # a Discord-style snowflake
        "request_id": f"req_{n:04d}A7fQ9zK2",
        "trace": f"5f0c6b1e-0c1d-4a8e-9b7a-{n:012x}",
        "ts": f"2026-11-30T10:{n % 60:02d}:33Z",
        "channel": "C123",
    }


def test_issue9_identical_sends_whose_results_differ_only_by_ids_are_a_streak() -> None:
    guard = LoopGuard(STREAK_ONLY)
    args = {"channel": "C123", "text": "Still waiting for the deploy"}
    posts = [
        guard.record("send_message", args, success=True, result=sent_message(n))
        for n in range(1, 9)
    ]

    assert [post.action for post in posts] == [ALLOW] * 3 + [WARN] * 4 + [HALT]
    assert (posts[3].code, posts[-1].code) == ("no_progress_warn", "no_progress_halt")
    assert guard.get_stats().streak == 8


def test_issue9_a_real_status_change_is_still_progress() -> None:
    guard = LoopGuard(STREAK_ONLY)
    for n, status in enumerate(["queued", "running", "running", "done"]):
        result = {"job": "5f0c6b1e-0c1d-4a8e-9b7a-000000000001", "status": status, "at": n}
        guard.record("get_status", {"job": 1}, success=True, result={**result, "id": n * 99_991})

    # "running" twice is a run of two; the change to "done" ends it.
    assert guard.get_stats().streak == 1


@pytest.mark.parametrize(
    "results",
    [
        [f"Posted message {n * 7_919_191} at 2026-01-0{n}T10:00:00Z" for n in range(1, 6)],
        [f"ok id=call_{n}Zx81Qw3Lm".encode() for n in range(1, 6)],
        [b"\xff\xfe binary " + str(10_000 + n).encode() for n in range(1, 6)],
        [[n * 100_003, "sent"] for n in range(1, 6)],
    ],
    ids=["text", "bytes", "non-utf8", "json"],
)
def test_issue9_every_kind_of_result_is_compared_after_normalisation(
    results: list[object],
) -> None:
    guard = LoopGuard(QUIET)
    for result in results:
        guard.record("send_message", {"to": "x"}, success=True, result=result)
    assert guard.get_stats().streak == len(results)


def test_issue9_a_cycle_with_fresh_ids_is_caught() -> None:
    guard = LoopGuard(replace(QUIET, cycle_warn_laps=3, cycle_halt_laps=5))
    decisions = []
    for n in range(10):
        tool = "send_message" if n % 2 == 0 else "get_reply"
        decisions.append(guard.record(tool, {"to": "x"}, success=True, result=sent_message(n)))

    assert [d.code for d in decisions[5:]] == ["cycle_warn"] * 4 + ["cycle_halt"]


def test_issue9_the_same_result_for_another_call_is_still_not_a_streak() -> None:
    guard = LoopGuard(QUIET)
    guard.record("send_message", {"to": "a"}, success=True, result=sent_message(1))
    guard.record("send_message", {"to": "b"}, success=True, result=sent_message(2))
    assert guard.get_stats().streak == 1


def test_issue9_result_hash_normalises_volatile_tokens() -> None:
    assert result_hash(sent_message(1)) == result_hash(sent_message(2))
    assert result_hash({"status": "queued"}) != result_hash({"status": "sent"})
    assert result_hash("id 123456") != result_hash("id 123456", success=False)
    assert result_hash("page 2") != result_hash("page 3")


# The shared normaliser (guards.call_loop) misses a UUID whose first group has no digit.
uuids_with_a_leading_digit = st.uuids().filter(lambda u: not str(u)[:8].isalpha())


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(uuids_with_a_leading_digit, st.integers(10_000, 10**18)), min_size=1, max_size=12
    )
)
def test_issue9_results_differing_only_in_volatile_tokens_always_build_a_streak(
    ids: list[tuple[object, int]],
) -> None:
    guard = LoopGuard(QUIET)
    for uuid, number in ids:
        result = {"id": str(uuid), "n": number, "status": "sent"}
        guard.record("send_message", {"to": "x"}, success=True, result=result)
    assert guard.get_stats().streak == len(ids)


def test_issue9_failures_of_one_tool_with_any_args_warn_at_3_and_halt_at_8() -> None:
    guard = LoopGuard(FAILURES_ONLY)
    steps = drive_failures(guard, "fetch_url", 9)

    assert [pre.action for pre, _ in steps] == [ALLOW] * 3 + [WARN] * 5 + [HALT]
    assert [post.action for _, post in steps[:8]] == [ALLOW] * 2 + [WARN] * 5 + [HALT]
    assert (steps[2][1].code, steps[7][1].code, steps[8][0].code) == (
        "failure_warn",
        "failure_halt",
        "failure_halt",
    )
    assert steps[7][1].metadata["failures"] == 8
    assert "fetch_url failed 8 times in a row (threshold 8)" in steps[7][1].message
    assert guard.get_stats().failures == {"fetch_url": 9}  # the 9th ran despite the HALT


def drive_failures(
    guard: LoopGuard, tool: str, calls: int
) -> list[tuple[LoopGuardDecision, LoopGuardDecision]]:
    """Call `tool` with new arguments each time; every call fails with a new error."""
    steps = []
    for n in range(calls):
        args = {"url": f"https://example.invalid/{n}"}
        pre = guard.check(tool, args)
        post = guard.record(tool, args, success=False, result=f"ConnectionError: attempt {n}")
        steps.append((pre, post))
    return steps


def test_issue9_a_success_of_the_tool_ends_its_failure_streak() -> None:
    guard = LoopGuard(FAILURES_ONLY)
    drive_failures(guard, "fetch_url", 5)
    guard.record("search_docs", {"q": "x"}, success=True, result="hits")
    assert guard.check("fetch_url", {"url": "u"}).code == "failure_warn"  # another tool's success
    guard.record("fetch_url", {"url": "u"}, success=True, result="<html>")

    assert guard.check("fetch_url", {"url": "v"}).action is ALLOW
    assert guard.get_stats().failures == {}


@pytest.mark.parametrize("end", ["mark_progress", "reset_turn"])
def test_issue9_mark_progress_and_a_new_turn_end_the_failure_streak(end: str) -> None:
    guard = LoopGuard(FAILURES_ONLY)
    drive_failures(guard, "fetch_url", 7)
    assert guard.check("fetch_url", {"url": "u"}).code == "failure_warn"
    getattr(guard, end)(*(["page fetched"] if end == "mark_progress" else []))
    assert guard.check("fetch_url", {"url": "u"}).action is ALLOW


def test_issue9_failure_streaks_are_per_tool() -> None:
    guard = LoopGuard(FAILURES_ONLY)
    drive_failures(guard, "fetch_url", 2)
    drive_failures(guard, "read_file", 2)
    assert guard.check("fetch_url", {"url": "u"}).action is ALLOW
    assert dict(guard.get_stats().failures) == {"fetch_url": 2, "read_file": 2}


def test_issue9_a_blocked_call_is_no_failure() -> None:
    guard = LoopGuard(FAILURES_ONLY)
    drive_failures(guard, "fetch_url", 2)
    block = {"error": "[loop-guard] blocked elsewhere", "loop_blocked": True}
    guard.record("fetch_url", {"url": "u"}, success=False, result=block)
    assert guard.get_stats().failures == {"fetch_url": 2}


def test_issue9_a_failing_stuck_read_now_warns_from_its_4th_call_by_default() -> None:
    steps = drive(LoopGuard(), "read_file", {"path": "missing.yaml"}, same_error, 20)
    assert pre_actions(steps) == [ALLOW] * 3 + [WARN] * 4 + [BLOCK, HALT]
    assert steps[3].pre.code == "failure_warn"


def test_issue9_failure_thresholds_are_config_fields() -> None:
    config = LoopGuardConfig()
    assert (config.failure_warn, config.failure_halt) == (3, 8)
    assert LoopGuardConfig.from_dict({"failure_warn": "2", "failure_halt": 4.0}) == replace(
        config, failure_warn=2, failure_halt=4
    )
    with pytest.raises(ValueError, match="failure_halt must be at least failure_warn"):
        LoopGuardConfig(failure_warn=5, failure_halt=4)
    for bad in (0, -1, True, 1e308, "many"):
        with pytest.raises(ValueError, match="failure_warn"):
            LoopGuardConfig.from_dict({"failure_warn": bad})


def test_issue9_get_stats_reads_as_a_read_only_mapping() -> None:
    clock = FakeClock(start=0.0)
    guard = LoopGuard(clock=clock)
    guard.record("read_file", {"path": "a"}, success=True, result="x")
    guard.record("fetch_url", {"url": "u"}, success=False, result="timeout")
    clock.now = 1.5

    stats = guard.get_stats()

    assert isinstance(stats, Mapping)
    assert stats["turn_elapsed"] == 1.5
    assert "tool_counts" in stats
    counts = stats["tool_counts"]
    assert isinstance(counts, Mapping)
    assert dict(counts) == {"read_file": 1, "fetch_url": 1}
    assert stats["streak"] == stats.streak == 1
    assert stats["failures"] == {"fetch_url": 1}
    assert stats.get("missing") is None
    with pytest.raises(KeyError):
        stats["missing"]
    config = stats["config"]
    assert isinstance(config, Mapping)
    assert config["idempotent_thresholds"] == (5, 8, 12)
    assert config["mutating_thresholds"] == (3, 5, 7)
    assert config["enabled"] is True
    assert config["failure_halt"] == 8
    assert set(stats) >= {"enabled", "turn_elapsed", "tool_counts", "streak", "config"}
    assert len(stats) == len(list(stats.keys()))
    with pytest.raises(TypeError):
        stats["streak"] = 0  # type: ignore[index]
    with pytest.raises(TypeError):
        config["enabled"] = False  # type: ignore[index]


# --- issue 20: fresh ids in results, reworded arguments --------------------------------


@dataclass
class Turn:
    """What an agent's turn came to: the call that halted it (None: none), the calls that
    ran, and every decision in order."""

    halted_at: int | None = None
    runs: int = 0
    decisions: list[LoopGuardDecision] = field(default_factory=list)


def calls_until_halt(
    guard: LoopGuard,
    tool: str,
    args_of: Callable[[int], object],
    result_of: Callable[[int], object],
    calls: int = 60,
) -> Turn:
    """Act like an agent (check, skip a blocked call, record what ran) until a HALT."""
    turn = Turn()
    for n in range(1, calls + 1):
        args = args_of(n)
        pre = guard.check(tool, args)
        turn.decisions.append(pre)
        if pre.action is HALT:
            turn.halted_at = n
            break
        if pre.action is BLOCK:
            continue
        turn.runs += 1
        post = guard.record(tool, args, success=True, result=result_of(n))
        turn.decisions.append(post)
        if post.action is HALT:
            turn.halted_at = n
            break
    return turn


def never_stopped(decisions: list[LoopGuardDecision]) -> bool:
    return all(decision.action in (ALLOW, WARN) for decision in decisions)


FRESH_ID_RESULTS: dict[str, Callable[[int], object]] = {
    "messageId": lambda n: {"ok": True, "messageId": 4520 + n},
    "ts": lambda n: {"ok": True, "channel": "C1", "ts": f"1712.{n:04d}"},
    "created_at": lambda n: {"status": "queued", "created_at": 4500 + n},
    "etag": lambda n: {"ok": True, "etag": f'W/"{n:x}"'},
    "json-text": lambda n: json.dumps({"ok": True, "messageId": 4520 + n}),
    "json-bytes": lambda n: json.dumps({"ok": True, "message_id": 4520 + n}).encode(),
    "telegram": lambda n: {
        "ok": True,
        "result": {"message_id": 4520 + n, "date": 1700 + n, "chat": {"id": 7}, "text": "hi"},
    },
    "list": lambda n: [{"id": n, "state": "sent"}, {"id": n + 1, "state": "sent"}],
}


# A send halts at its 7th call; a read is blocked at its 8th call and halted at the 9th
# (issue 2's escalation of an identical loop): either way no call after the 7th runs.
@pytest.mark.parametrize("result_of", FRESH_ID_RESULTS.values(), ids=FRESH_ID_RESULTS.keys())
@pytest.mark.parametrize(("tool", "halt_by"), [("message.send", 8), ("read_inbox", 9)])
def test_issue20_a_loop_whose_results_differ_only_by_small_ids_stops_by_call_8(
    tool: str, halt_by: int, result_of: Callable[[int], object]
) -> None:
    turn = calls_until_halt(
        LoopGuard(), tool, lambda _n: {"to": "chat-7", "text": "Deploy finished"}, result_of
    )

    assert turn.halted_at is not None
    assert turn.halted_at <= halt_by
    assert turn.runs <= 7
    assert turn.decisions[-1].code in {"no_progress_halt", "count_halt"}


def test_issue20_a_changed_status_beside_a_fresh_id_is_still_progress() -> None:
    guard = LoopGuard(STREAK_ONLY)
    for n, status in enumerate(["queued", "running", "running", "done", "archived"]):
        guard.record("get_job", {"job": 1}, success=True, result={"id": n, "status": status})

    assert guard.get_stats().streak == 1


def test_issue20_result_hash_blanks_identity_fields_whatever_their_length() -> None:
    for result_of in FRESH_ID_RESULTS.values():
        assert result_hash(result_of(1)) == result_hash(result_of(2))
    # Data beside the ids still counts, and so does a field that only looks like one.
    assert result_hash({"id": 1, "text": "a"}) != result_hash({"id": 2, "text": "b"})
    assert result_hash({"valid": 1}) != result_hash({"valid": 2})
    assert result_hash({"identity": "a"}) != result_hash({"identity": "b"})
    assert result_hash('{"id": 1') != result_hash('{"id": 2')  # not JSON: text as it is


REWORDED_SENDS = [
    "Hi, can you please send me the status of the deploy?",
    "Hello, could you send me the current status of the deploy please?",
    "Can you please send me the deploy status now?",
    "Hi again, please send me the status of the deploy.",
    "Could you please send me the status of the deploy?",
    "Please send me the status of the deploy when you can.",
    "Hi, I am still waiting: can you send me the status of the deploy?",
    "Just checking: can you send me the status of the deploy please?",
    "Hello again, please send me the deploy status.",
    "Can you send me the status of the deploy, please?",
    "Please, send me the status of the deploy now.",
    "Hi, could you please send me the status of the deploy now?",
]
REWORDED_LOOPS: dict[str, tuple[str, Callable[[int], object]]] = {
    "counter-in-args": (
        "exec",
        lambda n: {"command": "curl -sf https://ci.example.com/api/status", "attempt": n},
    ),
    "counter-in-command": (
        "exec",
        lambda n: {"command": f"python3 -c \"print(open('/srv/report.txt').read()[:{n * 100}])\""},
    ),
    "toggled-flag": (
        "exec",
        lambda n: {
            "command": f"./deploy.sh --timeout {30 + n}{' --force' if n % 2 else ''}",
            "background": n % 3 == 0,
        },
    ),
    "reworded-sentence": (
        "sessions_send",
        lambda n: {"sessionKey": "agent:peer:main", "message": REWORDED_SENDS[(n - 1) % 12]},
    ),
    "reworded-search": (
        "search_docs",
        lambda n: {"query": f"how do I {REWORDED_SENDS[(n - 1) % 12].lower()}", "page": 1},
    ),
}


@pytest.mark.parametrize(("tool", "args_of"), REWORDED_LOOPS.values(), ids=REWORDED_LOOPS.keys())
@pytest.mark.parametrize(
    "result_of",
    [lambda _n: "exit 1: connection refused", lambda n: {"ok": True, "messageId": 900 + n}],
    ids=["same-text", "fresh-id"],
)
def test_issue20_a_reworded_loop_with_unchanging_results_halts_by_call_12(
    tool: str, args_of: Callable[[int], object], result_of: Callable[[int], object]
) -> None:
    turn = calls_until_halt(LoopGuard(), tool, args_of, result_of)

    assert turn.halted_at is not None
    assert turn.halted_at <= 12
    codes = [decision.code for decision in turn.decisions]
    assert "no_progress_similar_warn" in codes
    assert codes[-1] in {"no_progress_similar_halt", "count_halt"}
    assert "nearly the same arguments" in turn.decisions[-1].message
    assert tool in turn.decisions[-1].message


def test_issue20_the_similar_run_warns_at_4_and_halts_at_10_on_its_own() -> None:
    guard = LoopGuard(replace(QUIET, no_progress_similar_warn=4, no_progress_similar_halt=10))
    posts = [
        guard.record("exec", {"command": f"sleep {n} && check"}, success=True, result="pending")
        for n in range(1, 11)
    ]

    assert [post.code for post in posts] == ["ok"] * 3 + ["no_progress_similar_warn"] * 6 + [
        "no_progress_similar_halt"
    ]
    assert posts[-1].metadata == {
        "tool": "exec",
        "tool_count": 10,
        "streak": 1,
        "similar": 10,
        "threshold": 10,
    }
    assert guard.get_stats().similar == 10
    # The next reworded call is stopped before it runs.
    assert guard.check("exec", {"command": "sleep 11 && check"}).action is HALT


def test_issue20_a_count_block_of_a_reworded_call_escalates_when_retried_reworded() -> None:
    guard = LoopGuard()
    actions = []
    for n in range(1, 8):
        decision = guard.check("exec", {"command": f"make deploy RETRY={n}"})
        actions.append(decision.action)
        if decision.action in (ALLOW, WARN):
            guard.record("exec", {"command": f"make deploy RETRY={n}"}, success=True, result="")

    assert actions == [ALLOW, ALLOW, WARN, WARN, BLOCK, BLOCK, HALT]


TEN_FILES = [f"src/pkg/module_{name}.py" for name in "abcdefghij"]
PROGRESSING_AGENTS: dict[str, tuple[str, Callable[[int], object], Callable[[int], object]]] = {
    "ten-writes-answering-ok": (
        "write_file",
        lambda n: {"path": TEN_FILES[n - 1], "content": "from __future__ import annotations\n"},
        lambda _n: "ok",
    ),
    "ten-edits-answering-ok": (
        "edit_file",
        lambda n: {"file_path": f"docs/{'abcdefghij'[n - 1]}.md", "old": "teh", "new": "the"},
        lambda _n: {"ok": True},
    ),
    "ten-shell-writes-answering-nothing": (
        "exec",
        lambda n: {"command": f"cp template.txt out/{'abcdefghij'[n - 1]}.txt"},
        lambda _n: "",
    ),
    "ten-sends-to-ten-sessions": (
        "sessions_send",
        lambda n: {"sessionKey": f"agent:peer-{'abcdefghij'[n - 1]}:main", "message": "Ping"},
        lambda _n: {"ok": True, "messageId": 100},
    ),
    "ten-reads": (
        "read_file",
        lambda n: {"path": TEN_FILES[n - 1]},
        lambda n: f"def f{n}() -> int:\n    return {n}\n",
    ),
    "ten-short-commands-naming-targets": (
        "exec",
        lambda n: {"command": f"docker restart {['web', 'db', 'cache', 'queue', 'mail'][n % 5]}"},
        lambda _n: "",
    ),
}


@pytest.mark.parametrize(
    ("tool", "args_of", "result_of"),
    PROGRESSING_AGENTS.values(),
    ids=PROGRESSING_AGENTS.keys(),
)
def test_issue20_ten_calls_on_ten_different_targets_are_never_stopped(
    tool: str, args_of: Callable[[int], object], result_of: Callable[[int], object]
) -> None:
    turn = calls_until_halt(LoopGuard(), tool, args_of, result_of, calls=10)

    assert turn.halted_at is None
    assert turn.runs == 10
    assert never_stopped(turn.decisions)
    assert not any(d.code.startswith("no_progress") for d in turn.decisions)


@pytest.mark.parametrize("end", ["another tool", "mark_progress", "changed result"])
def test_issue20_another_tool_progress_or_a_new_result_ends_the_similar_run(end: str) -> None:
    guard = LoopGuard(QUIET)
    for n in range(5):
        guard.record("exec", {"command": f"make test SEED={n}"}, success=True, result="1 failed")
    if end == "another tool":
        guard.record("read_file", {"path": "Makefile"}, success=True, result="test:")
    elif end == "mark_progress":
        guard.mark_progress("fixed the test")
    guard.record(
        "exec",
        {"command": "make test SEED=9"},
        success=True,
        result="0 failed" if end == "changed result" else "1 failed",
    )

    assert guard.get_stats().similar == 1


def test_issue20_similar_thresholds_are_config_fields() -> None:
    config = LoopGuardConfig()
    assert (config.no_progress_similar_warn, config.no_progress_similar_halt) == (4, 10)
    assert (
        LoopGuardConfig.from_dict({"no_progress_similar_halt": "12"}).no_progress_similar_halt == 12
    )
    with pytest.raises(ValueError, match="no_progress_similar_halt must be at least"):
        LoopGuardConfig(no_progress_similar_warn=5, no_progress_similar_halt=4)
    for bad in (0, -1, True, 1e308, "many", "4\x00", "9" * 5_000):
        with pytest.raises(ValueError, match="no_progress_similar_warn"):
            LoopGuardConfig.from_dict({"no_progress_similar_warn": bad})
    assert LoopGuard().get_stats()["config"]["no_progress_similar_warn"] == 4  # type: ignore[index]


def test_issue20_hostile_arguments_and_results_stay_bounded_and_never_crash() -> None:
    guard = LoopGuard(QUIET)
    huge = "x " * 500_000
    deep: object = "leaf"
    for _ in range(5_000):
        deep = [deep]
    samples: list[tuple[object, object]] = [
        ({"command": huge + "1"}, "[" * 100_000),
        ({"command": huge + "2"}, "[" * 100_000),
        ({str(k): k for k in range(10_000)}, {"id": 1}),
        ({str(k): k + 1 for k in range(10_000)}, {"id": 2}),
        ({"command": "ls\x00\x1b[31m", "n": 1e308}, json.dumps({"id": 1, "text": "\u202e"})),
        ({"command": "ls\x00\x1b[31m", "n": -1e308}, json.dumps({"id": 2, "text": "\u202e"})),
        ({"command": "ls", "nested": deep}, '{"id": ' + "[" * 50_000),
        ({"command": "ls", "nested": deep}, {"messageΙd": 1}),  # a Greek Iota: not an id
    ]
    for args, result in samples:
        guard.check("exec", args)
        guard.record("exec", args, success=True, result=result)
    assert guard.get_stats().tool_counts == {"exec": len(samples)}


@settings(max_examples=80, deadline=None)
@given(
    tool=st.sampled_from(["exec", "write_file", "sessions_send", "search_docs", "send_message"]),
    counters=st.lists(st.integers(-(10**6), 10**6), min_size=60, max_size=60),
    flags=st.lists(st.sampled_from([True, False, None]), min_size=60, max_size=60),
    result=st.sampled_from(["ok", "", "exit 1", '{"ok": true}', "no results"]),
)
def test_issue20_a_loop_changing_only_counters_and_flags_always_halts_by_call_12(
    tool: str, counters: list[int], flags: list[bool | None], result: str
) -> None:
    def args_of(n: int) -> dict[str, object]:
        return {"target": "ci", "text": f"retry {counters[n - 1]}", "force": flags[n - 1]}

    turn = calls_until_halt(LoopGuard(), tool, args_of, lambda _n: result)

    assert turn.halted_at is not None
    assert turn.halted_at <= 12


@settings(max_examples=80, deadline=None)
@given(
    tool=st.sampled_from(["exec", "write_file", "sessions_send", "read_file", "send_message"]),
    targets=st.lists(
        st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1),
        min_size=10,
        max_size=10,
        unique=True,
    ),
    key=st.sampled_from(["path", "file_path", "sessionKey", "to", "url", "chat_id"]),
    counters=st.lists(st.integers(), min_size=10, max_size=10),
    result=st.sampled_from(["ok", "", {"ok": True}, {"ok": True, "messageId": 5}]),
)
def test_issue20_ten_calls_on_ten_targets_are_never_blocked_or_halted(
    *, tool: str, targets: list[str], key: str, counters: list[int], result: object
) -> None:
    def args_of(n: int) -> dict[str, object]:
        return {key: targets[n - 1], "content": f"version {counters[n - 1]}"}

    turn = calls_until_halt(LoopGuard(), tool, args_of, lambda _n: result, calls=10)

    assert turn.runs == 10
    assert never_stopped(turn.decisions)
