"""Fixtures shared across the tree: a real redis-server of the test's (or module's) own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes.redis_server import RedisServer, RedisServerMissing


def _start(directory: Path) -> RedisServer:
    """A redis-server in `directory`; a missing binary fails the test (CI installs it)."""
    try:
        return RedisServer(directory)
    except RedisServerMissing as exc:
        pytest.fail(str(exc))


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of this test's own, which the test may stop and start again."""
    with _start(tmp_path / "redis") as server:
        yield server


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real redis-server for this module (each store gets its own key prefix)."""
    with _start(tmp_path_factory.mktemp("redis")) as server:
        yield server.url
