"""The Mattermost connector against the fake server, with a recording sink (no pipeline)."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from pydantic import SecretStr

from connectors.mattermost import MattermostConnector
from connectors.timing import Timing
from gateway.app.connector import ConnectorServices
from gateway.app.errors import ConnectorError, DeliveryError, GatewayStopping
from gateway.app.types import InboundMessage, Reply
from gateway.config import MattermostBotConfig
from gateway.state.base import CursorStore
from gateway.state.memory import MemoryStateStore
from gateway.state.sqlite import SqliteStateStore
from tests.connectors.connector_helpers import Inbox, services, wait_for
from tests.fakes.mattermost_server import FakeChannel, FakeUser, MattermostFake, new_id

FAST = Timing(retry_delays=(0.01, 0.05))


@pytest.fixture
async def fake() -> AsyncIterator[MattermostFake]:
    # A clock that stands still: the rate limit refills only when a test says so.
    async with MattermostFake(clock=lambda: 1_700_000_000.0) as server:
        yield server


def connector(fake: MattermostFake, token: str | None) -> MattermostConnector:
    config = MattermostBotConfig(
        id="helper-mm",
        platform="mattermost",
        url=fake.url + "/",
        token=SecretStr(token or ""),
        agent="parrot",
    )
    return MattermostConnector(config, services(), timing=FAST)


def unflagged_post(author: FakeUser, channel: FakeChannel, text: str) -> dict[str, Any]:
    """A `posted` event's data whose post carries no `from_bot`, whoever wrote it."""
    post = {
        "id": new_id(),
        "user_id": author.id,
        "channel_id": channel.id,
        "root_id": "",
        "message": text,
        "type": "",
        "props": {},
    }
    return {"post": json.dumps(post), "channel_type": "O", "sender_name": f"@{author.username}"}


async def test_issue23_a_bot_posting_without_from_bot_is_a_bot_by_its_account_asked_once(
    fake: MattermostFake,
) -> None:
    helper = fake.add_user("helper", is_bot=True)
    sneaky = fake.add_user("sneaky", is_bot=True)
    alice = fake.add_user("alice")
    town = fake.add_channel("town", [helper, sneaky, alice])
    mm = connector(fake, helper.token)
    inbox = Inbox()
    await mm.start(inbox)
    try:
        for author, text in ((sneaky, "one"), (alice, "two"), (sneaky, "three"), (alice, "four")):
            fake.send_event(
                helper, "posted", unflagged_post(author, town, text), channel_id=town.id
            )
        await inbox.next(4)
        assert [(m.text, m.sender_is_bot) for m in inbox.messages] == [
            ("one", True),
            ("two", False),
            ("three", True),
            ("four", False),
        ]
        lookups = [
            c
            for c in fake.calls
            if c[1].startswith("/api/v4/users/") and not c[1].endswith(("/me", "/channels"))
        ]
        assert sorted(c[1] for c in lookups) == sorted(
            f"/api/v4/users/{user.id}" for user in (sneaky, alice)
        )
    finally:
        await mm.aclose()


async def test_issue23_a_sender_the_server_cannot_answer_about_counts_as_a_bot(
    fake: MattermostFake,
) -> None:
    helper = fake.add_user("helper", is_bot=True)
    alice = fake.add_user("alice")
    town = fake.add_channel("town", [helper, alice])
    ghost = FakeUser(new_id(), "ghost")  # no account on the server: 404
    mm = connector(fake, helper.token)
    inbox = Inbox()
    await mm.start(inbox)
    try:
        fake.send_event(helper, "posted", unflagged_post(ghost, town, "boo"), channel_id=town.id)
        assert (await inbox.next()).sender_is_bot
    finally:
        await mm.aclose()


async def test_issue23_a_refused_token_fails_start_without_printing_it(
    fake: MattermostFake,
) -> None:
    mm = connector(fake, "wrong-token-0123456789")
    with pytest.raises(ConnectorError) as refused:
        await mm.start(Inbox())
    assert "session_expired" in str(refused.value)
    assert "wrong-token" not in str(refused.value)
    assert not mm.connected


async def test_issue23_odd_frames_are_counted_and_the_next_post_is_handed_over(
    fake: MattermostFake,
) -> None:
    helper = fake.add_user("helper", is_bot=True)
    alice = fake.add_user("alice")
    town = fake.add_channel("town", [helper, alice])
    mm = connector(fake, helper.token)
    inbox = Inbox()
    await mm.start(inbox)
    try:
        fake.send_event(helper, "posted", {"post": "{not json"}, channel_id=town.id)
        fake.send_event(helper, "posted", {"post": json.dumps({"id": 3})}, channel_id=town.id)
        fake.send_event(helper, "typing", {"parent_id": ""}, channel_id=town.id)
        posted = fake.post_as(alice, town.id, "fine")
        fake.edit_as(posted["id"], "fine, edited")
        await inbox.next()
        await wait_for(lambda: mm.dropped["unsupported"] == 1)
        assert inbox.texts() == ["fine"]
        assert dict(mm.dropped) == {"malformed": 2, "unsupported": 1}
    finally:
        await mm.aclose()


async def test_issue23_send_edit_and_the_final_failures(fake: MattermostFake) -> None:
    helper = fake.add_user("helper", is_bot=True)
    alice = fake.add_user("alice")
    town = fake.add_channel("town", [helper, alice])
    elsewhere = fake.add_channel("elsewhere", [alice], channel_type="P")
    mm = connector(fake, helper.token)
    await mm.start(Inbox())
    try:
        posted_id = await mm.send(town.id, Reply("first"))
        assert posted_id is not None
        await mm.edit(town.id, posted_id, Reply("first, grown"))
        assert fake.post(posted_id)["message"] == "first, grown"
        with pytest.raises(DeliveryError, match="permissions") as denied:
            await mm.send(elsewhere.id, Reply("not mine"))
        assert not denied.value.retryable
        with pytest.raises(DeliveryError, match="not a post id"):
            await mm.edit(town.id, "../../users/me", Reply("x"))
        for _ in range(2):  # the same chunk sent again (a restart): the server keeps one
            await mm.send(town.id, Reply("answer", reply_to="p" * 26))
        await mm.send(town.id, Reply("answer"))  # the answer's second chunk
        assert fake.texts(helper)[-2:] == ["answer", "answer"]
        assert len(fake.texts(helper)) == 3
        fake.set_rate_limit(1, per_second=0.5)
        await mm.send(town.id, Reply("spends the bucket"))
        with pytest.raises(DeliveryError) as limited:
            await mm.send(town.id, Reply("limited"))
        assert (limited.value.retryable, limited.value.retry_after) == (True, 2.0)
    finally:
        await mm.aclose()


class Clock:
    """The time of the fake server and the connector, moved by the test (never wall time)."""

    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now

    def tick(self) -> None:
        """One second later: each post of a test gets its own millisecond."""
        self.now += 1

    async def sleep(self, seconds: float) -> None:
        """A connector's wait (a 429's, a reconnect's): the clock moves, nobody waits."""
        self.now += seconds
        await asyncio.sleep(0.001)


def on_clock(
    fake: MattermostFake,
    clock: Clock,
    token: str | None,
    *,
    cursors: CursorStore | None = None,
    **bounds: int,
) -> MattermostConnector:
    config = MattermostBotConfig(
        id="helper-mm",
        platform="mattermost",
        url=fake.url,
        token=SecretStr(token or ""),
        agent="parrot",
    )
    timing = Timing(clock=clock, sleep=clock.sleep, retry_delays=(0.01, 0.05))
    lent = ConnectorServices(http=web.Application(), cursors=cursors)
    return MattermostConnector(config, lent, timing=timing, **bounds)


async def outage(fake: MattermostFake, bot: FakeUser, mm: MattermostConnector) -> None:
    """Cut the bot's websocket and refuse new ones until `fake.refuse_websockets` is False."""
    fake.refuse_websockets = True
    await fake.drop_connections(bot, abrupt=True)
    await wait_for(lambda: not mm.connected)


def in_channel(inbox: Inbox, channel: FakeChannel) -> list[str]:
    """The texts handed over from one channel, each once, in the order first handed over.

    A post made while the websocket opens may be handed over twice, caught up and live;
    the pipeline's dedupe (not in these tests) answers it once.
    """
    return list(dict.fromkeys(m.text for m in inbox.messages if m.channel_id == channel.id))


def handed_over(inbox: Inbox, text: str) -> bool:
    return text in inbox.texts()


def once(inbox: Inbox) -> list[str]:
    """The texts handed over, each once, in the order first handed over (see `in_channel`)."""
    return list(dict.fromkeys(inbox.texts()))


async def test_issue23_posts_made_while_the_websocket_was_down_are_handed_over_before_live_ones(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="connectors.mattermost")
    clock = Clock()
    async with MattermostFake(clock=clock) as fake:
        helper = fake.add_user("helper", is_bot=True)
        alice = fake.add_user("alice")
        town = fake.add_channel("town", [helper, alice])
        quiet = fake.add_channel("quiet", [helper, alice])
        mm = on_clock(fake, clock, helper.token)
        inbox = Inbox()
        await mm.start(inbox)
        try:
            clock.tick()
            before = fake.post_as(alice, town.id, "before")
            await inbox.next()
            await outage(fake, helper, mm)
            for text in ("while down 1", "the bot's own", "deleted while down", "while down 2"):
                clock.tick()
                author = helper if text == "the bot's own" else alice
                made = fake.post_as(author, town.id, text)
                if text.startswith("deleted"):
                    fake.delete_as(made["id"])
            fake.edit_as(before["id"], "before, edited while down")
            clock.tick()
            fake.post_as(alice, quiet.id, "in a channel the bot saw nothing of yet")
            fake.refuse_websockets = False
            await wait_for(lambda: mm.connected)
            clock.tick()
            fake.post_as(alice, town.id, "live again")
            await wait_for(lambda: "live again" in inbox.texts())
        finally:
            await mm.aclose()

    assert in_channel(inbox, town) == ["before", "while down 1", "while down 2", "live again"]
    assert in_channel(inbox, quiet) == ["in a channel the bot saw nothing of yet"]
    assert {m.sender_name for m in inbox.messages} == {"alice"}  # caught up: asked the server
    assert mm.dropped["own_message"] == 1
    assert "caught up 4 posts" in caplog.text  # the bot's own post read, then skipped
    assert helper.token is not None
    assert helper.token not in caplog.text


async def test_issue23_a_restart_catches_up_from_saved_positions_and_never_before_the_first_start(
    tmp_path: Path,
) -> None:
    clock = Clock()
    database = tmp_path / "state.db"
    async with MattermostFake(clock=clock) as fake:
        helper = fake.add_user("helper", is_bot=True)
        alice = fake.add_user("alice")
        town = fake.add_channel("town", [helper, alice])
        quiet = fake.add_channel("quiet", [helper, alice])
        fake.post_as(alice, quiet.id, "history from before the first start")
        fake.post_as(alice, town.id, "more history")

        runs: list[Inbox] = []
        for stopped_posts in (0, 2):
            for n in range(stopped_posts):
                clock.tick()
                channel = town if n == 0 else quiet
                fake.post_as(alice, channel.id, f"while stopped {n}")
            store = SqliteStateStore(database, clock=clock)
            await store.start()
            clock.tick()
            mm = on_clock(fake, clock, helper.token, cursors=store)
            inbox = Inbox()
            runs.append(inbox)
            await mm.start(inbox)
            try:
                clock.tick()
                live = f"live in run {len(runs)}"
                fake.post_as(alice, town.id, live)
                await wait_for(functools.partial(handed_over, inbox, live))
            finally:
                await mm.aclose()
                await store.aclose()

    assert once(runs[0]) == ["live in run 1"]
    assert sorted(once(runs[1])) == ["live in run 2", "while stopped 0", "while stopped 1"]
    assert in_channel(runs[1], town) == ["while stopped 0", "live in run 2"]


async def test_issue23_a_catch_up_is_bounded_and_counts_what_it_leaves_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    async with MattermostFake(clock=clock) as fake:
        helper = fake.add_user("helper", is_bot=True)
        alice = fake.add_user("alice")
        older = fake.add_channel("older", [helper, alice])
        busy = fake.add_channel("busy", [helper, alice])
        mm = on_clock(fake, clock, helper.token, catch_up_posts=2, catch_up_channels=1)
        inbox = Inbox()
        await mm.start(inbox)
        try:
            await outage(fake, helper, mm)
            clock.tick()
            fake.post_as(alice, older.id, "in the older channel")
            for n in range(3):
                clock.tick()
                fake.post_as(alice, busy.id, f"busy {n}")
            fake.refuse_websockets = False
            await inbox.next(2)
            await wait_for(lambda: mm.dropped["catch_up_limit"] == 2)
        finally:
            await mm.aclose()

    assert once(inbox) == ["busy 1", "busy 2"]
    assert "1 channels with posts made while disconnected were left out" in caplog.text
    assert "3 posts made while disconnected, the newest 2 answered" in caplog.text


async def test_issue23_a_rate_limited_catch_up_waits_as_the_server_asks_then_reads(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    async with MattermostFake(clock=clock) as fake:
        helper = fake.add_user("helper", is_bot=True)
        alice = fake.add_user("alice")
        town = fake.add_channel("town", [helper, alice])
        mm = on_clock(fake, clock, helper.token)
        inbox = Inbox()
        await mm.start(inbox)
        try:
            clock.tick()
            fake.post_as(alice, town.id, "alice is known now")
            await inbox.next()
            await outage(fake, helper, mm)
            clock.tick()
            fake.post_as(alice, town.id, "while down")
            fake.set_rate_limit(1, per_second=1)
            before = len(fake.calls)
            fake.refuse_websockets = False
            await wait_for(lambda: "while down" in inbox.texts())
        finally:
            await mm.aclose()

    limited = [c for c in fake.calls[before:] if c[2] is None]
    assert len(limited) == 1  # the posts request: the channel list spent the one request
    assert limited[0][:2] == ("GET", f"/api/v4/channels/{town.id}/posts")
    assert once(inbox) == ["alice is known now", "while down"]
    assert "catch-up" not in caplog.text


async def test_issue23_a_catch_up_survives_odd_answers_and_reads_the_channel_again_next_time(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    store = MemoryStateStore(clock=clock)
    async with MattermostFake(clock=clock) as fake:
        helper = fake.add_user("helper", is_bot=True)
        alice = fake.add_user("alice")
        town = fake.add_channel("town", [helper, alice])
        mm = on_clock(fake, clock, helper.token, cursors=store)
        inbox = Inbox()
        await mm.start(inbox)
        try:
            floor = await store.cursor_get("mattermost:helper-mm")
            await outage(fake, helper, mm)
            clock.tick()
            fake.post_as(alice, town.id, "while down")
            posts = f"/channels/{town.id}/posts"
            odd = (
                (f"/users/{helper.id}/channels", '{"channels": []}', 200, "is no list"),
                (posts, "[1, 2, 3]", 200, "answered no post list"),
                (posts, '{"id": "app.oops", "status_code": 503}', 503, "failed (app.oops)"),
                (posts, '{"message": "' + "x" * 100_000 + '"}', 404, "failed (HTTP 404)"),
            )
            for path, body, status, logged in odd:
                fake.break_route(path, body, status=status)
                before = len(fake.calls)
                fake.refuse_websockets = False
                await wait_for(functools.partial(logged_text, caplog, logged))
                tries = [c for c in fake.calls[before:] if c[1] == f"/api/v4{path}"]
                assert len(tries) == (3 if status == 503 else 1)
                assert await store.cursor_get("mattermost:helper-mm") == floor
                fake.mend_routes()
                await outage(fake, helper, mm)
            assert inbox.texts() == []
            fake.refuse_websockets = False
            await wait_for(lambda: "while down" in inbox.texts())
            await wait_for(lambda: mm.connected)
        finally:
            await mm.aclose()
    assert await store.cursor_get("mattermost:helper-mm") != floor  # a complete catch-up


def logged_text(caplog: pytest.LogCaptureFixture, text: str) -> bool:
    return text in caplog.text


async def test_issue23_a_post_refused_while_the_gateway_stops_is_caught_up_at_the_next_start() -> (
    None
):
    clock = Clock()
    store = MemoryStateStore(clock=clock)

    async def stopping(message: InboundMessage) -> None:
        raise GatewayStopping

    async with MattermostFake(clock=clock) as fake:
        helper = fake.add_user("helper", is_bot=True)
        alice = fake.add_user("alice")
        town = fake.add_channel("town", [helper, alice])
        first = on_clock(fake, clock, helper.token, cursors=store)
        await first.start(stopping)
        try:
            for text in ("during the stop", "also during the stop"):
                clock.tick()
                fake.post_as(alice, town.id, text)
                fake.post_as(helper, town.id, f"the bot's own, after {text}")
            await wait_for(lambda: first.dropped["stopping"] >= 2)
            await wait_for(lambda: first.dropped["own_message"] >= 2)
        finally:
            await first.aclose()
        second = on_clock(fake, clock, helper.token, cursors=store)
        inbox = Inbox()
        await second.start(inbox)
        try:
            await wait_for(lambda: len(once(inbox)) == 2)
        finally:
            await second.aclose()
    assert once(inbox) == ["during the stop", "also during the stop"]
