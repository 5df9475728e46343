"""The draining table shared by the guards (issue 10): LRU order, sweep, cap, rebuild."""

from __future__ import annotations

import gc
import math

import pytest

from guards.lru import REBUILD_MIN, DrainingTable


def _table(cap: int = 100, frees: int = 2) -> DrainingTable[str, float]:
    """Entries are their own idle instants."""
    return DrainingTable(lambda idle_at: idle_at, cap=cap, frees_per_call=frees)


def test_issue10_cap_must_be_positive() -> None:
    with pytest.raises(ValueError, match="cap must be 1 or more"):
        _table(cap=0)


def test_issue10_use_makes_an_entry_the_most_recently_used() -> None:
    table = _table()
    for key in "abc":
        table.add(key, 10.0)
    assert table.use("a") == 10.0
    assert table.use("zz") is None
    assert [key for key, _ in table.items()] == ["b", "c", "a"]
    assert table.peek("b") == 10.0  # a peek keeps the order
    assert [key for key, _ in table.items()] == ["b", "c", "a"]


def test_issue10_cap_displaces_the_least_recently_used_entry() -> None:
    table = _table(cap=2)
    table.add("a", 10.0)
    table.add("b", 10.0)
    table.use("a")
    table.add("c", 10.0)
    assert [key for key, _ in table.items()] == ["a", "c"]


def test_issue10_sweep_frees_idle_front_entries_and_returns_the_last() -> None:
    table = _table()
    table.add("a", 1.0)
    table.add("b", 2.0)
    table.add("c", 50.0)
    assert table.sweep(0.5) is None
    assert table.sweep_at == 1.0  # nothing to do before the front goes idle
    assert len(table) == 3
    # a and b went idle since the last sweep: one by one, one per call.
    assert table.sweep(5.0) == 1.0
    assert table.sweep_at == -math.inf
    assert table.sweep(5.0) == 2.0
    assert table.sweep(5.0) is None
    assert table.sweep_at == 50.0
    assert [key for key, _ in table.items()] == ["c"]


def test_issue10_a_backlog_is_freed_several_per_call() -> None:
    table = _table(frees=2)
    for i in range(10):
        table.add(f"idle{i}", 1.0 + i / 100)
    table.add("live", 1000.0)
    table.sweep(0.0)
    # The first look after they went idle frees one; from then on they are a backlog
    # (idle before the previous sweep), freed two per call.
    table.sweep(10.0)
    assert len(table) == 10
    for left in (8, 6, 4, 2):
        table.sweep(10.0 + left)
        assert len(table) == left
    table.sweep(20.0)
    assert [key for key, _ in table.items()] == ["live"]


def test_issue10_discard_remove_where_and_clear() -> None:
    table = _table()
    for key in ("a1", "a2", "b1"):
        table.add(key, 10.0)
    table.discard("a1")
    table.discard("missing")
    assert table.peek("a1") is None
    assert table.remove_where(lambda key: key.startswith("a")) == 1
    assert [key for key, _ in table.items()] == ["b1"]
    table.clear()
    assert len(table) == 0
    assert table.draining is None


def test_issue10_a_shrunk_table_drains_into_a_fresh_one_in_order() -> None:
    table = _table(cap=10 * REBUILD_MIN)
    for i in range(2 * REBUILD_MIN):
        table.add(f"idle{i}", 1.0)
    live = [f"live{i}" for i in range(100)]
    for key in live:
        table.add(key, 1000.0)
    old = table.recent
    drained = False
    for _ in range(2 * REBUILD_MIN):
        table.sweep(10.0)
        drained = drained or table.draining is not None
        assert [key for key, _ in table.items() if key.startswith("live")] == live
    assert drained
    assert table.draining is None
    assert table.recent is not old  # the peak-sized arrays were let go
    assert [key for key, _ in table.items()] == live
    # While draining, an entry found in the old table moves to the new one.
    assert table.use("live0") == 1000.0
    assert [key for key, _ in table.items()][-1] == "live0"


def _has_instance_dict(table: object) -> bool:
    """Whether an OrderedDict holds an instance dict (no other dict is among its referents)."""
    return any(type(referent) is dict for referent in gc.get_referents(table))


def test_issue10_every_table_made_has_an_instance_dict_so_method_lookups_specialise() -> None:
    # CPython 3.11 leaves `recent.get(...)`-style lookups generic on an OrderedDict with
    # no instance dict: the fresh table, a cleared one and a rebuilt one all have one.
    table = _table(cap=10 * REBUILD_MIN)
    assert _has_instance_dict(table.recent)
    for i in range(2 * REBUILD_MIN):
        table.add(f"idle{i}", 1.0)
    table.add("live", 1000.0)
    fresh = table.recent
    while table.recent is fresh:
        table.sweep(10.0)
    assert _has_instance_dict(table.recent)
    table.clear()
    assert _has_instance_dict(table.recent)


def test_issue10_the_documented_inline_sweep_leaves_the_table_as_sweep_does() -> None:
    # A caller may free the front itself when it went idle since the last sweep and put
    # a new key in its place; the table is then what `sweep` and the same put would leave.
    inline, swept = _table(), _table()
    for table in (inline, swept):
        for i in range(5):
            table.add(f"k{i}", 10.0 + i)
        table.sweep(0.0)
    for n, now in enumerate((10.0, 11.5, 12.0, 13.0)):
        front_key, front = inline.recent.popitem(last=False)
        assert inline.draining is None
        assert inline.swept_at <= front <= now
        inline.swept_at, inline.sweep_at = now, -math.inf
        inline.recent[f"new{n}"] = now + 100
        assert swept.sweep(now) == front
        swept.recent[f"new{n}"] = now + 100
        assert list(inline.items()) == list(swept.items())
        assert (inline.sweep_at, inline.swept_at) == (swept.sweep_at, swept.swept_at)


def test_issue24_nothing_drains_while_a_sweep_waits() -> None:
    """A hot path that found `now < sweep_at` treats a miss in `recent` as a new key.

    That holds because a draining table keeps `sweep_at` at -inf: every call has entries
    to move. Checked after each step of a table that fills, goes idle, drains and refills.
    """
    table = _table(cap=10 * REBUILD_MIN)

    def check() -> None:
        assert table.draining is None or table.sweep_at == -math.inf

    for i in range(2 * REBUILD_MIN):
        table.add(f"idle{i}", 1.0)
        check()
    for i in range(100):
        table.add(f"live{i}", 1000.0)
        check()
    drained = False
    for i in range(2 * REBUILD_MIN):
        table.sweep(10.0 + i)
        check()
        drained = drained or table.draining is not None
        if table.draining is not None:
            table.add(f"new{i}", 2000.0)
            check()
            table.use(f"live{i % 100}")
            check()
    assert drained
    assert table.draining is None


def test_issue24_recent_get_is_the_get_of_the_table_in_use() -> None:
    """`recent_get` is bound to `recent` whenever a clear or a shrink replaces it."""
    table = _table(cap=10 * REBUILD_MIN)

    def bound_to_recent() -> bool:
        return getattr(table.recent_get, "__self__", None) is table.recent

    assert bound_to_recent()
    for i in range(2 * REBUILD_MIN):
        table.add(f"idle{i}", 1.0)
    table.add("live", 1e9)
    for i in range(2 * REBUILD_MIN):
        table.sweep(10.0 + i)
        assert bound_to_recent()
        assert table.recent_get("live") == table.peek("live") or table.draining is not None
    assert table.recent_get("live") == 1e9
    table.clear()
    assert bound_to_recent()
    assert table.recent_get("live") is None
