"""Build the CallStore of the configured state backend, importing a backend only when chosen.

The call store lives where the StateStore lives (`state:`): memory, the same SQLite file,
or the same Redis with the same key prefix. A missing extra (redis) is a `ConfigError` on
`state.backend`, raised before anything connects.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from typing import cast

from gateway.app.errors import ConfigError
from gateway.calls.store import LOG_KEEP, CallStore, MemoryCallStore
from gateway.config.state import StateConfig
from guards.call_loop import CallLoopPolicy, UniquenessRule


def build_call_store(
    state: StateConfig,
    policy: CallLoopPolicy | None = None,
    rules: Iterable[UniquenessRule] = (),
    *,
    log_keep: int = LOG_KEEP,
    clock: Callable[[], float] | None = None,
) -> CallStore:
    """The CallStore for `state.backend` enforcing `policy` and `rules`."""
    if state.backend == "memory":
        return MemoryCallStore(policy, rules, clock=clock, log_keep=log_keep)
    if state.backend == "sqlite":
        from gateway.calls.sqlite_store import SqliteCallStore

        return SqliteCallStore(state.path, policy, rules, clock=clock, log_keep=log_keep)
    try:
        module = importlib.import_module("gateway.calls.redis_store")
    except ModuleNotFoundError as exc:
        raise ConfigError(
            "state.backend",
            f"the redis backend needs the {exc.name} package: pip install 'loopwarden[redis]'",
        ) from None
    return cast(
        CallStore,
        module.RedisCallStore(
            state.url.get_secret_value(),
            policy,
            rules,
            on_error=state.on_error,
            key_prefix=state.key_prefix,
            topology=importlib.import_module("gateway.state.redis_link").RedisTopology.of(state),
            clock=clock,
            log_keep=log_keep,
            wait_replicas=state.wait_replicas,
            wait_timeout_ms=state.wait_timeout_ms,
        ),
    )
