"""Build the configured StateStore, importing a backend only when it is chosen.

The sqlite and redis backends live in their own modules (`gateway.state.sqlite`,
`gateway.state.redis`) and redis needs the `[redis]` extra, so they are imported by name
here: a missing backend or extra is a `ConfigError` on `state.backend`, raised before
anything connects, rather than an ImportError at start-up of every installation.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType
from typing import cast

from gateway.app.errors import ConfigError
from gateway.config.state import StateConfig
from gateway.state.base import StateStore
from gateway.state.memory import MemoryStateStore
from gateway.state.timed import OperationObserver, time_operations

_BACKEND_EXTRAS = {"redis": "redis"}


def build_state(
    config: StateConfig,
    *,
    clock: Callable[[], float] | None = None,
    metrics: OperationObserver | None = None,
) -> StateStore:
    """The StateStore for `config.backend`; `clock`, when given, drives its time (any backend).

    `loopwarden_integrations.RoomGuard(clock=...)` relies on it: a guard on sqlite or Redis
    decides on the injected clock, as one on memory does. With `metrics` every operation
    of a sqlite or Redis store is timed into it (`gateway.state.timed`); the memory
    backend's are not: they are dict steps of a fraction of a microsecond, which the
    timing would double (about 10 µs per pipeline message, a fifth of its cost).
    """
    store = _build(config, clock)
    if metrics is not None and config.backend != "memory":
        time_operations(store, metrics, backend=config.backend)
    return store


def _build(config: StateConfig, clock: Callable[[], float] | None) -> StateStore:
    """The backend's store, untimed."""
    if config.backend == "memory":
        return MemoryStateStore(clock=clock, max_transcript_bytes=config.max_transcript_bytes)
    module = _backend_module(config.backend)
    timed = {} if clock is None else {"clock": clock}
    if config.backend == "sqlite":
        return cast(StateStore, module.SqliteStateStore(config.path, **timed))
    return cast(
        StateStore,
        module.RedisStateStore(
            config.url.get_secret_value(),
            on_error=config.on_error,
            key_prefix=config.key_prefix,
            topology=importlib.import_module("gateway.state.redis_link").RedisTopology.of(config),
            **timed,
        ),
    )


def require_backend(config: StateConfig) -> None:
    """Check that the configured backend (and its extra) can be imported, without building it."""
    if config.backend != "memory":
        _backend_module(config.backend)


def _backend_module(backend: str) -> ModuleType:
    """Import `gateway.state.<backend>`, turning a missing module or extra into a ConfigError."""
    module_name = f"gateway.state.{backend}"
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            raise ConfigError(
                "state.backend", f"the {backend} backend is not part of this installation"
            ) from None
        extra = _BACKEND_EXTRAS.get(backend)
        fix = f"pip install 'loopwarden[{extra}]'" if extra else f"install {exc.name}"
        raise ConfigError(
            "state.backend", f"the {backend} backend needs the {exc.name} package: {fix}"
        ) from None
