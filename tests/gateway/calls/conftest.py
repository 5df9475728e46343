"""The fixtures of the suites that run each case on every CallStore backend."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.gateway.calls.store_helpers import BACKENDS, START, Clock, MakeStore, Stores


@pytest.fixture
def clock() -> Clock:
    return Clock(START)


@pytest.fixture(params=BACKENDS)
async def make(
    request: pytest.FixtureRequest, clock: Clock, tmp_path: Path
) -> AsyncIterator[MakeStore]:
    """Builds started stores of one backend, all on the test's clock; closes them after."""
    stores = Stores(request, clock, tmp_path)
    yield stores.make
    await stores.aclose()
