"""The Slack connector with the real slack-bolt and slack-sdk against the loopback fake."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiohttp.test_utils import TestServer
from pydantic import SecretStr

from connectors.slack import SlackConnector, create
from connectors.slack.connector import MAX_BODY_BYTES
from gateway.app.errors import ConnectorError, DeliveryError
from gateway.app.types import Reply
from gateway.config import SlackBotConfig
from tests.connectors.connector_helpers import Inbox, refused_port, services, wait_for
from tests.fakes.slack_server import FakeUser, SlackFake

BOT_TOKEN = "xoxb-1111-parrot-connector-token"
APP_TOKEN = "xapp-1-A1111-parrot-connector-app-token"
HOOK_TOKEN = "xoxb-2222-hook-connector-token"
SIGNING_SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
ALICE = FakeUser("U0ALICE", "alice")
OUTSIDER = FakeUser("U0ECHO", "echo", bot_id="B0ECHO")


def socket_config(**extra: Any) -> SlackBotConfig:
    values: dict[str, Any] = {
        "id": "parrot-sl",
        "platform": "slack",
        "agent": "parrot",
        "bot_token": SecretStr(BOT_TOKEN),
        "app_token": SecretStr(APP_TOKEN),
        **extra,
    }
    return SlackBotConfig(**values)


def events_config(**extra: Any) -> SlackBotConfig:
    values: dict[str, Any] = {
        "id": "hook-sl",
        "platform": "slack",
        "agent": "parrot",
        "bot_token": SecretStr(HOOK_TOKEN),
        "signing_secret": SecretStr(SIGNING_SECRET),
        **extra,
    }
    return SlackBotConfig(**values)


@pytest.fixture
async def fake() -> AsyncIterator[SlackFake]:
    async with SlackFake() as server:
        server.add_app(
            "parrot",
            bot_token=BOT_TOKEN,
            user_id="U0PARROT",
            bot_id="B0PARROT",
            app_token=APP_TOKEN,
        )
        server.add_app(
            "hook",
            bot_token=HOOK_TOKEN,
            user_id="U0HOOK",
            bot_id="B0HOOK",
            signing_secret=SIGNING_SECRET,
        )
        server.add_channel("C0LOBBY", "parrot", "hook")
        server.add_channel("C0OTHER", "parrot")
        server.add_channel("D0ALICE", "parrot", channel_type="im")
        yield server


Started = Callable[..., Awaitable[tuple[SlackConnector, Inbox]]]


@pytest.fixture
async def started(fake: SlackFake) -> AsyncIterator[Started]:
    """Start Socket Mode connectors on the fake; closes them at the end."""
    running: list[SlackConnector] = []

    async def start(**extra: Any) -> tuple[SlackConnector, Inbox]:
        connector = SlackConnector(
            socket_config(api_base_url=fake.base_url, **extra), services(), ping_interval=0.2
        )
        inbox = Inbox()
        await connector.start(inbox)
        running.append(connector)
        return connector, inbox

    yield start
    for connector in running:
        await connector.aclose()


@pytest.fixture
async def hook(fake: SlackFake) -> AsyncIterator[tuple[SlackConnector, Inbox]]:
    """An Events API connector whose route is served on loopback, registered with the fake."""
    lent = services()
    connector = create(events_config(api_base_url=fake.base_url), lent)
    server = TestServer(lent.http, host="127.0.0.1")
    await server.start_server()
    fake.apps["hook"].events_url = str(server.make_url("/slack/hook-sl/events"))
    inbox = Inbox()
    await connector.start(inbox)
    yield connector, inbox
    await connector.aclose()
    await server.close()


# ----------------------------------------------------------------- Socket Mode


async def test_socket_mode_start_identifies_the_bot_and_connects(
    fake: SlackFake, started: Started
) -> None:
    connector, _ = await started()
    assert connector.connected
    assert connector.socket_mode
    assert connector.bot_user_id == "U0PARROT"
    assert connector.capabilities.max_message_length == 4000
    assert connector.capabilities.ephemeral
    assert fake.apps["parrot"].connections == 1
    assert ("apps.connections.open", "parrot") in fake.calls


async def test_a_channel_message_is_handed_over_and_acknowledged(
    fake: SlackFake, started: Started
) -> None:
    _, inbox = await started()
    ts = fake.message("C0LOBBY", ALICE, "hello parrot")
    await wait_for(lambda: len(inbox.messages) == 1)
    message = inbox.messages[0]
    assert message.platform == "slack"
    assert message.bot_id == "parrot-sl"
    assert message.bot_user_id == "U0PARROT"
    assert message.channel_id == "C0LOBBY"
    assert message.message_id == ts
    assert message.sender_id == "U0ALICE"
    assert not message.sender_is_bot
    assert message.text == "hello parrot"
    await wait_for(lambda: not fake.pending("parrot"))
    assert fake.apps["parrot"].acks == [e["envelope_id"] for e in fake.apps["parrot"].envelopes]


async def test_a_mention_arrives_twice_with_the_same_message_key(
    fake: SlackFake, started: Started
) -> None:
    _, inbox = await started()
    fake.message("C0LOBBY", ALICE, "<@U0PARROT> are you there?")
    await wait_for(lambda: len(inbox.messages) == 2)
    first, second = inbox.messages
    assert first.message_key == second.message_key
    assert first.delivery_key == second.delivery_key
    assert first.mentions_bot
    assert second.mentions_bot
    assert first.text == second.text == "are you there?"


async def test_thread_reply_dm_and_outside_bot(fake: SlackFake, started: Started) -> None:
    _, inbox = await started()
    root = fake.message("C0LOBBY", ALICE, "a thread")
    fake.message("C0LOBBY", OUTSIDER, "in the thread", thread_ts=root)
    fake.message("D0ALICE", ALICE, "just us")
    await wait_for(lambda: len(inbox.messages) == 3)
    by_text = {m.text: m for m in inbox.messages}
    assert by_text["in the thread"].thread_id == root
    assert by_text["in the thread"].sender_is_bot
    assert by_text["in the thread"].sender_id == "U0ECHO"
    assert by_text["just us"].is_direct


async def test_own_posts_echoed_back_are_dropped(fake: SlackFake, started: Started) -> None:
    connector, inbox = await started()
    await connector.send("C0LOBBY", Reply("I said this"))
    await wait_for(lambda: not fake.pending("parrot"))
    fake.message("C0LOBBY", ALICE, "after")
    await wait_for(lambda: inbox.texts() == ["after"])


async def test_messages_of_one_channel_are_handed_over_in_order(
    fake: SlackFake, started: Started
) -> None:
    _, inbox = await started()
    inbox.gate = asyncio.Event()
    for n in range(3):
        fake.message("C0LOBBY", ALICE, f"lobby {n}")
    await wait_for(lambda: len(inbox.messages) == 1)
    fake.message("C0OTHER", ALICE, "other room")
    await wait_for(lambda: "other room" in inbox.texts())  # not held behind the lobby
    assert inbox.texts() == ["lobby 0", "other room"]
    inbox.gate.set()
    await wait_for(lambda: len(inbox.messages) == 4)
    assert [t for t in inbox.texts() if t.startswith("lobby")] == ["lobby 0", "lobby 1", "lobby 2"]


async def test_odd_payloads_are_dropped_and_counted(fake: SlackFake, started: Started) -> None:
    connector, inbox = await started()
    fake.deliver_event("parrot", {"type": "reaction_added", "user": "U0ALICE", "reaction": "x"})
    fake.deliver_event(
        "parrot",
        {
            "type": "message",
            "subtype": "channel_join",
            "user": "U0BOB",
            "channel": "C0LOBBY",
            "ts": "1.0",
            "text": "<@U0BOB> has joined the channel",
        },
    )
    fake.deliver_event(
        "parrot",
        {
            "type": "message",
            "subtype": "file_share",
            "user": "U0ALICE",
            "channel": "C0LOBBY",
            "ts": "2.0",
            "text": "",
            "files": [{"id": "F1"}],
        },
    )
    fake.deliver_event(
        "parrot", {"type": "message", "channel": "C0LOBBY", "ts": "3.0", "text": "?"}
    )
    fake.deliver_event("parrot", {"type": "message", "user": "U0ALICE", "text": "no channel"})
    fake.deliver("parrot", {"type": "mystery_payload"})
    fake.deliver_event("parrot", {"type": "message", "channel": 5, "ts": [], "user": {}})
    await fake.send_raw("parrot", "not json at all")
    await wait_for(lambda: sum(connector.dropped.values()) >= 6)
    fake.message("C0LOBBY", ALICE, "still listening?")
    await wait_for(lambda: inbox.texts() == ["still listening?"])
    assert connector.connected
    assert connector.dropped["unsupported"] >= 1
    assert connector.dropped["service_message"] == 1
    assert connector.dropped["no_text"] == 1
    assert connector.dropped["no_sender"] == 1
    assert connector.dropped["malformed"] >= 2


async def test_bolt_start_up_advice_about_the_environment_is_not_logged(
    started: Started, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-from-the-environment")
    with caplog.at_level(logging.WARNING, logger="connectors.slack"):
        connector, _ = await started()
    assert connector.connected
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


async def test_a_failing_pipeline_does_not_stop_the_connector(
    fake: SlackFake, started: Started
) -> None:
    connector, inbox = await started()
    inbox.fail = True
    fake.message("C0LOBBY", ALICE, "boom")
    await wait_for(lambda: connector.dropped["sink_error"] == 1)
    inbox.fail = False
    fake.message("C0LOBBY", ALICE, "fine")
    await wait_for(lambda: inbox.texts() == ["boom", "fine"])


@pytest.mark.parametrize("abrupt", [False, True], ids=["close-frame", "cut"])
async def test_reconnects_after_a_dropped_connection(
    fake: SlackFake, started: Started, abrupt: bool
) -> None:
    connector, inbox = await started()
    await fake.drop_connections("parrot", abrupt=abrupt)
    await wait_for(lambda: fake.apps["parrot"].connections == 2 and connector.connected)
    fake.message("C0LOBBY", ALICE, "are you back?")
    await wait_for(lambda: inbox.texts() == ["are you back?"])


async def test_reconnects_when_slack_asks_with_disconnect(
    fake: SlackFake, started: Started
) -> None:
    connector, inbox = await started()
    await fake.send_disconnect("parrot")
    await wait_for(lambda: fake.apps["parrot"].connections == 2)
    await wait_for(lambda: connector.connected)
    fake.message("C0LOBBY", ALICE, "after the refresh")
    await wait_for(lambda: inbox.texts() == ["after the refresh"])


async def test_slash_command_becomes_loop_text(fake: SlackFake, started: Started) -> None:
    _, inbox = await started()
    fake.slash_command("parrot", "C0LOBBY", ALICE, "status")
    await wait_for(lambda: len(inbox.messages) == 1)
    assert inbox.messages[0].text == "/loop status"
    assert inbox.messages[0].sender_id == "U0ALICE"
    await wait_for(lambda: not fake.pending("parrot"))


async def test_start_with_a_refused_bot_token_raises_without_the_token(fake: SlackFake) -> None:
    wrong = "xoxb-9999-not-a-known-token"
    connector = SlackConnector(
        socket_config(api_base_url=fake.base_url, bot_token=SecretStr(wrong)), services()
    )
    with pytest.raises(ConnectorError) as caught:
        await connector.start(Inbox())
    assert "invalid_auth" in str(caught.value)
    assert wrong not in str(caught.value)
    assert not connector.connected


async def test_start_with_a_refused_app_token_raises_without_the_token(fake: SlackFake) -> None:
    wrong = "xapp-1-A9-not-a-known-app-token"
    connector = SlackConnector(
        socket_config(api_base_url=fake.base_url, app_token=SecretStr(wrong)), services()
    )
    with pytest.raises(ConnectorError) as caught:
        await connector.start(Inbox())
    assert "apps.connections.open" in str(caught.value)
    assert wrong not in str(caught.value)


async def test_start_against_nothing_listening_raises_connector_error() -> None:
    with refused_port() as port:
        config = socket_config(api_base_url=f"http://127.0.0.1:{port}/api/")
        connector = SlackConnector(config, services())
        with pytest.raises(ConnectorError, match="auth.test failed"):
            await connector.start(Inbox())


async def test_aclose_cancels_waiting_hand_overs(fake: SlackFake, started: Started) -> None:
    connector, inbox = await started()
    inbox.gate = asyncio.Event()
    fake.message("C0LOBBY", ALICE, "held")
    fake.message("C0LOBBY", ALICE, "queued behind")
    await wait_for(lambda: len(inbox.messages) == 1)
    await connector.aclose()
    assert not connector.connected
    assert inbox.texts() == ["held"]


# ----------------------------------------------------------------- sending


async def test_send_posts_in_the_thread_and_returns_the_ts(
    fake: SlackFake, started: Started
) -> None:
    connector, _ = await started()
    root = fake.message("C0LOBBY", ALICE, "root")
    ts = await connector.send("C0LOBBY", Reply("in thread", thread_id=root, reply_to=root))
    top = await connector.send("C0LOBBY", Reply("top level"))
    first, second = fake.posted
    assert (first.text, first.thread_ts, first.ts) == ("in thread", root, ts)
    assert (second.text, second.thread_ts, second.ts) == ("top level", None, top)


async def test_send_ephemeral_goes_to_one_user(fake: SlackFake, started: Started) -> None:
    connector, _ = await started()
    await connector.send("C0LOBBY", Reply("only you", ephemeral_to="U0ALICE"))
    [posted] = fake.posted
    assert posted.ephemeral_to == "U0ALICE"
    assert posted.text == "only you"


async def test_rate_limit_raises_retryable_error_with_retry_after(
    fake: SlackFake, started: Started
) -> None:
    connector, _ = await started()
    fake.fail_next_posts(1, retry_after=7)
    with pytest.raises(DeliveryError) as caught:
        await connector.send("C0LOBBY", Reply("slow down"))
    assert caught.value.retryable
    assert caught.value.retry_after == 7
    assert fake.posted == []
    await connector.send("C0LOBBY", Reply("slow down"))
    assert fake.texts() == ["slow down"]
    assert fake.post_attempts == 2


async def test_other_send_failures_are_not_retryable(fake: SlackFake, started: Started) -> None:
    connector, _ = await started()
    with pytest.raises(DeliveryError, match="channel_not_found") as caught:
        await connector.send("C0NOWHERE", Reply("hello?"))
    assert not caught.value.retryable
    assert BOT_TOKEN not in str(caught.value)


async def test_send_before_start_is_retryable(fake: SlackFake) -> None:
    connector = SlackConnector(socket_config(api_base_url=fake.base_url), services())
    with pytest.raises(DeliveryError) as caught:
        await connector.send("C0LOBBY", Reply("early"))
    assert caught.value.retryable
    await connector.typing("C0LOBBY", None)


# ----------------------------------------------------------------- Events API


async def test_events_api_route_is_added_only_without_an_app_token(fake: SlackFake) -> None:
    events = services()
    create(events_config(api_base_url=fake.base_url), events)
    socket = services()
    create(socket_config(api_base_url=fake.base_url), socket)
    paths = [r.resource.canonical for r in events.http.router.routes() if r.resource]
    assert paths == ["/slack/hook-sl/events"]
    assert list(socket.http.router.routes()) == []


async def test_events_api_delivers_signed_events(
    fake: SlackFake, hook: tuple[SlackConnector, Inbox]
) -> None:
    connector, inbox = hook
    assert connector.connected
    assert not connector.socket_mode
    fake.message("C0LOBBY", ALICE, "<@U0HOOK> hi hook")
    await wait_for(lambda: len(inbox.messages) == 2)
    assert fake.apps["hook"].http_answers == [200, 200]
    assert inbox.texts() == ["hi hook", "hi hook"]
    assert all(m.mentions_bot for m in inbox.messages)


async def test_events_api_url_verification_answers_the_challenge(
    fake: SlackFake, hook: tuple[SlackConnector, Inbox]
) -> None:
    payload = {
        "token": "x",
        "challenge": "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P",
        "type": "url_verification",
    }
    status, body = await fake.post_event("hook", payload)
    assert status == 200
    assert json.loads(body) == {"challenge": payload["challenge"]}


async def test_events_api_refuses_forged_stale_and_unsigned_requests(
    fake: SlackFake, hook: tuple[SlackConnector, Inbox]
) -> None:
    connector, inbox = hook
    event = fake.event_callback(
        "hook",
        {
            "type": "message",
            "user": "U0ALICE",
            "channel": "C0LOBBY",
            "ts": "9.1",
            "text": "let me in",
        },
    )
    assert (await fake.post_event("hook", event, signed=False))[0] == 401
    assert (await fake.post_event("hook", event, secret="not-the-secret"))[0] == 401
    stale = int(time.time()) - 600
    assert (await fake.post_event("hook", event, timestamp=stale))[0] == 401
    assert connector.dropped["unauthorized"] == 3
    assert (await fake.post_event("hook", event))[0] == 200
    await wait_for(lambda: inbox.texts() == ["let me in"])


async def test_events_api_rejects_bodies_that_are_not_payloads(
    fake: SlackFake, hook: tuple[SlackConnector, Inbox]
) -> None:
    connector, inbox = hook
    assert (await fake.post_event("hook", "{oops"))[0] == 400
    assert (await fake.post_event("hook", "[1, 2]"))[0] == 400
    form = "application/x-www-form-urlencoded"
    assert (await fake.post_event("hook", "a=1", content_type=form))[0] == 400
    assert (await fake.post_event("hook", {"type": "mystery_payload"}))[0] == 200
    assert connector.dropped["malformed"] == 3
    fake.message("C0LOBBY", ALICE, "after the junk")
    await wait_for(lambda: inbox.texts() == ["after the junk"])


async def test_events_api_retries_reach_the_sink_with_the_same_key(
    fake: SlackFake, hook: tuple[SlackConnector, Inbox]
) -> None:
    _, inbox = hook
    event = fake.event_callback(
        "hook",
        {"type": "message", "user": "U0ALICE", "channel": "C0LOBBY", "ts": "9.2", "text": "once"},
    )
    assert (await fake.post_event("hook", event))[0] == 200
    assert (await fake.post_event("hook", event, retry_num=1))[0] == 200
    await wait_for(lambda: len(inbox.messages) == 2)
    assert inbox.messages[0].delivery_key == inbox.messages[1].delivery_key


async def test_events_api_slash_command_is_form_encoded(
    fake: SlackFake, hook: tuple[SlackConnector, Inbox]
) -> None:
    _, inbox = hook
    fake.slash_command("hook", "C0LOBBY", ALICE, "reset")
    await wait_for(lambda: inbox.texts() == ["/loop reset"])
    await wait_for(lambda: fake.apps["hook"].http_answers == [200])


async def test_events_api_before_start_answers_503(fake: SlackFake) -> None:
    lent = services()
    connector = create(events_config(api_base_url=fake.base_url), lent)
    server = TestServer(lent.http, host="127.0.0.1")
    await server.start_server()
    try:
        fake.apps["hook"].events_url = str(server.make_url("/slack/hook-sl/events"))
        event = fake.event_callback("hook", {"type": "message"})
        assert (await fake.post_event("hook", event))[0] == 503
        assert not connector.connected
    finally:
        await server.close()


DEEP = "[" * 50_000 + "]" * 50_000
HUGE_NUMBER = '{"type": "event_callback", "n": ' + "9" * 5_000 + "}"


@pytest.mark.parametrize(
    ("body", "why"),
    [
        pytest.param(DEEP, "nested deeper", id="nested-50k"),
        pytest.param(
            '{"a": ' + "[" * 20_000 + "]" * 20_000 + "}", "nested deeper", id="nested-20k"
        ),
        pytest.param(HUGE_NUMBER, "not acceptable JSON", id="5000-digits"),
        pytest.param('{"n": NaN}', "NaN", id="nan"),
        pytest.param('{"n": 1e999}', "out of range", id="overflow"),
        pytest.param(b'{"text": "caf\xe9"}', "not UTF-8", id="latin-1"),
        pytest.param(b"command=/loop&text=caf\xe9", "not UTF-8", id="latin-1-form"),
    ],
)
async def test_issue9_events_api_refuses_hostile_signed_bodies_with_400(
    fake: SlackFake,
    hook: tuple[SlackConnector, Inbox],
    caplog: pytest.LogCaptureFixture,
    body: str | bytes,
    why: str,
) -> None:
    connector, inbox = hook
    form = isinstance(body, bytes) and body.startswith(b"command=")
    content_type = "application/x-www-form-urlencoded" if form else "application/json"
    with caplog.at_level(logging.WARNING):
        status, answer = await fake.post_event("hook", body, content_type=content_type)
        assert (status, why in answer) == (400, True)
        assert (await fake.post_event("hook", body, signed=False))[0] == 401
    assert connector.dropped["malformed"] == 1
    assert connector.dropped["unauthorized"] == 1
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    fake.message("C0LOBBY", ALICE, "after the hostile body")
    await wait_for(lambda: inbox.texts() == ["after the hostile body"])


async def test_issue9_events_api_answers_413_to_a_body_over_the_limit(
    fake: SlackFake, hook: tuple[SlackConnector, Inbox]
) -> None:
    connector, inbox = hook
    event = fake.event_callback("hook", {"type": "message", "text": "x" * MAX_BODY_BYTES})
    assert (await fake.post_event("hook", event))[0] == 413
    assert connector.dropped["too_large"] == 1
    fake.message("C0LOBBY", ALICE, "after the flood")
    await wait_for(lambda: inbox.texts() == ["after the flood"])


@pytest.mark.parametrize(
    "event",
    ["a string", ["a", "list"], 5, None, {"type": 5}, {"text": "no type"}],
    ids=["string", "list", "number", "null", "type-number", "no-type"],
)
async def test_issue9_events_api_drops_an_event_that_is_not_an_object_with_200(
    fake: SlackFake,
    hook: tuple[SlackConnector, Inbox],
    caplog: pytest.LogCaptureFixture,
    event: object,
) -> None:
    connector, inbox = hook
    payload = fake.event_callback("hook", {})
    payload["event"] = event
    with caplog.at_level(logging.WARNING):
        assert (await fake.post_event("hook", payload)) == (200, "")
    assert connector.dropped["malformed"] == 1
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    fake.message("C0LOBBY", ALICE, "after the odd event")
    await wait_for(lambda: inbox.texts() == ["after the odd event"])


async def test_issue9_socket_mode_drops_an_event_that_is_not_an_object(
    fake: SlackFake, started: Started
) -> None:
    connector, inbox = await started()
    payload = fake.event_callback("parrot", {})
    payload["event"] = "a string"
    fake.deliver("parrot", payload)
    await wait_for(lambda: connector.dropped["malformed"] == 1)
    fake.message("C0LOBBY", ALICE, "still here")
    await wait_for(lambda: inbox.texts() == ["still here"])
    await wait_for(lambda: not fake.pending("parrot"))
    assert fake.apps["parrot"].acks == [e["envelope_id"] for e in fake.apps["parrot"].envelopes]
