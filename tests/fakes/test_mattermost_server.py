"""The fake Mattermost, driven with plain aiohttp: REST v4, the websocket stream, rate limits."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import WSMsgType

from tests.fakes.mattermost_server import FakeChannel, FakeUser, MattermostFake


class _Clock:
    """A clock the test moves by hand, so the rate limit never depends on wall time."""

    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> _Clock:
    return _Clock()


@pytest.fixture
async def fake(clock: _Clock) -> AsyncIterator[MattermostFake]:
    async with MattermostFake(clock=clock) as server:
        yield server


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


def _auth(user: FakeUser) -> dict[str, str]:
    return {"Authorization": f"Bearer {user.token}"}


def _world(fake: MattermostFake) -> tuple[FakeUser, FakeUser, FakeChannel]:
    bot = fake.add_user("helper", is_bot=True)
    alice = fake.add_user("alice")
    town = fake.add_channel("town-square", [bot, alice], display_name="Town Square")
    return bot, alice, town


async def _challenge(ws: aiohttp.ClientWebSocketResponse, token: str | None) -> list[Any]:
    """Authenticate with the authentication_challenge action; the hello event and the answer."""
    await ws.send_json({"seq": 1, "action": "authentication_challenge", "data": {"token": token}})
    return [await ws.receive_json(timeout=5), await ws.receive_json(timeout=5)]


async def test_issue23_rest_answers_a_bot_token_and_refuses_none(
    fake: MattermostFake, http: aiohttp.ClientSession
) -> None:
    bot, alice, town = _world(fake)
    secret = fake.add_channel("secret", [alice], channel_type="P")

    async with http.get(f"{fake.url}/api/v4/users/me", headers=_auth(bot)) as me:
        assert me.status == 200
        assert {k: v for k, v in (await me.json()).items() if k in ("id", "is_bot")} == {
            "id": bot.id,
            "is_bot": True,
        }
    async with http.get(f"{fake.url}/api/v4/users/{alice.id}", headers=_auth(bot)) as user:
        assert (await user.json())["username"] == "alice"
        assert (await user.json())["is_bot"] is False
    async with http.get(f"{fake.url}/api/v4/users/me", headers=_auth(alice)) as anonymous:
        assert anonymous.status == 401
        assert (await anonymous.json())["id"] == "api.context.session_expired.app_error"
    async with http.get(f"{fake.url}/api/v4/users/me") as missing:
        assert missing.status == 401
    async with http.get(f"{fake.url}/api/v4/channels/{town.id}", headers=_auth(bot)) as channel:
        assert (await channel.json())["type"] == "O"
    async with http.get(f"{fake.url}/api/v4/channels/{secret.id}", headers=_auth(bot)) as hidden:
        assert hidden.status == 403


async def test_issue23_websocket_streams_posts_and_edits(
    fake: MattermostFake, http: aiohttp.ClientSession
) -> None:
    bot, alice, town = _world(fake)
    async with http.ws_connect(fake.websocket_url) as ws:
        hello, answer = await _challenge(ws, bot.token)
        assert hello["event"] == "hello"
        assert hello["seq"] == 0
        assert hello["broadcast"]["user_id"] == bot.id
        assert answer == {"status": "OK", "seq_reply": 1}

        asked = fake.post_as(alice, town.id, "hi @helper, what is up?")
        posted = await ws.receive_json(timeout=5)
        assert (posted["event"], posted["seq"]) == ("posted", 1)
        assert posted["broadcast"]["channel_id"] == town.id
        assert posted["data"]["channel_type"] == "O"
        assert posted["data"]["sender_name"] == "@alice"
        assert json.loads(posted["data"]["mentions"]) == [bot.id]
        post = json.loads(posted["data"]["post"])
        assert (post["id"], post["user_id"], post["message"]) == (
            asked["id"],
            alice.id,
            "hi @helper, what is up?",
        )

        reply_body = {"channel_id": town.id, "message": "all good", "root_id": asked["id"]}
        async with http.post(
            f"{fake.url}/api/v4/posts", json=reply_body, headers=_auth(bot)
        ) as created:
            assert created.status == 201
            reply = await created.json()
        assert reply["user_id"] == bot.id
        assert reply["root_id"] == asked["id"]
        assert reply["props"]["from_bot"] == "true"
        assert reply["create_at"] > 0
        own = await ws.receive_json(timeout=5)
        assert json.loads(own["data"]["post"])["id"] == reply["id"]

        patch = {"message": "all good, edited"}
        async with http.put(
            f"{fake.url}/api/v4/posts/{reply['id']}/patch", json=patch, headers=_auth(bot)
        ) as edited:
            assert edited.status == 200
        edit_event = await ws.receive_json(timeout=5)
        assert edit_event["event"] == "post_edited"
        assert json.loads(edit_event["data"]["post"])["message"] == "all good, edited"

        fake.post_as(alice, town.id, "deploy done", webhook=True, override_username="ci")
        hook = await ws.receive_json(timeout=5)
        assert hook["data"]["sender_name"] == "ci"
        assert json.loads(hook["data"]["post"])["props"]["from_webhook"] == "true"

    assert fake.texts(bot) == ["all good, edited"]
    assert [e["message"] for e in fake.edits] == ["all good, edited"]
    assert fake.post(asked["id"])["reply_count"] == 1


async def test_issue23_websocket_header_auth_bad_tokens_and_early_actions(
    fake: MattermostFake, http: aiohttp.ClientSession
) -> None:
    bot, _, _ = _world(fake)
    async with http.ws_connect(fake.websocket_url, headers=_auth(bot)) as ws:
        assert (await ws.receive_json(timeout=5))["event"] == "hello"
    async with http.ws_connect(fake.websocket_url) as ws:
        await ws.send_json({"seq": 1, "action": "ping"})
        refused = await ws.receive_json(timeout=5)
        assert refused["status"] == "FAIL"
        assert refused["error"]["id"] == "api.web_socket_router.not_authenticated.app_error"
        await ws.send_json(
            {"seq": 2, "action": "authentication_challenge", "data": {"token": "wrong"}}
        )
        closed = await ws.receive(timeout=5)
        assert closed.type in (WSMsgType.CLOSE, WSMsgType.CLOSED)


async def test_issue23_rate_limit_answers_429_with_its_headers(
    fake: MattermostFake, http: aiohttp.ClientSession, clock: _Clock
) -> None:
    bot, _, town = _world(fake)
    fake.set_rate_limit(2, per_second=1)
    url = f"{fake.url}/api/v4/posts"
    body = {"channel_id": town.id, "message": "hello"}

    statuses = []
    for _ in range(3):
        async with http.post(url, json=body, headers=_auth(bot)) as answer:
            statuses.append(answer.status)
            last = answer
            text = await answer.text()
    clock.now += 1
    async with http.post(url, json=body, headers=_auth(bot)) as later:
        assert later.status == 201

    assert statuses == [201, 201, 429]
    assert text == "limit exceeded\n"
    assert last.headers["X-RateLimit-Limit"] == "2"
    assert last.headers["X-RateLimit-Remaining"] == "0"
    assert last.headers["X-RateLimit-Reset"] == "2"
    assert last.headers["Retry-After"] == "1"
    assert fake.texts(bot) == ["hello", "hello", "hello"]

    fake.set_rate_limit(1, per_second=1, retry_after=False)
    for _ in range(2):
        async with http.post(url, json=body, headers=_auth(bot)) as answer:
            reset_only = answer
    assert reset_only.status == 429
    assert "Retry-After" not in reset_only.headers
    assert reset_only.headers["X-RateLimit-Reset"] == "1"


async def test_issue23_dropped_websockets_close_and_reconnect(
    fake: MattermostFake, http: aiohttp.ClientSession
) -> None:
    bot, alice, town = _world(fake)
    async with http.ws_connect(fake.websocket_url) as first:
        await _challenge(first, bot.token)
        await fake.wait_connected(bot)
        await fake.drop_connections(bot)
        closed = await first.receive(timeout=5)
        assert closed.type in (WSMsgType.CLOSE, WSMsgType.CLOSED)
    async with http.ws_connect(fake.websocket_url) as second:
        await _challenge(second, bot.token)
        await fake.wait_connected(bot)
        assert fake.connections(bot) == 1
        fake.post_as(alice, town.id, "still there?")
        posted = await second.receive_json(timeout=5)
        assert json.loads(posted["data"]["post"])["message"] == "still there?"


async def test_issue23_rate_limit_refuses_a_limit_that_cannot_refill(
    fake: MattermostFake,
) -> None:
    with pytest.raises(ValueError, match="per_second > 0"):
        fake.set_rate_limit(5, per_second=0)
    with pytest.raises(ValueError, match="limit >= 1"):
        fake.set_rate_limit(0, per_second=1)


async def test_issue23_posts_since_answers_what_changed_after_it_with_thread_roots(
    fake: MattermostFake, http: aiohttp.ClientSession, clock: _Clock
) -> None:
    bot, alice, town = _world(fake)
    other = fake.add_channel("other", [bot, alice])
    root = fake.post_as(alice, town.id, "an old root")
    clock.now += 1
    edited = fake.post_as(alice, town.id, "will be edited")
    fake.post_as(alice, other.id, "elsewhere")
    clock.now += 1
    since = int(clock.now * 1000) - 1
    fake.edit_as(edited["id"], "edited")
    clock.now += 1
    reply = fake.post_as(alice, town.id, "a reply", root_id=root["id"])
    gone = fake.post_as(alice, town.id, "deleted soon")
    fake.delete_as(gone["id"])

    url = f"{fake.url}/api/v4/channels/{town.id}/posts"
    async with http.get(url, params={"since": str(since)}, headers=_auth(bot)) as answer:
        assert answer.status == 200
        listed = await answer.json()
    assert set(listed["order"]) == {edited["id"], reply["id"], gone["id"], root["id"]}
    assert listed["order"][-1] == root["id"]  # the thread's root, after the changed posts
    assert listed["posts"][edited["id"]]["message"] == "edited"
    assert listed["posts"][gone["id"]]["delete_at"] > 0
    async with http.get(url, headers=_auth(bot)) as page:
        assert (await page.json())["order"] == [reply["id"], edited["id"], root["id"]]
    for bad in ("soon", "-1", "1e3", "9" * 5000):
        async with http.get(url, params={"since": bad}, headers=_auth(bot)) as refused:
            assert refused.status == 400
            assert "since" in (await refused.json())["message"]


async def test_issue23_user_channels_lists_the_callers_channels_with_their_last_post(
    fake: MattermostFake, http: aiohttp.ClientSession, clock: _Clock
) -> None:
    bot, alice, town = _world(fake)
    fake.add_channel("alice only", [alice], channel_type="P")
    posted = fake.post_as(alice, town.id, "hello")
    for who in ("me", bot.id):
        async with http.get(f"{fake.url}/api/v4/users/{who}/channels", headers=_auth(bot)) as mine:
            channels = await mine.json()
        assert [(c["id"], c["last_post_at"]) for c in channels] == [(town.id, posted["create_at"])]
    async with http.get(
        f"{fake.url}/api/v4/users/{alice.id}/channels", headers=_auth(bot)
    ) as others:
        assert others.status == 403


async def test_issue23_refused_websockets_answer_503_until_allowed_again(
    fake: MattermostFake, http: aiohttp.ClientSession
) -> None:
    bot, _, _ = _world(fake)
    fake.refuse_websockets = True
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        await http.ws_connect(fake.websocket_url)
    assert refused.value.status == 503
    fake.refuse_websockets = False
    async with http.ws_connect(fake.websocket_url) as ws:
        hello, _ = await _challenge(ws, bot.token)
        assert hello["event"] == "hello"


async def test_issue23_a_pending_post_id_seen_in_the_last_30_seconds_posts_nothing_again(
    fake: MattermostFake, http: aiohttp.ClientSession, clock: _Clock
) -> None:
    bot, _, town = _world(fake)
    url = f"{fake.url}/api/v4/posts"
    body = {"channel_id": town.id, "message": "once", "pending_post_id": "lw123"}
    ids = []
    for wait in (0, 29, 2):
        clock.now += wait
        async with http.post(url, json=body, headers=_auth(bot)) as answer:
            assert answer.status == 201
            ids.append((await answer.json())["id"])
    assert ids[0] == ids[1] != ids[2]  # 31 seconds after the first, it is a new post
    assert fake.texts(bot) == ["once", "once"]
