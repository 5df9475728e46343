"""The Telegram connector with the real python-telegram-bot against the loopback fake."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from pydantic import SecretStr

from connectors.lanes import Lanes
from connectors.telegram import TelegramConnector, create
from connectors.telegram.connector import MAX_BODY_BYTES, TIMING
from connectors.timing import Timing
from gateway.app.connector import ConnectorServices
from gateway.app.errors import ConnectorError, DeliveryError, GatewayStopping
from gateway.app.types import InboundMessage, Reply
from gateway.config import TelegramBotConfig
from tests.connectors.connector_helpers import Inbox, services, wait_for
from tests.fakes.telegram_server import FakeChat, FakeUser, TelegramFake

TOKEN = "123456:AAHfakeTokenForTestsOnly_abcdefghijk"
TOKEN_B = "654321:BBHfakeTokenForTestsOnly_abcdefghijk"
TOKEN_C = "111111:CCHfakeTokenForTestsOnly_abcdefghijk"
SECRET = "s3cret-webhook-token"
ALICE = FakeUser(5678, "Alice", "alice")
GROUP = FakeChat(-1001, "supergroup", "Lounge")
OTHER_GROUP = FakeChat(-1002, "supergroup", "Elsewhere")
FORUM = FakeChat(-1003, "supergroup", "Forum", is_forum=True)
FAST = Timing(retry_delays=(0.01, 0.05))


def config(token: str = TOKEN, bot_id: str = "parrot-tg", **extra: Any) -> TelegramBotConfig:
    return TelegramBotConfig(
        id=bot_id,
        platform="telegram",
        agent="parrot",
        token=SecretStr(token),
        poll_timeout=1,
        **extra,
    )


@pytest.fixture(autouse=True)
def _timedelta_periods(monkeypatch: pytest.MonkeyPatch) -> None:
    """Opt in to PTB's timedelta periods, else its RetryAfter warns (an error under pytest)."""
    monkeypatch.setenv("PTB_TIMEDELTA", "true")


@pytest.fixture
async def fake() -> AsyncIterator[TelegramFake]:
    async with TelegramFake() as server:
        server.add_bot(TOKEN, 7001, "ParrotBot")
        server.add_bot(TOKEN_B, 7002, "EchoBot")
        server.add_bot(TOKEN_C, 7003, "QuietBot")
        server.add_chat(GROUP, TOKEN, TOKEN_B, TOKEN_C)
        server.add_chat(OTHER_GROUP, TOKEN)
        server.add_chat(FORUM, TOKEN)
        yield server


Started = Callable[..., Awaitable[tuple[TelegramConnector, Inbox]]]


@pytest.fixture
async def started(fake: TelegramFake) -> AsyncIterator[Started]:
    """Start connectors on one shared services object; closes them at the end."""
    lent = services()
    running: list[TelegramConnector] = []

    async def start(
        token: str = TOKEN, bot_id: str = "parrot-tg"
    ) -> tuple[TelegramConnector, Inbox]:
        connector = TelegramConnector(
            config(token, bot_id, api_base_url=fake.base_url),
            lent,
            timing=FAST,
        )
        inbox = Inbox()
        await connector.start(inbox)
        running.append(connector)
        return connector, inbox

    yield start
    for connector in running:
        await connector.aclose()


async def test_start_identifies_the_bot_and_polls(fake: TelegramFake, started: Started) -> None:
    connector, inbox = await started()
    assert connector.connected
    assert connector.bot_user_id == "7001"
    assert (TOKEN, "deletewebhook") in fake.calls
    fake.group_message(GROUP, ALICE, "hello")
    await wait_for(lambda: len(inbox.messages) == 1)
    message = inbox.messages[0]
    assert message.text == "hello"
    assert message.channel_id == str(GROUP.id)
    assert message.sender_id == "5678"
    assert message.bot_user_id == "7001"
    assert fake.bots[TOKEN].allowed_updates == ["message"]


async def test_offset_is_confirmed_only_after_the_sink_returned(
    fake: TelegramFake, started: Started
) -> None:
    connector, inbox = await started()
    inbox.gate = asyncio.Event()
    [update] = fake.group_message(OTHER_GROUP, ALICE, "slow")
    await wait_for(lambda: len(inbox.messages) == 1)
    polls = fake.bots[TOKEN].polls
    # While the sink holds the update, no new getUpdates confirms it: not even in the time
    # a whole Bot API round trip takes, far longer than a poller needs to ask again.
    await connector.send(str(OTHER_GROUP.id), Reply(text="meanwhile"))
    assert fake.bots[TOKEN].polls == polls
    assert [u["update_id"] for u in fake.pending(TOKEN)] == [update["update_id"]]
    inbox.gate.set()
    await wait_for(lambda: not fake.pending(TOKEN))
    assert fake.bots[TOKEN].confirmed_offset == update["update_id"] + 1


async def test_chats_overlap_but_one_chat_keeps_its_order(
    fake: TelegramFake, started: Started
) -> None:
    inbox_gate = asyncio.Event()
    connector, inbox = await started()
    seen: list[str] = []

    async def sink(message: InboundMessage) -> None:
        seen.append(message.text)
        if message.text == "first":
            await inbox_gate.wait()

    connector._runtime.sink = sink
    fake.group_message(GROUP, ALICE, "first")
    fake.group_message(GROUP, ALICE, "second")
    fake.group_message(OTHER_GROUP, ALICE, "elsewhere")
    await wait_for(lambda: "elsewhere" in seen)
    assert "second" not in seen
    inbox_gate.set()
    await wait_for(lambda: seen[-1] == "second")
    assert inbox.messages == []


async def test_odd_updates_are_dropped_and_polling_goes_on(
    fake: TelegramFake, started: Started
) -> None:
    connector, inbox = await started()
    fake.unknown_update(TOKEN)
    fake.photo_message(GROUP, ALICE)
    fake.service_message(GROUP, ALICE, FakeUser(9, "Newcomer"))
    fake.senderless_message(GROUP, "who said this")
    fake.deliver(TOKEN, {"message": {"message_id": 1}})
    fake.deliver(TOKEN, {"message": "not an object"})
    fake.group_message(GROUP, ALICE, "still here")
    await wait_for(lambda: inbox.texts() == ["still here"])
    await wait_for(lambda: not fake.pending(TOKEN))
    assert connector.dropped == {
        "unsupported": 1,
        "no_text": 2,
        "no_sender": 1,
        "malformed": 2,
    }


async def test_a_failing_sink_leaves_the_update_to_be_fetched_again(
    fake: TelegramFake, started: Started
) -> None:
    connector, inbox = await started()
    inbox.fail = True
    [boom] = fake.group_message(OTHER_GROUP, ALICE, "boom")
    fake.group_message(OTHER_GROUP, ALICE, "after boom")
    await wait_for(lambda: inbox.texts().count("boom") >= 2)
    # The chat stops at the failed update: the next one of it was not handed over.
    assert "after boom" not in inbox.texts()
    assert fake.pending(TOKEN)[0]["update_id"] == boom["update_id"]
    inbox.fail = False
    await wait_for(lambda: inbox.texts()[-2:] == ["boom", "after boom"])
    await wait_for(lambda: not fake.pending(TOKEN))


async def test_an_update_the_sink_keeps_refusing_is_dropped_in_the_end(
    fake: TelegramFake, started: Started
) -> None:
    connector, inbox = await started()
    inbox.fail = True
    fake.group_message(OTHER_GROUP, ALICE, "poison")
    await wait_for(lambda: connector.dropped["sink_error"] == 1)
    assert inbox.texts() == ["poison"] * 5
    inbox.fail = False
    fake.group_message(OTHER_GROUP, ALICE, "fine")
    await wait_for(lambda: inbox.texts()[-1] == "fine")
    assert inbox.texts().count("poison") == 5


async def test_an_update_refused_while_the_gateway_stops_is_left_for_the_next_run(
    fake: TelegramFake, started: Started
) -> None:
    connector, _ = await started()
    refused: list[str] = []

    async def stopping(message: InboundMessage) -> None:
        refused.append(message.text)
        raise GatewayStopping("the gateway is stopping")

    connector._runtime.sink = stopping
    [update] = fake.group_message(OTHER_GROUP, ALICE, "too late")
    # Polling ends at the first refusal (no task is left); it is no failure of the
    # pipeline, so it is neither retried until given up nor ever dropped.
    await wait_for(lambda: refused == ["too late"] and len(connector._tasks) == 0)
    await connector.aclose()
    assert refused == ["too late"]
    assert connector.dropped["sink_error"] == 0
    assert fake.bots[TOKEN].confirmed_offset <= update["update_id"]
    assert [u["update_id"] for u in fake.pending(TOKEN)] == [update["update_id"]]


async def test_dropped_connection_reconnects(fake: TelegramFake, started: Started) -> None:
    connector, inbox = await started()
    fake.drop_next_polls(2)
    polls = fake.bots[TOKEN].polls
    fake.bots[TOKEN].wakeup.set()
    await wait_for(lambda: fake.bots[TOKEN].polls > polls)
    fake.group_message(GROUP, ALICE, "after the drop")
    await wait_for(lambda: inbox.texts() == ["after the drop"])
    assert connector.connected
    assert fake.pending_drops == 0


async def test_forum_topic_and_direct_messages(fake: TelegramFake, started: Started) -> None:
    connector, inbox = await started()
    fake.topic_message(FORUM, ALICE, "in a topic", topic=17)
    fake.private_message(TOKEN, ALICE, "just us")
    await wait_for(lambda: len(inbox.messages) == 2)
    by_text = {m.text: m for m in inbox.messages}
    assert by_text["in a topic"].thread_id == "17"
    assert by_text["just us"].is_direct
    assert by_text["just us"].channel_id == str(ALICE.id)


async def test_send_posts_one_message_with_thread_and_reply(
    fake: TelegramFake, started: Started
) -> None:
    connector, _ = await started()
    [update] = fake.topic_message(FORUM, ALICE, "question", topic=17)
    asked = update["message"]["message_id"]
    message_id = await connector.send(
        str(FORUM.id), Reply(text="answer", thread_id="17", reply_to=str(asked))
    )
    [sent] = fake.sent
    assert message_id == str(sent.message_id)
    assert (sent.chat_id, sent.text, sent.thread_id, sent.reply_to) == (
        FORUM.id,
        "answer",
        17,
        asked,
    )


async def test_rate_limit_raises_a_retryable_delivery_error(
    fake: TelegramFake, started: Started
) -> None:
    connector, _ = await started()
    fake.fail_next_sends(1, retry_after=3)
    with pytest.raises(DeliveryError) as caught:
        await connector.send(str(GROUP.id), Reply(text="hi"))
    assert caught.value.retryable
    assert caught.value.retry_after == 3.0
    assert fake.sent == []
    await connector.send(str(GROUP.id), Reply(text="hi"))
    assert [m.text for m in fake.sent] == ["hi"]


async def test_refused_send_is_not_retryable_and_names_no_token(
    fake: TelegramFake, started: Started
) -> None:
    connector, _ = await started()
    with pytest.raises(DeliveryError) as caught:
        await connector.send("-4242", Reply(text="hi"))
    assert not caught.value.retryable
    assert "chat not found" in str(caught.value).lower()
    assert TOKEN not in str(caught.value)


async def test_send_when_the_api_is_gone_is_retryable() -> None:
    async with TelegramFake() as gone:
        gone.add_bot(TOKEN, 7001, "ParrotBot")
        connector = TelegramConnector(
            config(api_base_url=gone.base_url),
            services(),
            timing=FAST,
        )
        await connector.start(Inbox())
    try:
        with pytest.raises(DeliveryError) as caught:
            await connector.send(str(GROUP.id), Reply(text="hi"))
        assert caught.value.retryable
        assert TOKEN not in str(caught.value)
        await wait_for(lambda: not connector.connected)
    finally:
        await connector.aclose()


async def test_typing_sends_a_chat_action(fake: TelegramFake, started: Started) -> None:
    connector, _ = await started()
    await connector.typing(str(FORUM.id), "17")
    await connector.typing("-4242", None)  # unknown chat: best effort, no error
    assert [(a.chat_id, a.action, a.thread_id) for a in fake.chat_actions] == [
        (FORUM.id, "typing", 17)
    ]


async def test_typing_waits_and_is_skipped_when_the_reply_came_first(
    fake: TelegramFake,
) -> None:
    slept: list[float] = []
    wake = asyncio.Event()

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        await wake.wait()

    connector = TelegramConnector(
        config(api_base_url=fake.base_url),
        services(),
        timing=replace(TIMING, sleep=sleep),
    )
    await connector.start(Inbox())
    try:
        quick = asyncio.create_task(connector.typing(str(GROUP.id), None))
        slow = asyncio.create_task(connector.typing(str(OTHER_GROUP.id), None))
        await wait_for(lambda: len(slept) == 2)
        await connector.send(str(GROUP.id), Reply(text="quick answer"))
        wake.set()
        await asyncio.gather(quick, slow)
        assert slept == [1.0, 1.0]
        assert [a.chat_id for a in fake.chat_actions] == [OTHER_GROUP.id]
    finally:
        await connector.aclose()


async def test_refused_token_is_a_connector_error_without_the_token(fake: TelegramFake) -> None:
    bad = "999:WRONGtokenWRONGtokenWRONGtoken"
    connector = TelegramConnector(
        config(bad, api_base_url=fake.base_url),
        services(),
    )
    with pytest.raises(ConnectorError) as caught:
        await connector.start(Inbox())
    assert "refused the token" in str(caught.value)
    assert bad not in str(caught.value)
    assert not connector.connected
    await connector.aclose()


async def test_aclose_confirms_handled_updates(fake: TelegramFake, started: Started) -> None:
    connector, inbox = await started()
    [update] = fake.group_message(OTHER_GROUP, ALICE, "last words")
    await wait_for(lambda: len(inbox.messages) == 1)
    await wait_for(lambda: connector._offset == update["update_id"] + 1)
    await connector.aclose()
    assert fake.bots[TOKEN].confirmed_offset == update["update_id"] + 1
    assert not connector.connected


async def test_aclose_mid_batch_confirms_only_what_was_handed_over(
    fake: TelegramFake, started: Started
) -> None:
    connector, inbox = await started()
    held = asyncio.Event()

    async def sink(message: InboundMessage) -> None:
        inbox.messages.append(message)
        if message.text == "second":
            await held.wait()

    connector._runtime.sink = sink
    [first] = fake.group_message(OTHER_GROUP, ALICE, "first")
    [second] = fake.group_message(OTHER_GROUP, ALICE, "second")
    fake.group_message(OTHER_GROUP, ALICE, "third")
    await wait_for(lambda: inbox.texts() == ["first", "second"])
    await connector.aclose()
    assert fake.bots[TOKEN].confirmed_offset == second["update_id"]
    assert [u["update_id"] for u in fake.pending(TOKEN)][0] == second["update_id"]
    assert first["update_id"] < second["update_id"]


async def test_hosted_bots_see_each_others_group_messages(
    fake: TelegramFake, started: Started
) -> None:
    parrot, parrot_inbox = await started(TOKEN, "parrot-tg")
    echo, echo_inbox = await started(TOKEN_B, "echo-tg")
    quiet, quiet_inbox = await started(TOKEN_C, "quiet-tg")
    fake.group_message(GROUP, ALICE, "hi all")
    await wait_for(
        lambda: all(len(i.messages) == 1 for i in (parrot_inbox, echo_inbox, quiet_inbox))
    )
    # As if quiet-tg had never seen the group: then it is not offered the group's messages.
    quiet._group_chats.clear()
    sent_id = await parrot.send(str(GROUP.id), Reply(text="echo: hi all"))
    await wait_for(lambda: len(echo_inbox.messages) == 2)
    peer = echo_inbox.messages[1]
    assert peer.sender_is_bot
    assert peer.sender_id == "7001"
    assert peer.bot_user_id == "7002"
    assert peer.message_id == sent_id
    assert peer.event_id == f"peer:{GROUP.id}:7001:{sent_id}"
    assert peer.channel_id == str(GROUP.id)
    assert len(parrot_inbox.messages) == 1
    assert all(m.text != "echo: hi all" for m in quiet_inbox.messages)
    # A direct message is never fed to peers (private chat ids are user ids, not rooms).
    fake.private_message(TOKEN, ALICE, "dm")
    await wait_for(lambda: len(parrot_inbox.messages) == 2)
    await parrot.send(str(ALICE.id), Reply(text="dm reply"))
    await echo.send(str(GROUP.id), Reply(text="back at you"))
    await wait_for(lambda: len(parrot_inbox.messages) == 3)
    assert parrot_inbox.texts()[-1] == "back at you"
    assert len(echo_inbox.messages) == 2


async def webhook_client(
    fake: TelegramFake, **extra: Any
) -> tuple[TelegramConnector, Inbox, TestClient[web.Request, web.Application]]:
    app = web.Application()
    connector = create(
        config(
            api_base_url=fake.base_url,
            mode="webhook",
            webhook_secret=SecretStr(SECRET),
            **extra,
        ),
        ConnectorServices(http=app),
    )
    client = TestClient(TestServer(app))
    await client.start_server()
    inbox = Inbox()
    await connector.start(inbox)
    return connector, inbox, client


async def test_webhook_mode_verifies_the_secret(fake: TelegramFake) -> None:
    connector, inbox, client = await webhook_client(
        fake, webhook_url="https://gateway.example/telegram/parrot-tg"
    )
    try:
        assert connector.connected
        bot = fake.bots[TOKEN]
        assert bot.webhook_url == "https://gateway.example/telegram/parrot-tg"
        assert bot.webhook_secret == SECRET
        update = {
            "update_id": 1,
            "message": fake.build_message(GROUP, ALICE, "via webhook"),
        }
        body = json.dumps(update)
        unsigned = await client.post("/telegram/parrot-tg", data=body)
        assert unsigned.status == 401
        wrong = await client.post(
            "/telegram/parrot-tg",
            data=body,
            headers={"X-Telegram-Bot-Api-Secret-Token": "guess"},
        )
        assert wrong.status == 401
        assert inbox.messages == []
        headers = {"X-Telegram-Bot-Api-Secret-Token": SECRET}
        good = await client.post("/telegram/parrot-tg", data=body, headers=headers)
        assert good.status == 200
        assert inbox.texts() == ["via webhook"]
        assert inbox.messages[0].event_id == "1"
        junk = await client.post("/telegram/parrot-tg", data=b"{not json", headers=headers)
        assert junk.status == 400
        odd = await client.post(
            "/telegram/parrot-tg", data=json.dumps({"update_id": 2, "poll": {}}), headers=headers
        )
        assert odd.status == 200
        inbox.fail = True
        failed = await client.post("/telegram/parrot-tg", data=body, headers=headers)
        assert failed.status == 500
        assert (TOKEN, "getupdates") not in fake.calls
    finally:
        await connector.aclose()
        await client.close()


async def test_webhook_without_url_leaves_registration_alone(fake: TelegramFake) -> None:
    connector, _, client = await webhook_client(fake)
    try:
        assert connector.connected
        assert (TOKEN, "setwebhook") not in fake.calls
    finally:
        await connector.aclose()
        await client.close()


@pytest.mark.parametrize(
    ("body", "why"),
    [
        pytest.param(b"[" * 50_000 + b"]" * 50_000, "nested deeper", id="nested-50k"),
        pytest.param(
            b'{"update_id": 1, "message": ' + b"[" * 20_000 + b"]" * 20_000 + b"}",
            "nested deeper",
            id="nested-20k",
        ),
        pytest.param(b'{"update_id": ' + b"9" * 5_000 + b"}", "not acceptable", id="5000-digits"),
        pytest.param(b'{"update_id": NaN}', "NaN", id="nan"),
        pytest.param(b'{"update_id": 1e999}', "out of range", id="overflow"),
        pytest.param(b'{"update_id": 1, "text": "caf\xe9"}', "not UTF-8", id="latin-1"),
        pytest.param(b"{not json", "not JSON", id="not-json"),
    ],
)
async def test_issue9_webhook_refuses_a_body_that_is_not_safe_json_with_400(
    fake: TelegramFake, caplog: pytest.LogCaptureFixture, body: bytes, why: str
) -> None:
    connector, inbox, client = await webhook_client(fake)
    headers = {"X-Telegram-Bot-Api-Secret-Token": SECRET}
    try:
        with caplog.at_level(logging.WARNING):
            refused = await client.post("/telegram/parrot-tg", data=body, headers=headers)
            assert refused.status == 400
            assert why in await refused.text()
        assert connector.dropped["malformed"] == 1
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
        update = {"update_id": 2, "message": fake.build_message(GROUP, ALICE, "next one")}
        served = await client.post("/telegram/parrot-tg", json=update, headers=headers)
        assert served.status == 200
        assert inbox.texts() == ["next one"]
    finally:
        await connector.aclose()
        await client.close()


async def test_issue9_webhook_answers_413_to_a_body_over_the_limit(fake: TelegramFake) -> None:
    connector, inbox, client = await webhook_client(fake)
    headers = {"X-Telegram-Bot-Api-Secret-Token": SECRET}
    try:
        flood = io.BytesIO(b'{"update_id": 1, "x": "' + b"x" * MAX_BODY_BYTES + b'"}')
        refused = await client.post("/telegram/parrot-tg", data=flood, headers=headers)
        assert refused.status == 413
        assert connector.dropped["too_large"] == 1
        assert inbox.messages == []
    finally:
        await connector.aclose()
        await client.close()


async def test_issue9_webhook_drops_odd_json_with_200_and_counts_it(
    fake: TelegramFake, caplog: pytest.LogCaptureFixture
) -> None:
    connector, inbox, client = await webhook_client(fake)
    headers = {"X-Telegram-Bot-Api-Secret-Token": SECRET}
    message = fake.build_message(GROUP, ALICE, "typed wrong")
    odd: list[object] = [
        [1, 2],
        "an update",
        42,
        None,
        {"update_id": "3", "message": message},
        {"update_id": 4, "message": {**message, "chat": {**message["chat"], "id": str(GROUP.id)}}},
        {"update_id": 5, "message": {**message, "from": {**message["from"], "is_bot": "no"}}},
        {"update_id": 6, "message": {**message, "text": ["typed", "wrong"]}},
    ]
    try:
        with caplog.at_level(logging.WARNING):
            for body in odd:
                raw = json.dumps(body)
                answer = await client.post("/telegram/parrot-tg", data=raw, headers=headers)
                assert answer.status == 200, raw
        assert connector.dropped == {"malformed": len(odd)}
        assert inbox.messages == []
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
        good = {"update_id": 7, "message": message}
        assert (await client.post("/telegram/parrot-tg", json=good, headers=headers)).status == 200
        assert inbox.texts() == ["typed wrong"]
    finally:
        await connector.aclose()
        await client.close()


async def test_issue10_hosted_bots_meet_on_the_peer_bus_only_while_they_run(
    fake: TelegramFake,
) -> None:
    lent = services()
    parrot_inbox, echo_inbox = Inbox(), Inbox()
    parrot = TelegramConnector(config(TOKEN, "parrot-tg", api_base_url=fake.base_url), lent)
    echo = TelegramConnector(config(TOKEN_B, "echo-tg", api_base_url=fake.base_url), lent)
    assert lent.peers.subscribers("telegram") == ()  # created, not running: not offered
    await parrot.start(parrot_inbox)
    await echo.start(echo_inbox)
    try:
        assert lent.peers.subscribers("telegram") == (parrot, echo)
        fake.group_message(GROUP, ALICE, "hi both")
        await wait_for(lambda: len(parrot_inbox.messages) == len(echo_inbox.messages) == 1)
        echo.receive_peer({"message_id": 1, "chat": {"id": GROUP.id}})  # not a Message: ignored
        await echo.aclose()
        assert lent.peers.subscribers("telegram") == (parrot,)
        await parrot.send(str(GROUP.id), Reply(text="anyone?"))
        assert len(echo_inbox.messages) == 1
        assert echo.dropped == {}
    finally:
        await parrot.aclose()
        await echo.aclose()
    assert lent.peers.subscribers("telegram") == ()


async def test_issue10_peer_messages_beyond_the_lanes_are_dropped_as_queue_full(
    fake: TelegramFake, started: Started
) -> None:
    parrot, _ = await started(TOKEN, "parrot-tg")
    echo, echo_inbox = await started(TOKEN_B, "echo-tg")
    fake.group_message(GROUP, ALICE, "hi")
    await wait_for(lambda: len(echo_inbox.messages) == 1)
    echo_inbox.gate = asyncio.Event()  # the pipeline holds the first peer message
    echo._peer_lanes = Lanes(echo._runtime.hand_over, per_lane=1)
    for n in range(3):
        await parrot.send(str(GROUP.id), Reply(text=f"peer {n}"))
    await wait_for(lambda: echo.dropped["queue_full"] == 1)
    echo_inbox.gate.set()
    await wait_for(lambda: echo_inbox.texts()[1:] == ["peer 0", "peer 1"])
