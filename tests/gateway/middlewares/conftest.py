"""Fixtures the stage tests share: a started state store of each backend on a fake clock."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.state.base import StateStore
from tests.fakes.inmemory import FakeClock
from tests.gateway.state.test_state_conformance import build_store

BACKENDS = ["memory", "sqlite", pytest.param("redis", marks=pytest.mark.redis)]


@pytest.fixture(params=BACKENDS)
async def backend(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[tuple[StateStore, FakeClock]]:
    """A started store of each backend on the clock the rig will use."""
    name: str = request.param
    url = request.getfixturevalue("redis_url") if name == "redis" else None
    clock = FakeClock()
    store = build_store(name, clock, workdir=tmp_path, redis_url=url)
    await store.start()
    try:
        yield store, clock
    finally:
        await store.aclose()
