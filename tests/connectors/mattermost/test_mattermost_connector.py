"""The Mattermost connector against the fake server, with a recording sink (no pipeline)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from pydantic import SecretStr

from connectors.mattermost import MattermostConnector
from connectors.timing import Timing
from gateway.app.errors import ConnectorError, DeliveryError
from gateway.app.types import Reply
from gateway.config import MattermostBotConfig
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
        lookups = [c for c in fake.calls if c[1].startswith("/api/v4/users/") and c[1][-2:] != "me"]
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
        fake.set_rate_limit(1, per_second=0.5)
        await mm.send(town.id, Reply("spends the bucket"))
        with pytest.raises(DeliveryError) as limited:
            await mm.send(town.id, Reply("limited"))
        assert (limited.value.retryable, limited.value.retry_after) == (True, 2.0)
    finally:
        await mm.aclose()
