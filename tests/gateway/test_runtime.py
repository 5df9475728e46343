"""The Gateway runtime: turns through the pipeline, readiness, connector retries, draining."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

import connectors
from gateway.app.errors import ConfigError, GatewayStopping
from gateway.app.runtime import Gateway, load_connector_factory
from gateway.app.types import Reply
from tests.gateway.runtime_helpers import (
    FakePlatform,
    gateway_for,
    human,
    make_config,
    shadow_package,
)

TWO_BOTS = """
http: {port: 0}
agents: {parrot: {kind: scripted, default: 'echo: {text}'}}
bots:
  - {id: bot-a, platform: room, agent: parrot}
  - {id: bot-b, platform: room, agent: parrot}
"""


async def test_a_message_runs_through_the_pipeline_and_the_reply_is_sent() -> None:
    platform = FakePlatform()
    gateway = gateway_for(make_config(), platform)
    await gateway.start()
    try:
        connector = platform.made["bot-a"]
        reply = await connector.push(human("hello"))
        assert isinstance(reply, Reply)
        assert [(channel, sent.text) for channel, sent in connector.sent] == [
            ("lobby", "echo: hello")
        ]
    finally:
        await gateway.stop(1.0)
    assert connector.closed


async def test_ready_once_every_bot_is_connected_and_not_while_stopping() -> None:
    platform = FakePlatform()
    gateway = gateway_for(make_config(text=TWO_BOTS), platform)
    assert not gateway.ready
    await gateway.start()
    assert gateway.ready
    platform.made["bot-b"].is_connected = False
    assert not gateway.ready
    assert gateway.readiness().not_connected == ("bot-b",)
    platform.made["bot-b"].is_connected = True
    assert gateway.ready
    await gateway.stop(1.0)
    assert not gateway.ready
    assert gateway.readiness().stopping


async def test_a_connector_that_fails_to_start_is_retried_in_the_background(
    caplog: pytest.LogCaptureFixture,
) -> None:
    platform = FakePlatform(failures=2)
    gateway = gateway_for(make_config(), platform)
    await gateway.start()
    try:
        connector = platform.made["bot-a"]
        assert not gateway.ready
        await asyncio.wait_for(connector.up.wait(), 10)
        assert connector.start_calls == 3
        assert gateway.ready
    finally:
        await gateway.stop(1.0)
    failures = [r for r in caplog.records if "failed to connect" in r.getMessage()]
    assert len(failures) == 2
    assert "ConnectorError" in failures[0].getMessage()
    assert failures[0].exc_info is None


async def test_a_stalled_start_times_out_and_is_retried() -> None:
    hold = asyncio.Event()
    platform = FakePlatform(hold_start=hold)
    gateway = Gateway(
        make_config(), connector_factory=platform, connect_timeout=0.05, start_backoff=(0.01, 0.01)
    )
    await gateway.start()
    try:
        connector = platform.made["bot-a"]
        assert not gateway.ready
        hold.set()
        await asyncio.wait_for(connector.up.wait(), 10)
        assert gateway.ready
    finally:
        await gateway.stop(1.0)


async def test_stop_drains_a_turn_in_flight_and_refuses_new_messages() -> None:
    release = asyncio.Event()
    platform = FakePlatform(hold_send=release)
    gateway = gateway_for(make_config(), platform)
    await gateway.start()
    connector = platform.made["bot-a"]
    turn = asyncio.create_task(connector.push(human("slow")))
    await connector.sending.wait()
    stopping = asyncio.create_task(gateway.stop(30.0))
    await asyncio.sleep(0)
    with pytest.raises(GatewayStopping):
        await connector.push(human("late"))
    assert not stopping.done()
    release.set()
    await stopping
    assert isinstance(await turn, Reply)
    assert [sent.text for _, sent in connector.sent] == ["echo: slow"]
    assert connector.closed


async def test_stop_cancels_turns_that_outlive_the_drain() -> None:
    platform = FakePlatform(hold_send=asyncio.Event())
    gateway = gateway_for(make_config(), platform)
    await gateway.start()
    connector = platform.made["bot-a"]
    turn = asyncio.create_task(connector.push(human("stuck")))
    await connector.sending.wait()
    await gateway.stop(0.2)
    assert connector.sent == []
    assert connector.closed
    with pytest.raises(asyncio.CancelledError):
        await turn


async def test_stop_is_safe_before_start_and_twice() -> None:
    gateway = gateway_for(make_config(), FakePlatform())
    await gateway.stop(0.1)
    await gateway.stop(0.1)


async def test_message_for_an_unknown_bot_is_dropped(caplog: pytest.LogCaptureFixture) -> None:
    platform = FakePlatform()
    gateway = gateway_for(make_config(), platform)
    await gateway.start()
    try:
        with caplog.at_level(logging.WARNING):
            assert await platform.made["bot-a"].push(human("hi", bot_id="ghost")) is None
        assert "unknown bot 'ghost'" in caplog.text
    finally:
        await gateway.stop(1.0)


def test_unknown_platform_module_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="no connector for platform 'nowhere'") as caught:
        load_connector_factory("nowhere", field="bots.3.platform")
    assert caught.value.path == "bots.3.platform"


def test_missing_platform_sdk_names_the_extra_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A connector whose SDK is absent: ConfigError on bots.N.platform with the pip extra."""
    shadow_package(connectors, "slack", "import lw_absent_slack_sdk\n", tmp_path, monkeypatch)
    config = make_config(
        text="agents: {p: {kind: scripted}}\nbots:\n  - {id: r, platform: room, agent: p}\n"
        "  - {id: s, platform: slack, bot_token: x, signing_secret: y, agent: p}\n"
    )
    with pytest.raises(ConfigError) as caught:
        Gateway(config, connector_factory=None)
    assert caught.value.path == "bots.1.platform"
    assert "pip install 'loopwarden[slack]'" in caught.value.reason
    assert "lw_absent_slack_sdk" in caught.value.reason


def test_default_factory_imports_the_platform_package() -> None:
    factory = load_connector_factory("room", field="bots.0.platform")
    assert factory.__module__.startswith("connectors.room")
