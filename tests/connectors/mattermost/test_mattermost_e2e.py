"""End to end: a YAML config in, the real gateway pipeline and connector, the fake Mattermost out.

The gateway is built as `loopwarden run` builds it (`load_config` of a file, then `Gateway`);
the fake (tests/fakes/mattermost_server.py) speaks REST v4 and the websocket over loopback.
The outside bot is a bot account of the fake that answers the hosted bot's posts (its posts
carry `props.from_bot`, as on a real server). Every wait is a bounded poll, never a sleep
that a test's outcome depends on.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from connectors.mattermost import MattermostConnector
from gateway.app.messages import REFUSAL
from gateway.app.runtime import Gateway
from tests.connectors import connector_helpers
from tests.connectors.connector_helpers import (
    BUDGET,
    NOTICE,
    assert_no_secret,
    gateway_process,
    wait_for,
    write_e2e_config,
)
from tests.fakes.mattermost_server import FakeChannel, FakeUser, MattermostFake

HOSTED = """  - id: {id}
    platform: mattermost
    url: "{url}"
    token: "{token}"
    agent: parrot
"""
TURN_CAP = 3
RECONNECT_SECONDS = 30.0
"""The bound on a wait that spans a reconnect (its backoff doubles from 1 s) or a restart."""


class Clock:
    """The fake server's clock, moved by hand: its rate limit never depends on wall time."""

    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class World:
    """The fake server, its clock and who is in it."""

    fake: MattermostFake
    clock: Clock
    helper: FakeUser  # hosted
    echo: FakeUser  # hosted, in the pair channel only
    outsider: FakeUser  # a bot account not hosted here
    alice: FakeUser  # an admin
    mallory: FakeUser  # not an admin
    lobby: FakeChannel
    pair: FakeChannel


@pytest.fixture
async def world() -> AsyncIterator[World]:
    clock = Clock()
    async with MattermostFake(clock=clock) as fake:
        helper = fake.add_user("helper", is_bot=True)
        echo = fake.add_user("echo", is_bot=True)
        outsider = fake.add_user("outside-echo", is_bot=True)
        alice = fake.add_user("alice")
        mallory = fake.add_user("mallory")
        lobby = fake.add_channel("lobby", [helper, outsider, alice, mallory])
        pair = fake.add_channel("pair", [helper, echo, alice])
        yield World(fake, clock, helper, echo, outsider, alice, mallory, lobby, pair)


def write_config(tmp_path: Path, world: World, *hosted: FakeUser, extra: str = "") -> Path:
    bots = "".join(
        HOSTED.format(id=f"{user.username}-mm", url=world.fake.url, token=user.token)
        for user in hosted
    )
    return write_e2e_config(
        tmp_path, platform="mattermost", admin=world.alice.id, bots=bots, extra=extra
    )


@asynccontextmanager
async def running(path: Path) -> AsyncIterator[Gateway]:
    async with connector_helpers.running(path) as gateway:
        yield gateway


def texts(world: World, user: FakeUser) -> list[str]:
    return world.fake.texts(user)


async def say(world: World, text: str, sender: FakeUser, channel: FakeChannel) -> dict[str, Any]:
    """A post in a channel; waits for and returns the next post of a hosted bot."""
    before = len(world.fake.posts)
    world.fake.post_as(sender, channel.id, text)
    hosted = {world.helper.id, world.echo.id}
    await wait_for(lambda: any(p["user_id"] in hosted for p in world.fake.posts[before + 1 :]))
    return next(p for p in world.fake.posts[before + 1 :] if p["user_id"] in hosted)


@contextmanager
def outside_bot_answers(world: World, *, webhook: bool = False) -> Iterator[None]:
    """The outside bot answers every post of the hosted bot in the lobby, while in the block.

    With `webhook`, an incoming webhook answers instead: it posts as its owner, mallory (a
    person's account), and only its `props.from_webhook` says a script is speaking.
    """
    author = world.mallory if webhook else world.outsider

    async def answer() -> None:
        seen = len(world.fake.posts)
        while True:
            posts = world.fake.posts
            for post in posts[seen:]:
                if post["user_id"] == world.helper.id and post["channel_id"] == world.lobby.id:
                    world.fake.post_as(
                        author,
                        world.lobby.id,
                        f"ping {post['id'][:6]}",
                        webhook=webhook,
                        override_username="ci-hook" if webhook else None,
                    )
            seen = len(posts)
            await asyncio.sleep(0.01)

    task = asyncio.create_task(answer())
    try:
        yield
    finally:
        task.cancel()


async def settled(world: World) -> None:
    """Wait until the posts stop changing for a few polls (every hand-over has been decided)."""
    last = -1
    still = 0
    async with asyncio.timeout(connector_helpers.WAIT_SECONDS):
        while still < 20:
            still = still + 1 if len(world.fake.posts) == last else 0
            last = len(world.fake.posts)
            await asyncio.sleep(0.01)


def notices(world: World) -> list[str]:
    return [t for t in world.fake.texts() if t.startswith(NOTICE)]


async def test_issue23_a_human_gets_the_agents_reply_in_the_channel_and_the_thread(
    tmp_path: Path, world: World
) -> None:
    async with running(write_config(tmp_path, world, world.helper)):
        reply = await say(world, "hello there", world.alice, world.lobby)
        assert (reply["channel_id"], reply["message"], reply["root_id"]) == (
            world.lobby.id,
            "echo: hello there",
            "",
        )
        before = len(world.fake.posts)
        world.fake.post_as(world.alice, world.lobby.id, "in a thread", root_id=reply["id"])
        await wait_for(lambda: len(world.fake.posts) == before + 2)
        threaded = world.fake.posts[-1]
        assert (threaded["message"], threaded["root_id"]) == ("echo: in a thread", reply["id"])


async def test_issue23_outside_bot_ping_pong_is_cut_at_the_pair_budget_with_one_notice(
    tmp_path: Path, world: World
) -> None:
    async with running(write_config(tmp_path, world, world.helper)):
        with outside_bot_answers(world):
            await say(world, "start the ping-pong", world.alice, world.lobby)
            await wait_for(lambda: bool(notices(world)))
            await settled(world)
        answers = [t for t in texts(world, world.helper) if t.startswith("echo: ping")]
        assert len(answers) == BUDGET
        assert len(notices(world)) == 1
        assert "!loop reset" in notices(world)[0]
        assert all("NO_REPLY" not in t for t in world.fake.texts())


async def test_issue23_two_hosted_bots_answering_each_other_are_cut_at_the_budget(
    tmp_path: Path, world: World
) -> None:
    async with running(write_config(tmp_path, world, world.helper, world.echo)):
        world.fake.post_as(world.alice, world.pair.id, "hi bots")
        await wait_for(lambda: bool(notices(world)))
        await settled(world)
        bot_to_bot = [t for t in world.fake.texts() if t.startswith("echo: echo:")]
        assert len(bot_to_bot) == BUDGET
        assert len(notices(world)) == 1
        assert texts(world, world.helper)[0] == texts(world, world.echo)[0] == "echo: hi bots"


async def test_issue23_a_slow_loop_under_the_budget_is_cut_at_the_bot_turn_cap(
    tmp_path: Path, world: World
) -> None:
    rule = f"""channels:
  - match: {{platform: mattermost, channel: "{world.lobby.id}"}}
    policy: {{bot_loop: {{max_events_per_window: 1000, max_consecutive_bot_turns: {TURN_CAP}}}}}
"""
    async with running(write_config(tmp_path, world, world.helper, extra=rule)):
        with outside_bot_answers(world):
            await say(world, "start a slow loop", world.alice, world.lobby)
            await wait_for(lambda: len(world.fake.texts(world.outsider)) > TURN_CAP)
            await settled(world)
        answers = [t for t in texts(world, world.helper) if t.startswith("echo: ping")]
        assert len(answers) == TURN_CAP
        assert notices(world) == []  # the cap drops quietly until a human speaks
        reply = await say(world, "a human again", world.alice, world.lobby)
        assert reply["message"] == "echo: a human again"


async def test_issue23_no_reply_is_never_posted(tmp_path: Path, world: World) -> None:
    async with running(write_config(tmp_path, world, world.helper)):
        world.fake.post_as(world.alice, world.lobby.id, "quiet please")
        reply = await say(world, "after the silence", world.alice, world.lobby)
        assert reply["message"] == "echo: after the silence"
        assert texts(world, world.helper) == ["echo: after the silence"]


async def test_issue23_loop_reset_works_for_an_admin_and_is_refused_to_anyone_else(
    tmp_path: Path, world: World
) -> None:
    async with running(write_config(tmp_path, world, world.helper)):
        with outside_bot_answers(world):
            await say(world, "start the ping-pong", world.alice, world.lobby)
            await wait_for(lambda: bool(notices(world)))
            await settled(world)

        refusal = await say(world, "@helper !loop reset", world.mallory, world.lobby)
        assert refusal["message"] == REFUSAL
        world.fake.post_as(world.outsider, world.lobby.id, "ping while paused")
        ack = await say(world, "@helper !loop reset", world.alice, world.lobby)
        assert "reset" in ack["message"].lower()
        assert "echo: ping while paused" not in texts(world, world.helper)

        resumed = await say(world, "ping again", world.outsider, world.lobby)
        assert resumed["message"] == "echo: ping again"
        assert len(notices(world)) == 1


@pytest.mark.parametrize("retry_after", [True, False], ids=["retry-after", "ratelimit-reset"])
async def test_issue23_a_429_is_waited_out_and_the_reply_posted_once(
    tmp_path: Path, world: World, retry_after: bool
) -> None:
    """With `Retry-After`, and with `X-RateLimit-Reset` alone saying when to come back."""
    async with running(write_config(tmp_path, world, world.helper)):
        await say(world, "warm up", world.alice, world.lobby)  # alice's lookup is cached now
        world.fake.set_rate_limit(1, per_second=1, retry_after=retry_after)
        async with (
            aiohttp.ClientSession() as http,
            http.get(
                f"{world.fake.url}/api/v4/users/me",
                headers={"Authorization": f"Bearer {world.helper.token}"},
            ) as drained,  # the bot's one request of this second is spent
        ):
            assert drained.status == 200
        limited = ("POST", "/api/v4/posts", None)
        world.fake.post_as(world.alice, world.lobby.id, "through the flood")
        await wait_for(lambda: limited in world.fake.calls)
        world.clock.now += 1  # the second the server's Retry-After asked for has passed
        await wait_for(lambda: len(texts(world, world.helper)) == 2)
        attempts = [c for c in world.fake.calls if c[:2] == ("POST", "/api/v4/posts")]
        assert attempts[-1] == ("POST", "/api/v4/posts", world.helper.id)
        await settled(world)
        assert texts(world, world.helper) == ["echo: warm up", "echo: through the flood"]


async def test_issue23_a_dropped_websocket_reconnects_and_answers_again(
    tmp_path: Path, world: World
) -> None:
    async with running(write_config(tmp_path, world, world.helper)) as gateway:
        connector = gateway.hosted["helper-mm"].connector
        assert isinstance(connector, MattermostConnector)
        for abrupt in (False, True):
            await world.fake.drop_connections(world.helper, abrupt=abrupt)
            await wait_for(lambda: not connector.connected)
            await wait_for(
                lambda: connector.connected and world.fake.connections(world.helper) == 1
            )
            reply = await say(world, f"still there? {abrupt}", world.alice, world.lobby)
            assert reply["message"] == f"echo: still there? {abrupt}"
        assert gateway.ready


async def test_issue23_subprocess_answers_exits_zero_on_sigterm_and_never_prints_the_token(
    tmp_path: Path, world: World
) -> None:
    path = write_config(tmp_path, world, world.helper)
    async with gateway_process(path) as gateway:
        await gateway.ready()
        reply = await say(world, "hello from outside", world.alice, world.lobby)
        assert reply["message"] == "echo: hello from outside"
        await world.fake.drop_connections(world.helper, abrupt=True)
        await wait_for(lambda: world.fake.connections(world.helper) == 0)
        await wait_for(lambda: world.fake.connections(world.helper) == 1)
        await say(world, "after the reconnect", world.alice, world.lobby)
        taken = await gateway.terminate()
    assert gateway.returncode == 0, gateway.output
    assert taken < 10
    assert "DEBUG" in gateway.output
    assert world.helper.token is not None
    assert_no_secret(gateway.output, world.helper.token)


async def test_issue23_a_webhook_answering_the_bot_is_a_bot_and_cut_at_the_pair_budget(
    tmp_path: Path, world: World
) -> None:
    async with running(write_config(tmp_path, world, world.helper)):
        with outside_bot_answers(world, webhook=True):
            await say(world, "start the ping-pong", world.alice, world.lobby)
            await wait_for(lambda: bool(notices(world)))
            await settled(world)
        answers = [t for t in texts(world, world.helper) if t.startswith("echo: ping")]
        assert len(answers) == BUDGET
        assert len(notices(world)) == 1


def sqlite_config(tmp_path: Path, world: World) -> Path:
    """The end-to-end config with a sqlite state in `tmp_path` (kept across restarts)."""
    path = write_config(tmp_path, world, world.helper)
    state = f"state: {{backend: sqlite, path: {tmp_path / 'state.db'}}}"
    path.write_text(path.read_text().replace("state: {backend: memory}", state))
    return path


def posted_later(world: World, channel: FakeChannel, *texts: str) -> None:
    """Alice posts `texts`, each a second after the one before (on the fake's clock)."""
    for text in texts:
        world.clock.now += 1
        world.fake.post_as(world.alice, channel.id, text)


def echoes(*texts: str) -> list[str]:
    return [f"echo: {text}" for text in texts]


async def test_issue23_posts_made_while_the_websocket_was_down_are_answered_once_after_it(
    tmp_path: Path, world: World
) -> None:
    down = ("while down 0", "while down 1", "while down 2")
    async with running(write_config(tmp_path, world, world.helper)) as gateway:
        connector = gateway.hosted["helper-mm"].connector
        assert isinstance(connector, MattermostConnector)
        await say(world, "before the outage", world.alice, world.lobby)
        world.fake.refuse_websockets = True
        await world.fake.drop_connections(world.helper, abrupt=True)
        await wait_for(lambda: not connector.connected)
        posted_later(world, world.lobby, *down)
        world.fake.refuse_websockets = False
        await wait_for(lambda: len(texts(world, world.helper)) == 4, limit=RECONNECT_SECONDS)
        world.clock.now += 1
        await say(world, "after the outage", world.alice, world.lobby)
        await settled(world)
    assert texts(world, world.helper) == echoes("before the outage", *down, "after the outage")


async def test_issue23_a_restart_after_sigkill_answers_what_was_posted_meanwhile_once(
    tmp_path: Path, world: World
) -> None:
    """Nothing twice, nothing lost, nothing from before the first start (sqlite state)."""
    config = sqlite_config(tmp_path, world)
    world.clock.now = time.time() - 3600  # the server's clock: an hour before the first start
    world.fake.post_as(world.alice, world.lobby.id, "before the first start")
    down = ("while down 0", "while down 1", "while down 2")
    async with gateway_process(config) as first:
        await first.ready()
        world.clock.now = time.time() + 3600  # every post from now on is after it
        await say(world, "warm up", world.alice, world.lobby)
        await first.kill()
    posted_later(world, world.lobby, *down)
    async with gateway_process(config) as second:
        await second.ready()
        await wait_for(lambda: len(texts(world, world.helper)) == 4, limit=RECONNECT_SECONDS)
        world.clock.now += 1
        await say(world, "after the restart", world.alice, world.lobby)
        await settled(world)
        output = second.output
    assert texts(world, world.helper) == echoes("warm up", *down, "after the restart")
    assert world.helper.token is not None
    assert_no_secret(output, world.helper.token)


def rewind(database: Path, world: World, posts: list[dict[str, Any]]) -> None:
    """Put back what a SIGKILL between replies' sends and their confirmation leaves in sqlite.

    No position for the lobby (the restart reads it again from the floor) and each post's
    receipt in flight (owner a dead run), so the restart answers those posts again.
    """
    with closing(sqlite3.connect(database)) as db, db:
        db.execute("DELETE FROM cursors WHERE key = ?", (f"mattermost:helper-mm:{world.lobby.id}",))
        for post in posts:
            key = f"dedupe:mattermost:helper-mm:mattermost:{world.lobby.id}:{post['id']}"
            db.execute("UPDATE receipts SET confirmed = 0, owner = 'killed' WHERE key = ?", (key,))


async def replies_out(port: int) -> float:
    """`replies_out_total` of the platform mattermost, as the gateway's `/metrics` serves it."""
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://127.0.0.1:{port}/metrics") as response,
    ):
        text = await response.text()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "replies_out_total" and sample.labels.get("platform") == "mattermost"
    )


async def test_issue23_replies_sent_before_a_sigkill_are_not_posted_again_after_the_restart(
    tmp_path: Path, world: World
) -> None:
    """Answered again after the restart, each chunk's pending_post_id keeps one post."""
    config = sqlite_config(tmp_path, world)
    burst = ("burst 0", "burst 1", "burst 2")
    async with gateway_process(config) as first:
        await first.ready()
        world.clock.now = time.time() + 3600  # every post is after the first start
        await say(world, "warm up", world.alice, world.lobby)
        posted = [world.fake.post_as(world.alice, world.lobby.id, text) for text in burst]
        await wait_for(lambda: len(texts(world, world.helper)) == 4)
        await first.kill()
    rewind(tmp_path / "state.db", world, posted)
    async with gateway_process(config) as second:
        port = await second.ready()
        await say(world, "after", world.alice, world.lobby)
        await settled(world)
        sent = await replies_out(port)
    assert texts(world, world.helper) == echoes("warm up", *burst, "after")
    assert sent == len(burst) + 1  # the burst was answered again: the server kept one each
