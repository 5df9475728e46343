"""End to end on a real Synapse: a YAML config in, the real runtime and matrix-nio, the room out.

The gateway is built as `loopwarden run` builds it (`load_config` of a file, then
`Gateway`); people and outside bots are Synapse users driven by `SynapseClient`. Every wait
is a bounded poll of the room's history, never a fixed sleep.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import AsyncExitStack, closing
from pathlib import Path
from urllib.parse import quote

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.app.messages import REFUSAL
from tests.connectors.connector_helpers import (
    BUDGET,
    NOTICE,
    GatewayProcess,
    gateway_process,
    running,
    wait_for,
)
from tests.connectors.matrix.rooms import (
    User,
    answered,
    count,
    messages_of,
    new_room,
    posted_by,
    say,
    sqlite_state,
    until,
    write_config,
)
from tests.fakes.synapse_server import (
    RateLimit,
    SynapseClient,
    SynapseServer,
    running_synapse,
)

TURN_CAP = 3
"""The slow-loop test's bot-turn cap: bot messages in a row a room answers."""


async def test_issue23_two_hosted_bots_ping_pong_is_cut_at_the_pair_budget(
    tmp_path: Path, synapse_server: SynapseServer, synapse: SynapseClient
) -> None:
    room = await new_room(synapse, bots=2)
    async with running(write_config(tmp_path, synapse_server, room)):
        await say(synapse, room, room.alice, "hi bots")
        await until(synapse, room, lambda b: any(t.startswith(NOTICE) for _, t in b))
        await say(synapse, room, room.alice, "still there?")
        bodies = await until(synapse, room, lambda b: count(b, "echo: still there?") == 2)

    bot_to_bot = [t for _, t in bodies if t.startswith("echo: echo:")]
    assert len(bot_to_bot) == BUDGET
    assert sum(t.startswith(NOTICE) for _, t in bodies) == 1
    assert {s for s, t in bodies if t == "echo: hi bots"} == {b.user_id for b in room.bots}
    events = await synapse.messages(room.alice.token, room.room_id)
    replies = [e for e in events if e["sender"] != room.alice.user_id]
    assert {e["content"]["msgtype"] for e in replies} == {"m.notice"}


async def test_issue23_a_slow_loop_under_the_pair_budget_is_cut_at_the_bot_turn_cap(
    tmp_path: Path, synapse_server: SynapseServer, synapse: SynapseClient
) -> None:
    room = await new_room(synapse, bots=2)
    rule = f"""channels:
  - match: {{platform: matrix, channel: "{room.room_id}"}}
    policy: {{bot_loop: {{max_events_per_window: 1000, max_consecutive_bot_turns: {TURN_CAP}}}}}
"""
    async with running(write_config(tmp_path, synapse_server, room, extra=rule)) as gateway:

        def capped() -> float:
            return gateway.metrics.value("refusals_total", stage="bot_loop", reason="bot_turn_cap")

        await say(synapse, room, room.alice, "hi bots")
        # Both answer alice (bot turns 1 and 2), each the other (3 and 4), one of them the
        # third turn (5): turns 4 and 5 are over the cap, and nobody answers them.
        await wait_for(lambda: capped() == 2)
        cut = await messages_of(synapse, room)
        await say(synapse, room, room.alice, "a human again")
        after = await until(synapse, room, lambda b: count(b, "echo: a human again") == 2)

    assert len([t for _, t in cut if t.startswith("echo: echo:")]) == TURN_CAP
    assert count(cut, "echo: hi bots") == 2
    assert not any(t.startswith(NOTICE) for _, t in after)  # the cap is quiet, no cooldown
    assert gateway.metrics.value("refusals_total", stage="bot_loop", reason="cooldown") == 0


async def test_issue23_no_reply_is_never_posted(
    tmp_path: Path, synapse_server: SynapseServer, synapse: SynapseClient
) -> None:
    room = await new_room(synapse, bots=1)
    async with running(write_config(tmp_path, synapse_server, room)):
        await say(synapse, room, room.alice, "quiet please")
        await say(synapse, room, room.alice, "after the silence")
        bodies = await until(synapse, room, lambda b: count(b, "echo: after the silence") == 1)

    assert [t for s, t in bodies if s == room.bots[0].user_id] == ["echo: after the silence"]
    assert all("NO_REPLY" not in t for _, t in bodies)


async def test_issue23_loop_reset_by_an_admin_works_and_by_anyone_else_is_refused(
    tmp_path: Path, synapse_server: SynapseServer, synapse: SynapseClient
) -> None:
    room = await new_room(synapse, bots=1)
    bot = room.bots[0].user_id
    async with running(write_config(tmp_path, synapse_server, room)):
        await say(synapse, room, room.mallory, "/loop reset")
        await until(synapse, room, lambda b: (bot, REFUSAL) in b)
        await say(synapse, room, room.alice, "/loop reset")
        bodies = await until(
            synapse,
            room,
            lambda b: any(s == bot and "reset" in t.lower() and t != REFUSAL for s, t in b),
        )

    from_bot = [t for s, t in bodies if s == bot]
    assert from_bot.count(REFUSAL) == 1
    assert len(from_bot) == 2
    assert not any(t.startswith("echo: /loop") for t in from_bot)


async def test_issue23_a_restart_answers_nothing_twice_and_nothing_before_the_first_sync(
    tmp_path: Path, synapse_server: SynapseServer, synapse: SynapseClient
) -> None:
    room = await new_room(synapse, bots=1)
    bot = room.bots[0].user_id
    state = f"state: {{backend: sqlite, path: {tmp_path / 'state.db'}}}"
    config = write_config(tmp_path, synapse_server, room, state=state)
    await say(synapse, room, room.alice, "before the first sync")
    async with running(config):
        await say(synapse, room, room.alice, "one")
        await until(synapse, room, lambda b: (bot, "echo: one") in b)
    await say(synapse, room, room.alice, "while down")
    async with running(config):
        await say(synapse, room, room.alice, "two")
        bodies = await until(synapse, room, lambda b: (bot, "echo: two") in b)

    assert [t for s, t in bodies if s == bot] == ["echo: one", "echo: while down", "echo: two"]


@pytest.fixture(scope="module")
def slow_synapse(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SynapseServer]:
    """A Synapse whose message limit a busy bot meets: 2 at once, then one a second."""
    slow = RateLimit(per_second=1.0, burst_count=2)
    with running_synapse(tmp_path_factory.mktemp("slow-synapse"), rc_message=slow) as server:
        yield server


async def _unlimited(client: SynapseClient, admin: User) -> None:
    """Lift the message rate limit of `admin` (the people of the test), as an admin may."""
    path = f"/_synapse/admin/v1/users/{quote(admin.user_id, safe='')}/override_ratelimit"
    await client.request(
        "POST", path, token=admin.token, body={"messages_per_second": 0, "burst_count": 0}
    )


async def test_issue23_m_limit_exceeded_is_waited_out_and_each_reply_posted_once(
    tmp_path: Path, slow_synapse: SynapseServer
) -> None:
    async with SynapseClient(slow_synapse) as client:
        room = await new_room(client, bots=1)
        await _unlimited(client, room.alice)
        bot = room.bots[0].user_id
        async with running(write_config(tmp_path, slow_synapse, room)) as gateway:
            for n in range(4):
                await say(client, room, room.alice, f"flood {n}")
            bodies = await until(client, room, lambda b: (bot, "echo: flood 3") in b)
            retries = gateway.metrics.value("delivery_retries_total", platform="matrix")

    assert [t for s, t in bodies if s == bot] == [f"echo: flood {n}" for n in range(4)]
    assert retries >= 1


BURST = tuple(f"burst {n}" for n in range(4))
"""Human messages sent at once; with their replies they stay inside a sync's timeline limit."""


async def _started(config: Path, stack: AsyncExitStack) -> GatewayProcess:
    gateway = await stack.enter_async_context(gateway_process(config))
    await gateway.ready()
    return gateway


async def test_issue23_sigkill_mid_stream_then_a_restart_answers_each_message_once(
    tmp_path: Path, synapse_server: SynapseServer, synapse: SynapseClient
) -> None:
    room = await new_room(synapse, bots=1)
    bot = room.bots[0].user_id
    config = write_config(tmp_path, synapse_server, room, state=sqlite_state(tmp_path))
    config.write_text(config.read_text().replace("delay: 0.0", "delay: 0.3"))
    async with AsyncExitStack() as stack:
        first = await _started(config, stack)
        await say(synapse, room, room.alice, "warm up")
        await until(synapse, room, answered(bot, ("warm up",)))
        for text in BURST:
            await say(synapse, room, room.alice, text)
        await until(synapse, room, answered(bot, BURST[:1]))
        await first.kill()
    async with AsyncExitStack() as stack:
        await _started(config, stack)
        await say(synapse, room, room.alice, "after")
        bodies = await until(synapse, room, answered(bot, (*BURST, "after")))

    assert posted_by(bodies, bot) == [f"echo: {t}" for t in ("warm up", *BURST, "after")]


def _rewind(database: Path, cursor: str, keys: list[str]) -> None:
    """Put back what a SIGKILL between a reply's send and its confirmation leaves in sqlite.

    The sync position from before the burst, and each burst receipt in flight (owner a
    dead run): the restart syncs the burst again and its pipeline answers every message.
    """
    with closing(sqlite3.connect(database)) as db, db:
        db.execute("UPDATE cursors SET value = ?", (cursor,))
        for key in keys:
            db.execute("UPDATE receipts SET confirmed = 0, owner = 'killed' WHERE key = ?", (key,))


def _cursor(database: Path) -> str:
    with closing(sqlite3.connect(database)) as db:
        (value,) = db.execute("SELECT value FROM cursors").fetchone()
        return str(value)


async def test_issue23_a_reply_sent_before_a_sigkill_is_not_posted_again_after_the_restart(
    tmp_path: Path, synapse_server: SynapseServer, synapse: SynapseClient
) -> None:
    room = await new_room(synapse, bots=1)
    bot = room.bots[0].user_id
    database = tmp_path / "state.db"
    config = write_config(tmp_path, synapse_server, room, state=sqlite_state(tmp_path))
    async with AsyncExitStack() as stack:
        first = await _started(config, stack)
        await say(synapse, room, room.alice, "warm up")
        await until(synapse, room, answered(bot, ("warm up",)))
        before = _cursor(database)
        events = [await synapse.send_text(room.alice.token, room.room_id, text) for text in BURST]
        await until(synapse, room, answered(bot, BURST))
        await first.kill()
    _rewind(database, before, [f"dedupe:matrix:mx0:matrix:{room.room_id}:{e}" for e in events])
    async with AsyncExitStack() as stack:
        second = await _started(config, stack)
        await say(synapse, room, room.alice, "after")
        bodies = await until(synapse, room, answered(bot, ("after",)))
        sent = await _replies_out(await second.ready())

    assert posted_by(bodies, bot) == [f"echo: {t}" for t in ("warm up", *BURST, "after")]
    assert sent == len(BURST) + 1  # the burst was answered again: the homeserver kept one each


async def _replies_out(port: int) -> float:
    """`replies_out_total` of the platform matrix, as the gateway's `/metrics` serves it."""
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://127.0.0.1:{port}/metrics") as response,
    ):
        text = await response.text()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "replies_out_total" and sample.labels.get("platform") == "matrix"
    )


async def test_issue23_more_messages_while_down_than_synapse_syncs_by_default_are_all_answered(
    tmp_path: Path, synapse_server: SynapseServer, synapse: SynapseClient
) -> None:
    room = await new_room(synapse, bots=1)
    bot = room.bots[0].user_id
    config = write_config(tmp_path, synapse_server, room, state=sqlite_state(tmp_path))
    async with running(config):
        await say(synapse, room, room.alice, "warm up")
        await until(synapse, room, answered(bot, ("warm up",)))
    missed = tuple(f"while down {n}" for n in range(15))  # Synapse's default timeline is 10
    for text in missed:
        await say(synapse, room, room.alice, text)
    async with running(config):
        bodies = await until(synapse, room, answered(bot, missed))

    assert posted_by(bodies, bot) == [f"echo: {t}" for t in ("warm up", *missed)]
