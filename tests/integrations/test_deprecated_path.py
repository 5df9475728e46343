"""The old top-level `integrations` package (issue 22): deprecated, and still the same code."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator

import pytest

import loopwarden_integrations
from loopwarden_integrations import room_guard, run_guards


@pytest.fixture
def fresh_old_path() -> Iterator[None]:
    """`integrations` not imported yet, as in a new process; forgotten again afterwards."""

    def forget() -> None:
        old = [n for n in sys.modules if n == "integrations" or n.startswith("integrations.")]
        for name in old:
            del sys.modules[name]

    forget()
    yield
    forget()


@pytest.mark.usefixtures("fresh_old_path")
def test_issue22_the_old_import_path_warns_and_gives_the_same_objects() -> None:
    with pytest.warns(DeprecationWarning, match="import loopwarden_integrations instead"):
        old = importlib.import_module("integrations")
    assert old.RoomGuard is loopwarden_integrations.RoomGuard
    assert old.Decision is loopwarden_integrations.Decision
    assert old.RoomGuardError is loopwarden_integrations.RoomGuardError
    # An adapter module through the old path is the module itself, not a copy.
    assert importlib.import_module("integrations.room_guard") is room_guard
    assert importlib.import_module("integrations.run_guards") is run_guards
    from integrations.room_guard import RoomGuard

    assert RoomGuard is room_guard.RoomGuard


@pytest.mark.usefixtures("fresh_old_path")
def test_issue22_importing_an_adapter_by_the_old_path_warns_too() -> None:
    with pytest.warns(DeprecationWarning, match="'integrations' package is deprecated"):
        adapter = importlib.import_module("integrations.run_guards")
    assert adapter is run_guards
