"""build_state: memory by default; sqlite and redis imported by name, missing ones reported."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import gateway.state
from gateway.app.errors import ConfigError
from gateway.config import StateConfig
from gateway.state.factory import build_state, require_backend
from gateway.state.memory import MemoryStateStore
from gateway.state.redis_link import RedisTopology

STAND_IN = """
class SqliteStateStore:
    def __init__(self, path):
        self.path = path

class RedisStateStore:
    def __init__(self, url, *, on_error, key_prefix, topology):
        self.args = (url, on_error, key_prefix, topology)
"""


def stand_in(name: str, body: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make `gateway.state.<name>` a module with `body`, for this test only."""
    (tmp_path / f"{name}.py").write_text(body, encoding="utf-8")
    monkeypatch.setattr(gateway.state, "__path__", [str(tmp_path), *gateway.state.__path__])
    # Set, then delete: monkeypatch then also removes what the import leaves behind.
    monkeypatch.setitem(sys.modules, f"gateway.state.{name}", None)
    monkeypatch.delitem(sys.modules, f"gateway.state.{name}")
    monkeypatch.setattr(gateway.state, name, None, raising=False)
    monkeypatch.delattr(gateway.state, name)


async def test_memory_is_the_default_and_uses_the_clock() -> None:
    now = [100.0]
    store = build_state(StateConfig(), clock=lambda: now[0])
    assert isinstance(store, MemoryStateStore)
    await store.pause("room:a", 10)
    now[0] += 4
    assert await store.pause_remaining("room:a") == pytest.approx(6)


@pytest.mark.parametrize("backend", ["sqlite", "redis"])
def test_backends_are_built_from_their_module(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stand_in(backend, STAND_IN, tmp_path, monkeypatch)
    config = StateConfig.model_validate(
        {"backend": backend, "path": "/var/lw.db", "url": "redis://r:6379/1", "on_error": "deny"}
    )
    store = build_state(config)
    if backend == "sqlite":
        assert vars(store) == {"path": "/var/lw.db"}
    else:
        assert vars(store) == {"args": ("redis://r:6379/1", "deny", "lw:", RedisTopology())}


def test_a_backend_missing_from_the_installation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "gateway.state.sqlite", None)
    with pytest.raises(ConfigError, match="not part of this installation") as caught:
        build_state(StateConfig(backend="sqlite"))
    assert caught.value.path == "state.backend"


def test_a_backend_whose_extra_is_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stand_in("redis", "import lw_absent_redis_client\n", tmp_path, monkeypatch)
    with pytest.raises(ConfigError) as caught:
        require_backend(StateConfig(backend="redis"))
    assert caught.value.path == "state.backend"
    assert "pip install 'loopwarden[redis]'" in caught.value.reason
    require_backend(StateConfig())
