"""The serving commands' event loop: uvloop when installed, `--loop` to choose (issue 10)."""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
from pathlib import Path

import pytest

from gateway.app import eventloop
from gateway.cli.main import main


async def loop_module() -> str:
    module = type(asyncio.get_running_loop()).__module__
    assert module.startswith(eventloop.running())  # the start-up lines name the loop right
    return module


def test_issue10_auto_runs_on_uvloop_when_installed() -> None:
    assert eventloop.loop_name() == "uvloop"
    assert eventloop.run(loop_module()).startswith("uvloop")


def test_issue10_asyncio_can_be_chosen() -> None:
    assert eventloop.loop_name("asyncio") == "asyncio"
    assert eventloop.run(loop_module(), choice="asyncio").startswith("asyncio")


@pytest.fixture
def without_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    """This interpreter as if uvloop were not installed."""
    find_spec = importlib.util.find_spec

    def hide(name: str, package: str | None = None) -> object:
        return None if name == "uvloop" else find_spec(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", hide)


@pytest.mark.usefixtures("without_uvloop")
def test_issue10_without_uvloop_auto_falls_back_and_uvloop_is_refused() -> None:
    assert eventloop.loop_name() == "asyncio"
    assert eventloop.run(loop_module()).startswith("asyncio")
    pending = loop_module()
    with pytest.raises(eventloop.LoopUnavailableError, match="uvloop is not installed"):
        eventloop.run(pending, choice="uvloop")
    # Closed, not left un-awaited (pytest turns that warning into an error).
    assert inspect.getcoroutinestate(pending) == inspect.CORO_CLOSED


@pytest.mark.usefixtures("without_uvloop", "restore_logging")
def test_issue10_loop_uvloop_without_uvloop_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "loopwarden.yaml"
    path.write_text("agents: {p: {kind: scripted}}\n", encoding="utf-8")
    assert main(["run", "--config", str(path), "--loop", "uvloop"]) == 2
    assert "--loop uvloop: uvloop is not installed" in capsys.readouterr().err


def test_issue10_an_unknown_loop_is_refused_naming_the_choices(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["proxy", "--config", "x.yaml", "--loop", "uvloop\u200b"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert "argument --loop: invalid choice: 'uvloop\\u200b'" in err
    assert "(choose from 'auto', 'asyncio', 'uvloop')" in err
