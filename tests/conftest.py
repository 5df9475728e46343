"""Fixtures shared across the tree: loopback-only networking, and a real redis-server.

Every test runs with outbound connections limited to loopback (127.0.0.0/8, ::1,
`localhost`) and Unix sockets: a test that would reach the network by accident fails at
once with `NetworkForbidden`, naming the address, instead of waiting on a timeout.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes.redis_cluster import RedisCluster, SentinelPair, running_cluster, running_sentinel
from tests.fakes.redis_server import RedisServer, RedisServerMissing
from tests.network_guard import guarded_connect, guarded_connect_ex

pytest_plugins = ["tests.browser.plugin"]


@pytest.fixture(autouse=True)
def _loopback_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Refuse every connection beyond loopback for the whole test."""
    monkeypatch.setattr(socket.socket, "connect", guarded_connect)
    monkeypatch.setattr(socket.socket, "connect_ex", guarded_connect_ex)


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


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    """A real 3-master, 3-replica Redis Cluster on loopback, shared by the whole run."""
    try:
        with running_cluster(tmp_path_factory.mktemp("redis-cluster")) as cluster:
            yield cluster
    except RedisServerMissing as exc:
        pytest.fail(str(exc))


@pytest.fixture(scope="session")
def redis_sentinel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SentinelPair]:
    """A real master, replica and Sentinel on loopback, shared by the whole run."""
    try:
        with running_sentinel(tmp_path_factory.mktemp("redis-sentinel")) as pair:
            yield pair
    except RedisServerMissing as exc:
        pytest.fail(str(exc))
