"""Fixtures of the gateway's tests."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """The CLI installs a root handler on the captured stderr: take it away afterwards."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
