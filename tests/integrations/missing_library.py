"""Import an integration as if the library it adapts were not installed."""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

import pytest


def import_without(monkeypatch: pytest.MonkeyPatch, adapter: str, package: str) -> ModuleType:
    """Import `adapter` afresh while `package` (and its submodules) cannot be imported."""
    for name in [m for m in sys.modules if m == package or m.startswith(f"{package}.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, package, None)
    # Set, then delete: monkeypatch then puts the adapter already imported back afterwards.
    monkeypatch.setitem(sys.modules, adapter, None)
    monkeypatch.delitem(sys.modules, adapter)
    return importlib.import_module(adapter)
