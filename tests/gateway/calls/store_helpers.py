"""Started call stores of every backend on one settable clock, for the suites over all three.

The `clock` and `make` fixtures (tests/gateway/calls/conftest.py) are built from these.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Protocol

import pytest

from gateway.calls.redis_store import RedisCallStore
from gateway.calls.sqlite_store import SqliteCallStore
from gateway.calls.store import LOG_KEEP, CallStore, MemoryCallStore
from gateway.state.redis_link import RedisTopology
from guards.call_loop import CallLoopPolicy, UniquenessRule, fingerprint_call

BACKENDS = [
    "memory",
    "sqlite",
    pytest.param("redis", marks=pytest.mark.redis),
    pytest.param("redis-cluster", marks=pytest.mark.redis),
]
"""The params of the `make` fixture (conftest.py): one run of each case per backend."""
START = 1_800_000_000.0  # 2027-01-15 08:00 UTC, on an hour
"""The `clock` fixture's start (conftest.py), unless a module's own `clock` says otherwise."""

_numbers = itertools.count()


class Clock:
    """A settable clock shared by the stores under test and the test."""

    def __init__(self, start: float) -> None:
        self.start = start
        self.now = start

    def __call__(self) -> float:
        return self.now

    def at(self, offset: float) -> None:
        """Set the time to the start plus `offset` seconds."""
        self.now = self.start + offset


class MakeStore(Protocol):
    async def __call__(
        self,
        policy: CallLoopPolicy | None = None,
        rules: Iterable[UniquenessRule] = (),
        *,
        log_keep: int = LOG_KEEP,
    ) -> CallStore: ...


class Stores:
    """Builds started stores of the fixture's backend, each on its own file or key prefix."""

    def __init__(self, request: pytest.FixtureRequest, clock: Clock, tmp_path: Path) -> None:
        self._backend: str = request.param
        self._url: str | None = None
        if self._backend == "redis":
            self._url = request.getfixturevalue("redis_url")
        elif self._backend == "redis-cluster":
            self._url = request.getfixturevalue("redis_cluster").url
        self._clock = clock
        self._tmp_path = tmp_path
        self._built: list[CallStore] = []

    async def make(
        self,
        policy: CallLoopPolicy | None = None,
        rules: Iterable[UniquenessRule] = (),
        *,
        log_keep: int = LOG_KEEP,
    ) -> CallStore:
        """A started store on the test's clock, sharing nothing with the others."""
        clock, number = self._clock, next(_numbers)
        store: CallStore
        if self._backend == "memory":
            store = MemoryCallStore(policy, rules, clock=clock, wall_clock=clock, log_keep=log_keep)
        elif self._backend == "sqlite":
            path = self._tmp_path / f"calls-{number}.sqlite3"
            store = SqliteCallStore(
                path, policy, rules, clock=clock, wall_clock=clock, log_keep=log_keep
            )
        else:
            assert self._url is not None
            store = RedisCallStore(
                self._url,
                policy,
                rules,
                key_prefix=f"calls{number}:",
                topology=RedisTopology(cluster=self._backend == "redis-cluster"),
                clock=clock,
                wall_clock=clock,
                log_keep=log_keep,
            )
        await store.start()
        self._built.append(store)
        return store

    async def aclose(self) -> None:
        """Close every store built."""
        for store in self._built:
            await store.aclose()


def fingerprint(n: int) -> str:
    """The fingerprint of the n-th distinct question to one model."""
    return fingerprint_call("gpt-4o-mini", [{"role": "user", "content": f"question {n}"}])


@asynccontextmanager
async def redis_replicas(
    redis_url: str, clock: Clock, prefix: str
) -> AsyncIterator[list[RedisCallStore]]:
    """Two started redis stores on one key prefix, as two replicas of one proxy; closed after."""
    replicas = [
        RedisCallStore(redis_url, key_prefix=prefix, clock=clock, wall_clock=clock)
        for _ in range(2)
    ]
    for replica in replicas:
        await replica.start()
    try:
        yield replicas
    finally:
        for replica in replicas:
            await replica.aclose()
