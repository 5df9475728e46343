"""The Discord connector with the real discord.py against the fake Discord over loopback.

Every wait is a bounded poll on a condition of the fake or the connector, never a fixed sleep.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

import pytest

from connectors.discord import DiscordConnector, create
from connectors.discord.connector import TIMING
from gateway.app.errors import ConnectorError, DeliveryError
from gateway.app.types import InboundMessage, Reply
from gateway.config import DiscordBotConfig
from tests.connectors.connector_helpers import (
    WAIT_SECONDS,
    Inbox,
    refused_port,
    services,
    wait_for,
)
from tests.fakes.discord_server import DiscordFake, FakeUser

TOKEN = "MTAwMDAwMDAwMDAwMDAwMDAx.parrot.connector-test-token"
TOKEN_B = "MTAwMDAwMDAwMDAwMDAwMDAy.echo.connector-test-token"
PARROT = FakeUser(900001, "Parrot", bot=True)
ECHO = FakeUser(900002, "Echo", bot=True)
ALICE = FakeUser(500001, "alice")
GUILD, CHANNEL, OTHER_CHANNEL, THREAD, DM = 100, 200, 201, 300, 400


@pytest.fixture
async def fake() -> AsyncIterator[DiscordFake]:
    async with DiscordFake() as server:
        world = server.world
        world.add_bot(TOKEN, PARROT)
        world.add_bot(TOKEN_B, ECHO)
        world.add_guild(GUILD, "Lounge", [ALICE, PARROT, ECHO])
        world.add_channel(GUILD, CHANNEL, "general")
        world.add_channel(GUILD, OTHER_CHANNEL, "random")
        world.add_channel(GUILD, THREAD, "a thread", parent_id=CHANNEL)
        world.add_dm(DM, ALICE, PARROT)
        yield server


def bot_config(fake: DiscordFake, token: str = TOKEN, **extra: Any) -> DiscordBotConfig:
    fields: dict[str, Any] = {
        "id": "parrot-dc",
        "platform": "discord",
        "token": token,
        "agent": "parrot",
        "api_base_url": fake.base_url,
        "gateway_url": fake.gateway_url,
    }
    return DiscordBotConfig.model_validate({**fields, **extra})


@asynccontextmanager
async def started(
    config: DiscordBotConfig, inbox: Inbox | None = None, **timing: Any
) -> AsyncIterator[DiscordConnector]:
    """A started connector on quick reconnects; `timing` overrides the connector's defaults."""
    fast = replace(TIMING, retry_delays=(0.01, 0.05), **timing)
    connector = DiscordConnector(config, services(), timing=fast)
    await connector.start(inbox or Inbox())
    try:
        yield connector
    finally:
        await connector.aclose()


async def test_start_logs_in_opens_the_gateway_and_knows_the_bot(fake: DiscordFake) -> None:
    connector = create(bot_config(fake), services())
    assert isinstance(connector, DiscordConnector)
    assert not connector.connected
    await connector.start(Inbox())
    try:
        assert connector.connected
        assert connector.bot_user_id == str(PARROT.id)
        assert fake.identifies == {TOKEN: 1}
        # guilds, guild messages, DMs and the privileged message-content intent
        wanted = (1 << 0) | (1 << 9) | (1 << 12) | (1 << 15)
        assert fake.intents[TOKEN] & wanted == wanted
        assert connector.capabilities.max_message_length == 2000
    finally:
        await connector.aclose()
    assert not connector.connected
    await wait_for(lambda: not fake.connected(TOKEN))


async def test_without_gateway_url_the_gateway_is_asked_of_the_api(fake: DiscordFake) -> None:
    async with started(bot_config(fake, gateway_url=None)) as connector:
        assert connector.connected
        assert fake.identifies == {TOKEN: 1}


async def test_a_channel_message_reaches_the_sink(fake: DiscordFake) -> None:
    inbox = Inbox()
    async with started(bot_config(fake), inbox):
        raw = fake.message(CHANNEL, ALICE, f"hi <@{PARROT.id}>")
        message = await inbox.next()
        assert message.message_id == message.event_id == raw["id"]
        assert (message.channel_id, message.thread_id) == (str(CHANNEL), None)
        assert message.sender_id == str(ALICE.id)
        assert not message.sender_is_bot
        assert message.mentions_bot
        assert message.bot_user_id == str(PARROT.id)
        assert not message.is_direct


async def test_a_thread_message_is_in_the_parent_room_and_the_reply_goes_to_the_thread(
    fake: DiscordFake,
) -> None:
    inbox = Inbox()
    async with started(bot_config(fake), inbox) as connector:
        fake.message(THREAD, ALICE, "in the thread")
        message = await inbox.next()
        assert (message.channel_id, message.thread_id) == (str(CHANNEL), str(THREAD))
        reply = Reply("answer", thread_id=message.thread_id, reply_to=message.message_id)
        sent_id = await connector.send(message.channel_id, reply)
        [posted] = fake.sent
        assert posted.channel_id == THREAD
        assert str(posted.message_id) == sent_id
        assert posted.reply_to == int(message.message_id)


async def test_a_dm_is_direct(fake: DiscordFake) -> None:
    inbox = Inbox()
    async with started(bot_config(fake), inbox) as connector:
        fake.message(DM, ALICE, "psst")
        message = await inbox.next()
        assert message.is_direct
        assert message.channel_id == str(DM)
        await connector.send(message.channel_id, Reply("hi", reply_to=message.message_id))
        assert [m.channel_id for m in fake.sent] == [DM]


async def test_a_reply_is_a_message_reply_that_does_not_ping(fake: DiscordFake) -> None:
    inbox = Inbox()
    echo = DiscordConnector(bot_config(fake, TOKEN_B, id="echo-dc"), services())
    async with started(bot_config(fake), inbox) as connector:
        await echo.start(Inbox())
        try:
            fake.message(CHANNEL, ALICE, "hello")
            message = await inbox.next()
            await connector.send(message.channel_id, Reply("hey", reply_to=message.message_id))
            [posted] = fake.sent
            assert posted.reply_to == int(message.message_id)
            assert not posted.pings_replied_user
            # The other bot replies to the parrot: Discord's reply is not a mention.
            await echo.send(str(CHANNEL), Reply("echo: hey", reply_to=str(posted.message_id)))
            from_echo = await inbox.next(2)
            assert from_echo.sender_is_bot
            assert from_echo.reply_to_bot
            assert not from_echo.mentions_bot
        finally:
            await echo.aclose()


async def test_the_bots_own_messages_are_dropped_early(fake: DiscordFake) -> None:
    inbox = Inbox()
    async with started(bot_config(fake), inbox) as connector:
        await connector.send(str(CHANNEL), Reply("talking to myself"))
        await wait_for(lambda: connector.dropped["own_message"] == 1)
        assert inbox.messages == []


async def test_the_sdk_waits_out_a_429_and_posts_once(fake: DiscordFake) -> None:
    async with started(bot_config(fake)) as connector:
        fake.fail_next_sends(2, retry_after=0.05)
        await connector.send(str(CHANNEL), Reply("through the flood"))
        assert fake.send_attempts == 3
        assert [m.content for m in fake.sent] == ["through the flood"]


async def test_a_429_the_sdk_gives_up_on_is_a_retryable_delivery_error(fake: DiscordFake) -> None:
    async with started(bot_config(fake)) as connector:
        fake.fail_next_sends(5, retry_after=0.05)
        with pytest.raises(DeliveryError) as caught:
            await connector.send(str(CHANNEL), Reply("flooded"))
        assert caught.value.retryable
        assert caught.value.retry_after == pytest.approx(0.05)
        assert fake.sent == []
        await connector.send(str(CHANNEL), Reply("later"))
        assert [m.content for m in fake.sent] == ["later"]


async def test_a_long_rate_limit_is_handed_to_delivery_instead_of_waited_for(
    fake: DiscordFake,
) -> None:
    async with started(bot_config(fake)) as connector:
        fake.fail_next_sends(1, retry_after=45.0)
        with pytest.raises(DeliveryError) as caught:
            await connector.send(str(CHANNEL), Reply("not now"))
        assert caught.value.retryable
        assert caught.value.retry_after == pytest.approx(45.0)


async def test_an_unknown_channel_is_a_final_delivery_error(fake: DiscordFake) -> None:
    async with started(bot_config(fake)) as connector:
        with pytest.raises(DeliveryError) as caught:
            await connector.send("999", Reply("anyone?"))
        assert not caught.value.retryable
        assert "404" in str(caught.value)
        assert TOKEN not in str(caught.value)
        with pytest.raises(DeliveryError):
            await connector.send("not-a-number", Reply("anyone?"))


async def test_typing_is_shown_when_the_turn_takes_a_while(fake: DiscordFake) -> None:
    async with started(bot_config(fake), typing_delay=0) as connector:
        await connector.typing(str(CHANNEL), str(THREAD))
        await connector.typing(str(CHANNEL), None)
        assert [(c.token, c.channel_id) for c in fake.typing_calls] == [
            (TOKEN, THREAD),
            (TOKEN, CHANNEL),
        ]


async def test_typing_is_skipped_when_the_reply_came_first(fake: DiscordFake) -> None:
    connector: DiscordConnector

    async def reply_meanwhile(_: float) -> None:
        await connector.send(str(CHANNEL), Reply("quick"))

    async with started(bot_config(fake), sleep=reply_meanwhile) as connector:
        await connector.typing(str(CHANNEL), None)
        assert fake.typing_calls == []
        assert [m.content for m in fake.sent] == ["quick"]


async def test_reply_in_thread_opens_one_thread_and_keeps_every_chunk_in_it(
    fake: DiscordFake,
) -> None:
    inbox = Inbox()
    config = bot_config(fake, reply_in_thread=True)
    async with started(config, inbox) as connector:
        fake.message(CHANNEL, ALICE, "Can you explain the deploy?\nDetails follow")
        message = await inbox.next()
        assert message.thread_id == message.message_id
        for part in ("part one", "part two"):
            reply = Reply(part, thread_id=message.thread_id, reply_to=message.message_id)
            await connector.send(message.channel_id, reply)
        [thread] = fake.threads_opened
        assert thread.id == int(message.message_id)
        assert thread.parent_id == CHANNEL
        assert thread.name == "Can you explain the deploy?"
        assert [(m.channel_id, m.reply_to) for m in fake.sent] == [(thread.id, None)] * 2
        # Messages in the new thread now come from a known thread of the channel.
        fake.message(thread.id, ALICE, "thanks")
        follow_up = await inbox.next(2)
        assert (follow_up.channel_id, follow_up.thread_id) == (str(CHANNEL), str(thread.id))


async def test_reply_in_thread_uses_a_thread_that_is_already_open(fake: DiscordFake) -> None:
    inbox = Inbox()
    async with started(bot_config(fake, reply_in_thread=True), inbox) as connector:
        fake.message(CHANNEL, ALICE, "question")
        message = await inbox.next()
        fake.world.add_channel(GUILD, int(message.message_id), "opened", parent_id=CHANNEL)
        reply = Reply("answer", thread_id=message.thread_id, reply_to=message.message_id)
        await connector.send(message.channel_id, reply)
        assert fake.threads_opened == []
        assert [m.channel_id for m in fake.sent] == [int(message.message_id)]


async def test_reply_in_thread_falls_back_to_the_channel_when_no_thread_can_open(
    fake: DiscordFake,
) -> None:
    inbox = Inbox()
    async with started(bot_config(fake, reply_in_thread=True), inbox) as connector:
        # A message the fake's REST side never stored: opening a thread on it fails (404).
        raw = fake.message(CHANNEL, ALICE, "vanishing")
        fake.dispatch("MESSAGE_CREATE", {**raw, "id": "123"}, tokens=[TOKEN])
        message = await inbox.next(2)
        for part in ("one", "two"):
            reply = Reply(part, thread_id=message.thread_id, reply_to=message.message_id)
            await connector.send(message.channel_id, reply)
        assert fake.threads_opened == []
        assert [m.channel_id for m in fake.sent] == [CHANNEL, CHANNEL]


async def test_one_channel_is_handed_over_in_order_while_others_go_on(fake: DiscordFake) -> None:
    gate = asyncio.Event()
    inbox = Inbox(hold={"slow": gate})
    async with started(bot_config(fake), inbox):
        fake.message(CHANNEL, ALICE, "slow")
        fake.message(CHANNEL, ALICE, "after slow")
        fake.message(OTHER_CHANNEL, ALICE, "elsewhere")
        await wait_for(lambda: [m.text for m in inbox.messages] == ["slow", "elsewhere"])
        gate.set()
        await wait_for(lambda: len(inbox.messages) == 3)
        assert inbox.messages[2].text == "after slow"


async def test_a_failing_sink_does_not_stop_the_connector(fake: DiscordFake) -> None:
    seen: list[str] = []

    async def sink(message: InboundMessage) -> None:
        seen.append(message.text)
        if message.text == "boom":
            raise RuntimeError("pipeline bug")

    connector = DiscordConnector(bot_config(fake), services())
    await connector.start(sink)
    try:
        fake.message(CHANNEL, ALICE, "boom")
        fake.message(CHANNEL, ALICE, "fine")
        await wait_for(lambda: seen == ["boom", "fine"])
        assert connector.dropped["sink_error"] == 1
    finally:
        await connector.aclose()


async def test_bad_events_are_dropped_and_the_connection_stays(
    fake: DiscordFake, caplog: pytest.LogCaptureFixture
) -> None:
    inbox = Inbox()
    async with started(bot_config(fake), inbox) as connector:
        fake.dispatch("MESSAGE_CREATE", "not an object", tokens=[TOKEN])
        fake.dispatch("MESSAGE_CREATE", {"id": "x"}, tokens=[TOKEN])
        fake.dispatch("GUILD_CREATE", {"id": "not a number"}, tokens=[TOKEN])
        fake.dispatch("CHANNEL_DELETE", {"nothing": "useful"}, tokens=[TOKEN])
        fake.dispatch("SOME_FUTURE_EVENT", {"x": 1}, tokens=[TOKEN])
        fake.message(CHANNEL, ALICE, "still there?")
        message = await inbox.next()
        assert message.text == "still there?"
        assert len(inbox.messages) == 1
        assert connector.connected
        assert fake.identifies == {TOKEN: 1}
        assert connector.dropped["malformed"] == 4
        assert "GUILD_CREATE event dropped" in caplog.text


async def test_a_dropped_connection_resumes_and_missed_messages_arrive(fake: DiscordFake) -> None:
    inbox = Inbox()
    async with started(bot_config(fake), inbox) as connector:
        fake.drop_connections()
        fake.message(CHANNEL, ALICE, "while you were away")
        message = await inbox.next()
        assert message.text == "while you were away"
        await wait_for(lambda: fake.resumes.get(TOKEN) == 1 and connector.connected)
        assert fake.identifies == {TOKEN: 1}
        fake.message(CHANNEL, ALICE, "welcome back")
        assert (await inbox.next(2)).text == "welcome back"
        assert len(inbox.messages) == 2


async def test_when_discord_py_gives_up_the_connector_logs_in_again(fake: DiscordFake) -> None:
    inbox = Inbox()
    async with started(bot_config(fake), inbox) as connector:
        await fake.close_connections(4010)  # "invalid shard": discord.py does not reconnect
        await wait_for(lambda: fake.identifies.get(TOKEN) == 2 and connector.connected)
        fake.message(CHANNEL, ALICE, "hello again")
        assert (await inbox.next()).text == "hello again"


async def test_a_refused_token_fails_start_without_naming_it(fake: DiscordFake) -> None:
    connector = DiscordConnector(bot_config(fake, "MTIz.bad.token-never-shown"), services())
    with pytest.raises(ConnectorError) as caught:
        await connector.start(Inbox())
    assert "refused the token" in str(caught.value)
    assert "token-never-shown" not in str(caught.value)
    assert not connector.connected
    await connector.aclose()


async def test_a_start_that_is_cancelled_cleans_up(fake: DiscordFake) -> None:
    # A gateway that accepts the connection and never answers the handshake.
    held: list[asyncio.StreamWriter] = []
    silent = await asyncio.start_server(lambda _, writer: held.append(writer), "127.0.0.1", 0)
    port = silent.sockets[0].getsockname()[1]
    async with silent:
        connector = DiscordConnector(
            bot_config(fake, gateway_url=f"ws://127.0.0.1:{port}"), services()
        )
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.5):
                await connector.start(Inbox())
        assert not connector.connected
        await connector.aclose()
        assert connector._runner is None
        assert connector._client is None
        for writer in held:
            writer.close()


async def test_an_unreachable_gateway_fails_start_with_a_clear_error(fake: DiscordFake) -> None:
    with refused_port() as dead:
        config = bot_config(fake, gateway_url=f"ws://127.0.0.1:{dead}")
        connector = DiscordConnector(config, services())
        with pytest.raises(ConnectorError) as caught:
            async with asyncio.timeout(WAIT_SECONDS):
                await connector.start(Inbox())
    assert "could not open the gateway" in str(caught.value)
    assert connector._client is None
    await connector.aclose()


def process_wide_urls() -> tuple[object, object]:
    """discord.py's class-level API base and gateway (imported once the connector quieted it)."""
    http = importlib.import_module("discord.http")
    gateway = importlib.import_module("discord.gateway")
    return http.Route.BASE, gateway.DiscordWebSocket.DEFAULT_GATEWAY


async def test_bots_of_one_process_can_use_different_api_bases() -> None:
    before = process_wide_urls()
    async with DiscordFake() as one, DiscordFake() as two:
        for server in (one, two):
            server.world.add_bot(TOKEN, PARROT)
            server.world.add_guild(GUILD, "Lounge", [ALICE, PARROT])
            server.world.add_channel(GUILD, CHANNEL, "general")
        async with started(bot_config(one)) as first, started(bot_config(two)) as second:
            await first.send(str(CHANNEL), Reply("to one"))
            await second.send(str(CHANNEL), Reply("to two"))
        assert [m.content for m in one.sent] == ["to one"]
        assert [m.content for m in two.sent] == ["to two"]
        assert one.identifies == two.identifies == {TOKEN: 1}
    assert before == process_wide_urls()


async def test_send_before_start_is_retryable_and_after_close_is_not(fake: DiscordFake) -> None:
    connector = DiscordConnector(bot_config(fake), services())
    with pytest.raises(DeliveryError) as early:
        await connector.send(str(CHANNEL), Reply("too soon"))
    assert early.value.retryable
    await connector.start(Inbox())
    await connector.aclose()
    with pytest.raises(DeliveryError) as late:
        await connector.send(str(CHANNEL), Reply("too late"))
    assert not late.value.retryable


async def test_the_token_never_reaches_the_logs(
    fake: DiscordFake, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    inbox = Inbox()
    async with started(bot_config(fake), inbox, typing_delay=0) as connector:
        fake.message(CHANNEL, ALICE, "hello")
        message = await inbox.next()
        fake.fail_next_sends(1)
        await connector.typing(message.channel_id, None)
        await connector.send(message.channel_id, Reply("hi", reply_to=message.message_id))
        fake.drop_connections()
        await wait_for(lambda: fake.resumes.get(TOKEN) == 1 and connector.connected)
    assert "DEBUG" in {record.levelname for record in caplog.records}
    assert TOKEN not in caplog.text


async def test_a_lost_answer_is_retryable_and_the_retry_posts_nothing_new(
    fake: DiscordFake,
) -> None:
    async with started(bot_config(fake)) as connector:
        fake.lose_next_answers(1)
        with pytest.raises(DeliveryError) as caught:
            await connector.send(str(CHANNEL), Reply("said once", reply_to=None))
        assert caught.value.retryable
        assert [m.content for m in fake.sent] == ["said once"]
        again = await connector.send(str(CHANNEL), Reply("said once"))
        assert [m.content for m in fake.sent] == ["said once"]
        assert again == str(fake.sent[0].message_id)
        await connector.send(str(CHANNEL), Reply("said once"))  # a new send, a new message
        assert [m.content for m in fake.sent] == ["said once", "said once"]
