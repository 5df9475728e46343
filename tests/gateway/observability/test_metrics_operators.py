"""What an operator asks first of the gateway's /metrics (issue 25): loops cut per room, and
the state backend's latency and errors, timed by the store the factory builds."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.app.errors import StateError
from gateway.config.state import StateConfig
from gateway.observability.metrics import MAX_ROOMS, OTHER, Metrics
from gateway.state.factory import build_state
from gateway.state.timed import OPERATIONS
from tests.fakes.inmemory import InMemoryRoom, PipelineRig, rig_config

ROOM = "room:C1"


async def test_issue25_a_bot_loop_cut_is_counted_in_its_room() -> None:
    rig = PipelineRig(rig_config("", bots=("parrot", "echo")))
    await rig.start()
    room = InMemoryRoom(rig)
    await room.post("hi bots")
    await room.run(max_posts=40)
    metrics = rig.metrics
    cut = metrics.value("loops_cut_total", guard="bot_loop", room=ROOM)
    assert cut >= 1
    assert cut == metrics.value("refusals_total", stage="bot_loop")


def test_issue25_rooms_past_the_bound_are_counted_as_other() -> None:
    metrics = Metrics()
    for index in range(MAX_ROOMS + 3):
        metrics.loop_cut("bot_loop", f"room:{index}")
    metrics.loop_cut("bot_loop", "room:0")
    assert metrics.value("loops_cut_total", room=OTHER) == 3
    assert metrics.value("loops_cut_total", room="room:0") == 2
    rooms = {
        sample.labels["room"]
        for family in metrics.registry.collect()
        for sample in family.samples
        if sample.name == "loops_cut_total"
    }
    assert len(rooms) == MAX_ROOMS + 1


async def test_issue25_the_factory_times_every_state_operation_and_counts_errors(
    tmp_path: Path,
) -> None:
    metrics = Metrics()
    config = StateConfig(backend="sqlite", path=str(tmp_path / "state.sqlite3"))
    store = build_state(config, metrics=metrics.state)
    # Every operation's error count is there at zero before the first call.
    for op in OPERATIONS:
        assert ("sqlite", op) in metrics.state.errors.values
    assert metrics.value("state_errors_total") == 0
    await store.start()
    assert await store.claim("notice:1", 60.0)
    assert not await store.claim("notice:1", 60.0)
    assert metrics.value("state_operation_seconds_count", backend="sqlite", op="claim") == 2
    await store.aclose()
    # A closed store raises: counted as the operation's error, and raised unchanged.
    with pytest.raises(StateError, match="not started"):
        await store.claim("notice:2", 60.0)
    assert metrics.value("state_errors_total", backend="sqlite", op="claim") == 1
    assert metrics.value("state_operation_seconds_count", op="claim") == 2


async def test_issue25_the_memory_backend_is_not_timed() -> None:
    # Its operations are dict steps; timing them would cost a fifth of the pipeline.
    metrics = Metrics()
    store = build_state(StateConfig(backend="memory"), metrics=metrics.state)
    await store.pair_reset(scope=ROOM)
    assert metrics.value("state_operation_seconds_count") == 0
    assert metrics.state.errors.values == {}
