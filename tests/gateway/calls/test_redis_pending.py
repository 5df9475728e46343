"""The writes kept for Redis (issue 24): their bound, their order, the charge ids' floor.

Unit tests of gateway.calls.redis_pending (no Redis: the store's use of it is tested
against real servers in test_budget_durability.py).
"""

from __future__ import annotations

import logging

import pytest

from gateway.calls.redis_pending import ChargeIds, PendingWrite, PendingWrites

log = logging.getLogger("test.pending")


def batch(entries: int, name: str = "log") -> PendingWrite:
    return PendingWrite("log", (name,), (), entries)


def test_issue24_kept_writes_come_back_oldest_first_and_are_bounded(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger=log.name)
    pending = PendingWrites(log, limit=5)
    assert pending.keep(batch(2, "a"))
    assert pending.keep(PendingWrite("charge", ("b",), (), charge=7))
    assert pending.keep(batch(2, "c"))
    assert pending.entries == 5
    assert not pending.keep(batch(1, "d"))  # the bound: dropped and counted
    assert not pending.keep(batch(3, "e"))
    assert pending.dropped == 4
    warnings = [record.getMessage() for record in caplog.records]
    assert len(warnings) == 2  # one when the first write was kept, one when one was dropped
    assert "up to 5 entries" in warnings[0]
    assert "later ones are dropped" in warnings[1]

    order = []
    while (write := pending.first()) is not None:
        order.append(write.keys[0])
        pending.done()
    assert order == ["a", "b", "c"]
    assert pending.entries == 0
    # A new outage warns afresh.
    assert pending.keep(batch(1))
    assert len(caplog.records) == 3


def test_issue24_the_floor_is_the_lowest_charge_without_an_answer() -> None:
    ids = ChargeIds()
    assert ids.floor() == 1  # none given: the next one
    first, second, third = ids.new(), ids.new(), ids.new()
    assert (first, second, third) == (1, 2, 3)
    assert ids.floor() == 1
    ids.answered(second)
    assert ids.floor() == 1  # the first still waits (kept for Redis, say)
    ids.answered(first)
    assert ids.floor() == 3
    ids.answered(third)
    ids.answered(third)  # answered twice changes nothing
    assert ids.floor() == 4
