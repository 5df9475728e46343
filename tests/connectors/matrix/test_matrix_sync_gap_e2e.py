"""Sync gaps on a real Synapse (issue 23): a `limited` timeline is paged back with `/messages`.

The Matrix connector is given a small timeline limit (5) so that a dozen messages sent
while the gateway is stopped make the restart's first sync `limited`: only the newest five
come in the sync, the rest must be paged back from its `prev_batch` to the saved position.
The state is sqlite, so the position survives the restart as in production.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from connectors.matrix import MatrixConnector
from gateway.app.connector import Connector, ConnectorServices
from gateway.app.runtime import Gateway
from gateway.config import BotConfig, MatrixBotConfig, load_config
from tests.connectors.connector_helpers import wait_for
from tests.connectors.matrix.rooms import (
    answered,
    new_room,
    posted_by,
    say,
    sqlite_state,
    until,
    write_config,
)
from tests.fakes.synapse_server import SynapseClient, SynapseServer

TIMELINE = 5
"""Events a sync brings per room in these tests (the connector's default is 1,000)."""
MISSED = tuple(f"while down {n}" for n in range(12))
"""Sent while the gateway is stopped: more than two timelines' worth."""


@asynccontextmanager
async def running_matrix(path: Path, *, gap_pages: int = 10) -> AsyncIterator[Gateway]:
    """The gateway of a config file, its Matrix connectors syncing `TIMELINE` events a room."""

    def connector(bot: BotConfig, services: ConnectorServices) -> Connector:
        assert isinstance(bot, MatrixBotConfig)
        return MatrixConnector(bot, services, timeline_limit=TIMELINE, gap_pages=gap_pages)

    config = load_config(path)
    gateway = Gateway(config, connector_factory=connector)
    await gateway.start()
    try:
        await wait_for(lambda: gateway.ready)
        yield gateway
    finally:
        await gateway.stop(config.pipeline.drain_seconds)


async def test_issue23_a_sync_gap_is_paged_back_and_each_missed_message_answered_once(
    tmp_path: Path, synapse_server: SynapseServer, synapse: SynapseClient
) -> None:
    room = await new_room(synapse, bots=1)
    bot = room.bots[0].user_id
    config = write_config(tmp_path, synapse_server, room, state=sqlite_state(tmp_path))
    async with running_matrix(config):
        await say(synapse, room, room.alice, "warm up")
        await until(synapse, room, answered(bot, ("warm up",)))
    for text in MISSED:
        await say(synapse, room, room.alice, text)
    async with running_matrix(config) as gateway:
        await say(synapse, room, room.alice, "after")
        seen = await until(synapse, room, answered(bot, (*MISSED, "after")))
        handed_over = gateway.metrics.value("messages_in_total", platform="matrix")
        gaps = gateway.metrics.value("events_dropped_total", platform="matrix", reason="sync_gap")

    assert posted_by(seen, bot) == [f"echo: {t}" for t in ("warm up", *MISSED, "after")]
    assert handed_over == len(MISSED) + 1  # each missed message reached the pipeline once
    assert gaps == 0


async def test_issue23_a_gap_longer_than_the_page_bound_is_logged_counted_and_its_newest_answered(
    tmp_path: Path,
    synapse_server: SynapseServer,
    synapse: SynapseClient,
    caplog: pytest.LogCaptureFixture,
) -> None:
    room = await new_room(synapse, bots=1)
    bot = room.bots[0].user_id
    config = write_config(tmp_path, synapse_server, room, state=sqlite_state(tmp_path))
    async with running_matrix(config, gap_pages=1):
        await say(synapse, room, room.alice, "warm up")
        await until(synapse, room, answered(bot, ("warm up",)))
    for text in MISSED:
        await say(synapse, room, room.alice, text)
    # Another long-poll timeout: Synapse answers a sync identical to the first run's last
    # one (dropped at stop, finished by the first message) from its response cache.
    config.write_text(config.read_text().replace("sync_timeout: 2", "sync_timeout: 3"))
    newest = MISSED[-2 * TIMELINE :]  # the sync's timeline and the one page before it
    with caplog.at_level(logging.WARNING, logger="connectors.matrix.connector"):
        async with running_matrix(config, gap_pages=1) as gateway:
            await until(synapse, room, answered(bot, newest))
            await say(synapse, room, room.alice, "after")
            seen = await until(synapse, room, answered(bot, ("after",)))
            gaps = gateway.metrics.value(
                "events_dropped_total", platform="matrix", reason="sync_gap"
            )

    assert posted_by(seen, bot) == [f"echo: {t}" for t in ("warm up", *newest, "after")]
    assert gaps == 1
    [warning] = [r.getMessage() for r in caplog.records if "paging back" in r.getMessage()]
    assert room.room_id in warning
    assert "1 pages" in warning
