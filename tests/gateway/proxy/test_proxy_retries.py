"""A quick retry of a refused call gets the first refusal's answer (issue 9)."""

from __future__ import annotations

from gateway.proxy.retries import FirstRefusals
from guards.call_loop import CallCode, CallDecision


class Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


def refusal(code: CallCode, retry_after: float = 300.0, message: str = "") -> CallDecision:
    return CallDecision(
        allowed=False,
        code=code,
        retry_after=retry_after,
        count=6,
        circuit="bot/session=s",
        message=message or code,
    )


def test_issue9_a_retry_within_the_window_repeats_the_first_refusal() -> None:
    clock = Clock()
    first = refusal("loop_detected", message="6 identical calls")
    kept = FirstRefusals(keep=10.0, clock=clock)
    assert kept.answer("c", "fp", first) is first
    clock.now += 9.5
    again = kept.answer("c", "fp", refusal("loop_paused", retry_after=290.5))
    assert (again.code, again.message, again.retry_after) == (
        "loop_detected",
        "6 identical calls",
        290.5,
    )
    other = refusal("loop_paused")
    assert kept.answer("c", "another call", other) is other
    assert kept.answer("another circuit", "fp", other) is other
    clock.now += 0.5
    assert kept.answer("c", "fp", other) is other


def test_issue9_what_is_kept_is_bounded() -> None:
    clock = Clock()
    kept = FirstRefusals(keep=10.0, limit=3, clock=clock)
    for number in range(5):
        kept.answer("c", f"fp{number}", refusal("loop_detected"))
    paused = refusal("loop_paused")
    assert kept.answer("c", "fp0", paused) is paused
    assert kept.answer("c", "fp1", paused) is paused
    assert [kept.answer("c", f"fp{n}", paused).code for n in (2, 3, 4)] == ["loop_detected"] * 3
