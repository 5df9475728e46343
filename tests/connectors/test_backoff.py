"""Backoff: the one reconnect policy of the connectors (doubling, capped, reset)."""

from __future__ import annotations

from gateway.app.backoff import Backoff


async def test_issue10_waits_double_up_to_the_cap_and_start_over_after_a_reset() -> None:
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    backoff = Backoff(0.5, 3.0, sleep=sleep)
    for _ in range(5):
        await backoff.wait()
    assert slept == [0.5, 1.0, 2.0, 3.0, 3.0]
    backoff.reset()
    assert backoff.delay == 0.5
    await backoff.wait()
    assert slept[-1] == 0.5
