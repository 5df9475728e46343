"""End to end: a YAML config file in, the real runtime and PTB, the fake Bot API out.

In-process tests build the gateway the way `loopwarden run` does (`load_config` of a file,
then `Gateway`); one test runs `python -m gateway run` as a real subprocess for SIGTERM and
token hygiene. Every wait is a bounded poll on a condition, never a fixed sleep.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from connectors.telegram import TelegramConnector
from gateway.app.messages import REFUSAL
from tests.connectors.connector_helpers import (
    BUDGET,
    LONG_REPLY,
    NOTICE,
    assert_no_secret,
    dropped_at_metrics,
    gateway_process,
    running,
    wait_for,
    write_e2e_config,
)
from tests.fakes.telegram_server import FakeChat, FakeUser, SentMessage, TelegramFake

TOKEN = "123456:AAHparrotTokenE2E_abcdefghijklmnopq"
TOKEN_B = "654321:BBHechoTokenE2E_abcdefghijklmnopqr"
SECRET = "hook-secret-e2e-0123456789"
ALICE = FakeUser(5678, "Alice", "alice")  # an admin
MALLORY = FakeUser(9999, "Mallory", "mallory")  # not an admin
OUTSIDER = FakeUser(8001, "Echo", "OutsideEchoBot", is_bot=True)  # a bot the gateway doesn't host
GROUP = FakeChat(-1001, "supergroup", "Lounge")
PARROT = """  - id: parrot-tg
    platform: telegram
    token: "{token}"
    agent: parrot
    api_base_url: "{base_url}"
    poll_timeout: 1
"""

ECHO = """  - id: echo-tg
    platform: telegram
    token: "{token_b}"
    agent: parrot
    api_base_url: "{base_url}"
    poll_timeout: 1
"""

WEBHOOK = """  - id: parrot-tg
    platform: telegram
    token: "{token}"
    agent: parrot
    api_base_url: "{base_url}"
    mode: webhook
    webhook_url: "https://gateway.example/telegram/parrot-tg"
    webhook_secret: "{secret}"
"""

ECHO_WEBHOOK = """  - id: echo-tg
    platform: telegram
    token: "{token_b}"
    agent: parrot
    api_base_url: "{base_url}"
    mode: webhook
    webhook_url: "https://gateway.example/telegram/echo-tg"
    webhook_secret: "{secret}"
"""


@pytest.fixture(autouse=True)
def _timedelta_periods(monkeypatch: pytest.MonkeyPatch) -> None:
    """Opt in to PTB's timedelta periods, else its RetryAfter warns (an error under pytest)."""
    monkeypatch.setenv("PTB_TIMEDELTA", "true")


def write_config(tmp_path: Path, fake: TelegramFake, *bots: str) -> Path:
    values = {"token": TOKEN, "token_b": TOKEN_B, "base_url": fake.base_url, "secret": SECRET}
    listed = "".join(bot.format(**values) for bot in bots)
    return write_e2e_config(tmp_path, platform="telegram", admin=str(ALICE.id), bots=listed)


@pytest.fixture
async def fake() -> AsyncIterator[TelegramFake]:
    async with TelegramFake() as server:
        server.add_bot(TOKEN, 7001, "ParrotBot")
        server.add_bot(TOKEN_B, 7002, "EchoBot")
        server.add_chat(GROUP, TOKEN)
        yield server


def texts(sent: list[SentMessage]) -> list[str]:
    return [m.text for m in sent]


def assert_never_posted_silence(fake: TelegramFake) -> None:
    assert all("NO_REPLY" not in m.text for m in fake.sent)


async def say(fake: TelegramFake, text: str, sender: FakeUser = ALICE) -> SentMessage:
    """A human (or outside bot) message in the group; waits for and returns the next reply."""
    before = len(fake.sent)
    fake.group_message(GROUP, sender, text)
    await wait_for(lambda: len(fake.sent) > before)
    return fake.sent[before]


async def test_human_message_gets_the_agents_reply_once(tmp_path: Path, fake: TelegramFake) -> None:
    async with running(write_config(tmp_path, fake, PARROT)):
        reply = await say(fake, "hello there")
        assert reply.text == "echo: hello there"
        assert reply.chat_id == GROUP.id
        await say(fake, "second")
        assert texts(fake.sent) == ["echo: hello there", "echo: second"]


async def test_outside_bot_loop_is_cut_announced_once_and_reset_by_admin_only(
    tmp_path: Path, fake: TelegramFake
) -> None:
    def outside_bot_answers(sent: SentMessage) -> None:
        if sent.token == TOKEN and sent.chat_id == GROUP.id:
            fake.group_message(GROUP, OUTSIDER, f"ping {sent.message_id}", reply_to=sent.message_id)

    async with running(write_config(tmp_path, fake, PARROT)):
        fake.on_send = outside_bot_answers
        await say(fake, "start the ping-pong")
        await wait_for(lambda: any(m.text.startswith(NOTICE) for m in fake.sent))
        # The notice itself draws one more ping, refused in cooldown: wait until it was read.
        await wait_for(lambda: not fake.pending(TOKEN))
        answers_to_bot = [m for m in fake.sent if m.text.startswith("echo: ping")]
        assert len(answers_to_bot) == BUDGET
        fake.on_send = None

        refusal = await say(fake, "/loop reset", sender=MALLORY)
        assert refusal.text == REFUSAL
        fake.group_message(GROUP, OUTSIDER, "ping after refusal")
        ack = await say(fake, "/loop@ParrotBot reset")
        assert "reset" in ack.text.lower()
        assert not any(m.text == "echo: ping after refusal" for m in fake.sent)
        # Two pings were dropped in this cooldown (the notice's and the one above): one notice.
        assert sum(m.text.startswith(NOTICE) for m in fake.sent) == 1

        fake.on_send = outside_bot_answers
        resumed = await say(fake, "ping again", sender=OUTSIDER)
        assert resumed.text == "echo: ping again"
        await wait_for(lambda: sum(m.text.startswith(NOTICE) for m in fake.sent) == 2)
        fake.on_send = None
        notices = [m for m in fake.sent if m.text.startswith(NOTICE)]
        assert len(notices) == 2  # one per cooldown, not one per dropped message
        assert_never_posted_silence(fake)


async def test_two_hosted_bots_answering_each_other_are_cut_at_the_budget(
    tmp_path: Path, fake: TelegramFake
) -> None:
    fake.add_chat(GROUP, TOKEN, TOKEN_B)
    async with running(write_config(tmp_path, fake, PARROT, ECHO)):
        fake.group_message(GROUP, ALICE, "hi bots")
        await wait_for(lambda: any(m.text.startswith(NOTICE) for m in fake.sent))
        before = len(fake.sent)
        fake.group_message(GROUP, ALICE, "still there?")
        await wait_for(
            lambda: (
                sorted(m.token for m in fake.sent[before:] if m.text == "echo: still there?")
                == sorted([TOKEN, TOKEN_B])
            )
        )
        bot_to_bot = [m for m in fake.sent if m.text.startswith("echo: echo:")]
        assert len(bot_to_bot) == BUDGET
        notices = [m for m in fake.sent if m.text.startswith(NOTICE)]
        assert len(notices) == 1
        assert {m.token for m in fake.sent if m.text == "echo: hi bots"} == {TOKEN, TOKEN_B}


async def test_silence_is_never_posted(tmp_path: Path, fake: TelegramFake) -> None:
    async with running(write_config(tmp_path, fake, PARROT)):
        fake.group_message(GROUP, ALICE, "quiet please")
        reply = await say(fake, "after the silence")
        assert texts(fake.sent) == ["echo: after the silence"]
        assert reply.text == "echo: after the silence"
        assert_never_posted_silence(fake)


async def test_long_reply_arrives_as_ordered_chunks_within_the_limit(
    tmp_path: Path, fake: TelegramFake
) -> None:
    async with running(write_config(tmp_path, fake, PARROT)):
        fake.group_message(GROUP, ALICE, "long story please")
        await wait_for(lambda: sum(len(m.text) for m in fake.sent) >= len(LONG_REPLY) - 10)
        chunks = texts(fake.sent)
        assert len(chunks) == 2
        assert all(len(chunk) <= 4096 for chunk in chunks)
        assert " ".join(chunk.strip() for chunk in chunks).split() == LONG_REPLY.split()
        assert "(1/2)" not in chunks[0]


async def test_rate_limit_delays_then_delivers_exactly_once(
    tmp_path: Path, fake: TelegramFake
) -> None:
    async with running(write_config(tmp_path, fake, PARROT)):
        fake.fail_next_sends(1, retry_after=2)
        attempts = fake.send_attempts
        limited_at = time.monotonic()
        reply = await say(fake, "through the flood")
        assert reply.text == "echo: through the flood"
        assert fake.send_attempts == attempts + 2
        assert reply.sent_at - limited_at >= 1.9  # waited for Telegram's retry_after
        # The reply took longer than the typing delay (1 s): "typing…" was shown meanwhile.
        assert [(a.chat_id, a.action) for a in fake.chat_actions] == [(GROUP.id, "typing")]
        await say(fake, "next")
        assert texts(fake.sent) == ["echo: through the flood", "echo: next"]


async def test_duplicate_update_in_a_batch_is_answered_once(
    tmp_path: Path, fake: TelegramFake
) -> None:
    async with running(write_config(tmp_path, fake, PARROT)):
        [update] = fake.group_message(GROUP, ALICE, "only once")
        fake.redeliver(TOKEN, update)
        await wait_for(lambda: not fake.pending(TOKEN))
        await say(fake, "and then")
        assert texts(fake.sent) == ["echo: only once", "echo: and then"]


async def test_odd_updates_are_dropped_and_the_next_message_is_answered_once(
    tmp_path: Path, fake: TelegramFake
) -> None:
    channel = FakeChat(-100777, "channel", "Broadcast")
    unknown = FakeChat(-100555, "supergroup", "A group the fake does not know")
    async with running(write_config(tmp_path, fake, PARROT)) as gateway:
        connector = gateway.hosted["parrot-tg"].connector
        fake.unknown_update(TOKEN)
        fake.photo_message(GROUP, ALICE)
        fake.service_message(GROUP, ALICE, FakeUser(4444, "Newcomer"))
        fake.senderless_message(GROUP, "a message from nobody")
        fake.deliver(TOKEN, {"channel_post": fake.build_message(channel, None, "news")})
        fake.deliver(TOKEN, {"message": {"message_id": 5, "chat": {"id": 1}}})
        # Answered, but sendMessage says "chat not found": a delivery failure, nothing more.
        fake.deliver(TOKEN, {"message": fake.build_message(unknown, ALICE, "hello?")})
        failures = "delivery_failures_total"
        await wait_for(lambda: gateway.metrics.value(failures, platform="telegram") == 1)
        await wait_for(lambda: not fake.pending(TOKEN))
        fake.drop_next_polls(1)
        fake.bots[TOKEN].wakeup.set()
        await wait_for(lambda: fake.pending_drops == 0)
        reply = await say(fake, "anyone home?")
        assert reply.text == "echo: anyone home?"
        await say(fake, "still fine")
        assert texts(fake.sent) == ["echo: anyone home?", "echo: still fine"]
        assert connector.connected


async def test_webhook_mode_verifies_the_secret_and_answers_a_redelivery_once(
    tmp_path: Path, fake: TelegramFake
) -> None:
    async with running(write_config(tmp_path, fake, WEBHOOK)) as gateway:
        assert fake.bots[TOKEN].webhook_secret == SECRET
        url = f"http://127.0.0.1:{gateway.port}/telegram/parrot-tg"
        update = {"update_id": 501, "message": fake.build_message(GROUP, ALICE, "by webhook")}
        body = json.dumps(update)
        headers = {"X-Telegram-Bot-Api-Secret-Token": SECRET, "Content-Type": "application/json"}
        async with aiohttp.ClientSession() as http:
            async with http.post(url, data=body) as forged:
                assert forged.status == 401
            async with http.post(url, data=body, headers=headers) as first:
                assert first.status == 200
            async with http.post(url, data=body, headers=headers) as again:
                assert again.status == 200
            async with http.post(url, data="{oops", headers=headers) as junk:
                assert junk.status == 400
            odd = json.dumps({"update_id": 502, "my_chat_member": {"x": 1}})
            async with http.post(url, data=odd, headers=headers) as unknown:
                assert unknown.status == 200
        assert texts(fake.sent) == ["echo: by webhook"]
        assert (TOKEN, "getupdates") not in fake.calls


async def test_subprocess_sigterm_exits_zero_and_never_prints_the_token(
    tmp_path: Path, fake: TelegramFake
) -> None:
    path = write_config(tmp_path, fake, PARROT, ECHO_WEBHOOK)
    async with gateway_process(path) as gateway:
        port = await gateway.ready()
        update = fake.private_message(TOKEN_B, ALICE, "by webhook")
        url = f"http://127.0.0.1:{port}/telegram/echo-tg"
        async with aiohttp.ClientSession() as http:
            wrong = {"X-Telegram-Bot-Api-Secret-Token": "a-guess"}
            async with http.post(url, json=update, headers=wrong) as forged:
                assert forged.status == 401
            right = {"X-Telegram-Bot-Api-Secret-Token": SECRET}
            async with http.post(url, json=update, headers=right) as answered:
                assert answered.status == 200
        assert [(m.token, m.text) for m in fake.sent] == [(TOKEN_B, "echo: by webhook")]
        reply = await say(fake, "hello from outside")
        assert reply.text == "echo: hello from outside"
        fake.fail_next_sends(1, retry_after=1)
        await say(fake, "and through a 429")
        fake.drop_next_polls(1)
        fake.bots[TOKEN].wakeup.set()
        await wait_for(lambda: fake.pending_drops == 0)
        await say(fake, "after a dropped poll")
        taken = await gateway.terminate()
    assert gateway.returncode == 0, gateway.output
    assert taken < 10
    logged = gateway.output
    assert "DEBUG" in logged
    assert "getUpdates gave 1 update(s)" in logged
    assert "getUpdates failed" in logged  # the dropped poll was logged, and redacted
    assert "/bot***" in logged  # PTB's DEBUG line with the API URL, redacted
    assert "webhook request with a bad secret token" in logged
    assert_no_secret(logged, TOKEN, TOKEN_B, SECRET)


async def test_issue9_two_hosted_bots_start_a_ping_pong_in_each_of_twenty_groups(
    tmp_path: Path, fake: TelegramFake
) -> None:
    # Every chat of the fake numbers its messages from 1: the message ids of the twenty
    # groups collide, as Telegram's do, so only the chat id tells the peer messages apart.
    groups = [
        fake.add_chat(FakeChat(-2000 - n, "supergroup", f"Room {n}"), TOKEN, TOKEN_B)
        for n in range(20)
    ]
    rooms = {group.id for group in groups}

    def rooms_where(prefix: str) -> set[int]:
        return {m.chat_id for m in fake.sent if m.text.startswith(prefix)}

    async with running(write_config(tmp_path, fake, PARROT, ECHO)):
        for group in groups:
            fake.group_message(group, ALICE, "hi bots")
        await wait_for(lambda: rooms_where("echo: echo: hi bots") == rooms, limit=30)
        # Each ping-pong runs until its own pair budget cuts it, room by room.
        await wait_for(lambda: rooms_where(NOTICE) == rooms, limit=30)


async def test_issue10_dropped_events_are_counted_at_metrics_by_reason(
    tmp_path: Path, fake: TelegramFake
) -> None:
    async with running(write_config(tmp_path, fake, PARROT)) as gateway:
        connector = gateway.hosted["parrot-tg"].connector
        assert isinstance(connector, TelegramConnector)
        fake.unknown_update(TOKEN)
        fake.photo_message(GROUP, ALICE)
        fake.deliver(TOKEN, {"message": {"message_id": 5, "chat": {"id": "not a number"}}})
        await say(fake, "counted?")
        await wait_for(lambda: not fake.pending(TOKEN))
        scraped = await dropped_at_metrics(gateway.port, "telegram")
    assert scraped == {"unsupported": 1, "no_text": 1, "malformed": 1}
    assert scraped == dict(connector.dropped)
