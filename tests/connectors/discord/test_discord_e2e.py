"""End to end: a YAML config file in, the real runtime and discord.py, the fake Discord out.

In-process tests build the gateway the way `loopwarden run` does (`load_config` of a file,
then `Gateway`, whose connector comes from `connectors.discord.create`); one test runs
`python -m gateway run` as a real subprocess for SIGTERM and token hygiene, and one runs
the fake as a process of its own. Every wait is a bounded poll on a condition, never a
fixed sleep.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import pytest

from connectors.discord import DiscordConnector
from gateway.app.messages import REFUSAL
from gateway.app.types import Reply
from tests.connectors.connector_helpers import (
    BUDGET,
    LONG_REPLY,
    NOTICE,
    ROOT,
    WAIT_SECONDS,
    assert_no_secret,
    dropped_at_metrics,
    gateway_process,
    running,
    wait_for,
    write_e2e_config,
)
from tests.fakes.discord_server import DiscordFake, FakeUser, PostedMessage

TOKEN = "MTAwMDAwMDAwMDAwOTAwMDAx.GparrT.e2e-parrot-secret-token-value"
TOKEN_B = "MTAwMDAwMDAwMDAwOTAwMDAy.GechoO.e2e-echo-secret-token-value"
PARROT = FakeUser(900001, "Parrot", bot=True)
ECHO = FakeUser(900002, "Echo", bot=True)
ALICE = FakeUser(500001, "alice")  # an admin
MALLORY = FakeUser(500666, "mallory")  # not an admin
OUTSIDER = FakeUser(800001, "Outsider", bot=True)  # a bot the gateway does not host
GUILD, CHANNEL, STRICT_CHANNEL, THREAD, UNKNOWN_CHANNEL = 100, 200, 201, 300, 777
STRICT = f"""channels:
  - match: {{platform: discord, channel: "{STRICT_CHANNEL}"}}
    policy: {{respond_to: {{bots: mentions}}}}
"""

BOT = """  - id: {id}
    platform: discord
    token: "{token}"
    agent: parrot
    api_base_url: "{base_url}"
    gateway_url: "{gateway_url}"
"""


class Endpoints(Protocol):
    """Where a fake Discord listens: the in-process fake, or one in another process."""

    @property
    def base_url(self) -> str: ...

    @property
    def gateway_url(self) -> str: ...


@dataclass(frozen=True)
class RemoteFake:
    """The endpoints of a fake Discord running as a process of its own."""

    port: int

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api/v10"

    @property
    def gateway_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/gateway"


def write_config(
    tmp_path: Path,
    fake: Endpoints,
    *tokens: str,
    delay: float = 0.0,
) -> Path:
    ids = {TOKEN: "parrot-dc", TOKEN_B: "echo-dc"}
    bots = "".join(
        BOT.format(id=ids[token], token=token, base_url=fake.base_url, gateway_url=fake.gateway_url)
        for token in tokens or (TOKEN,)
    )
    admin = str(ALICE.id)
    return write_e2e_config(
        tmp_path, platform="discord", admin=admin, bots=bots, delay=delay, extra=STRICT
    )


@pytest.fixture
async def fake() -> AsyncIterator[DiscordFake]:
    async with DiscordFake() as server:
        world = server.world
        world.add_bot(TOKEN, PARROT)
        world.add_bot(TOKEN_B, ECHO)
        world.add_guild(GUILD, "Lounge", [ALICE, MALLORY, OUTSIDER, PARROT, ECHO])
        world.add_channel(GUILD, CHANNEL, "general")
        world.add_channel(GUILD, STRICT_CHANNEL, "bots-by-mention")
        world.add_channel(GUILD, THREAD, "a thread", parent_id=CHANNEL)
        yield server


def texts(sent: list[PostedMessage]) -> list[str]:
    return [m.content for m in sent]


async def say(
    fake: DiscordFake,
    text: str,
    sender: FakeUser = ALICE,
    channel: int = CHANNEL,
    **options: Any,
) -> PostedMessage:
    """Someone posts in a channel; waits for and returns the next message a bot posted."""
    before = len(fake.sent)
    fake.message(channel, sender, text, **options)
    await wait_for(lambda: len(fake.sent) > before)
    return fake.sent[before]


def assert_never_posted_silence(fake: DiscordFake) -> None:
    assert all("NO_REPLY" not in m.content for m in fake.sent)


async def test_a_human_message_gets_the_agents_reply_as_a_discord_reply(
    tmp_path: Path, fake: DiscordFake
) -> None:
    async with running(write_config(tmp_path, fake)) as gateway:
        assert gateway.hosted["parrot-dc"].connector.bot_user_id == str(PARROT.id)
        reply = await say(fake, "hello there")
        assert reply.content == "echo: hello there"
        assert reply.channel_id == CHANNEL
        assert reply.author_id == PARROT.id
        assert reply.reply_to is not None
        assert not reply.pings_replied_user
        await say(fake, "second")
        assert texts(fake.sent) == ["echo: hello there", "echo: second"]


async def test_a_thread_message_is_answered_in_the_thread(
    tmp_path: Path, fake: DiscordFake
) -> None:
    async with running(write_config(tmp_path, fake)):
        reply = await say(fake, "in a thread", channel=THREAD)
        assert reply.content == "echo: in a thread"
        assert reply.channel_id == THREAD


async def test_an_outside_bot_loop_is_cut_announced_once_and_reset_by_an_admin_only(
    tmp_path: Path, fake: DiscordFake
) -> None:
    def outside_bot_answers(sent: PostedMessage) -> None:
        if sent.author_id == PARROT.id and sent.channel_id == CHANNEL:
            fake.message(CHANNEL, OUTSIDER, f"ping {sent.message_id}", reply_to=sent.message_id)

    async with running(write_config(tmp_path, fake)):
        fake.on_send = outside_bot_answers
        await say(fake, "start the ping-pong")
        await wait_for(lambda: any(m.content.startswith(NOTICE) for m in fake.sent))
        fake.on_send = None
        # The refusal below is answered after every earlier message of the channel was
        # handled (one channel is handled in order), the notice's own ping included.
        refusal = await say(fake, "/loop reset", sender=MALLORY)
        assert refusal.content == REFUSAL
        answers_to_bot = [m for m in fake.sent if m.content.startswith("echo: ping")]
        assert len(answers_to_bot) == BUDGET

        fake.message(CHANNEL, OUTSIDER, "ping after refusal")
        ack = await say(fake, "!loop reset")
        assert "reset" in ack.content.lower()
        assert "echo: ping after refusal" not in texts(fake.sent)
        # Two pings were dropped in this cooldown (the notice's and the one above): one notice.
        assert sum(m.content.startswith(NOTICE) for m in fake.sent) == 1

        fake.on_send = outside_bot_answers
        resumed = await say(fake, "ping again", sender=OUTSIDER)
        assert resumed.content == "echo: ping again"
        await wait_for(lambda: sum(m.content.startswith(NOTICE) for m in fake.sent) == 2)
        fake.on_send = None
        notices = [m for m in fake.sent if m.content.startswith(NOTICE)]
        assert len(notices) == 2  # one per cooldown, not one per dropped message
        assert_never_posted_silence(fake)


async def test_two_hosted_bots_answering_each_other_are_cut_at_the_budget(
    tmp_path: Path, fake: DiscordFake
) -> None:
    async with running(write_config(tmp_path, fake, TOKEN, TOKEN_B)):
        fake.message(CHANNEL, ALICE, "hi bots")
        await wait_for(lambda: any(m.content.startswith(NOTICE) for m in fake.sent))
        before = len(fake.sent)
        fake.message(CHANNEL, ALICE, "still there?")
        await wait_for(
            lambda: (
                sorted(m.author_id for m in fake.sent[before:] if m.content == "echo: still there?")
                == [PARROT.id, ECHO.id]
            )
        )
        assert {m.author_id for m in fake.sent if m.content == "echo: hi bots"} == {
            PARROT.id,
            ECHO.id,
        }
        bot_to_bot = [m for m in fake.sent if m.content.startswith("echo: echo:")]
        assert len(bot_to_bot) == BUDGET
        notices = [m for m in fake.sent if m.content.startswith(NOTICE)]
        assert len(notices) == 1


async def test_an_automatic_reply_mention_from_a_bot_is_not_a_mention(
    tmp_path: Path, fake: DiscordFake
) -> None:
    async with running(write_config(tmp_path, fake)):
        first = await say(fake, "hello", channel=STRICT_CHANNEL)
        assert first.content == "echo: hello"
        # Discord's reply ping puts the parrot in `mentions`: respond_to.bots=mentions says no.
        fake.message(STRICT_CHANNEL, OUTSIDER, "auto-pinged reply", reply_to=first.message_id)
        explicit = await say(
            fake, f"<@{PARROT.id}> explicit", sender=OUTSIDER, channel=STRICT_CHANNEL
        )
        assert explicit.content == "echo: explicit"
        assert texts(fake.sent) == ["echo: hello", "echo: explicit"]


async def test_no_reply_is_never_posted(tmp_path: Path, fake: DiscordFake) -> None:
    async with running(write_config(tmp_path, fake)):
        fake.message(CHANNEL, ALICE, "quiet please")
        reply = await say(fake, "after the silence")
        assert reply.content == "echo: after the silence"
        assert texts(fake.sent) == ["echo: after the silence"]
        assert_never_posted_silence(fake)


async def test_a_long_reply_arrives_as_ordered_chunks_within_the_limit(
    tmp_path: Path, fake: DiscordFake
) -> None:
    async with running(write_config(tmp_path, fake)):
        fake.message(CHANNEL, ALICE, "long story please")
        await wait_for(lambda: sum(len(m.content) for m in fake.sent) >= len(LONG_REPLY) - 10)
        chunks = texts(fake.sent)
        assert len(chunks) == 4
        assert all(len(chunk) <= 2000 for chunk in chunks)
        assert " ".join(chunks).split() == LONG_REPLY.split()
        assert fake.sent[0].reply_to is not None
        assert all(m.reply_to is None for m in fake.sent[1:])
        assert "(1/4)" not in chunks[0]


async def test_a_429_delays_then_delivers_exactly_once(tmp_path: Path, fake: DiscordFake) -> None:
    async with running(write_config(tmp_path, fake)):
        fake.fail_next_sends(1, retry_after=0.3)
        attempts = fake.send_attempts
        limited_at = time.monotonic()
        reply = await say(fake, "through the flood")
        assert reply.content == "echo: through the flood"
        assert fake.send_attempts == attempts + 2
        assert reply.sent_at - limited_at >= 0.25  # waited for Discord's retry_after
        # Six 429s in a row: discord.py gives up after five, the gateway's delivery retries.
        fake.fail_next_sends(6, retry_after=0.05)
        reply = await say(fake, "through the storm")
        assert reply.content == "echo: through the storm"
        assert fake.send_attempts == attempts + 2 + 7
        await say(fake, "next")
        assert texts(fake.sent) == [
            "echo: through the flood",
            "echo: through the storm",
            "echo: next",
        ]


async def test_a_lost_answer_is_retried_and_the_reply_still_posted_once(
    tmp_path: Path, fake: DiscordFake
) -> None:
    async with running(write_config(tmp_path, fake)):
        fake.lose_next_answers(1)  # posted, but the answer is a 503
        attempts = fake.send_attempts
        reply = await say(fake, "did it arrive?")
        assert reply.content == "echo: did it arrive?"
        await say(fake, "next")
        assert fake.send_attempts == attempts + 3  # the retry reused the nonce
        assert texts(fake.sent) == ["echo: did it arrive?", "echo: next"]


async def test_a_redelivered_event_is_answered_once(tmp_path: Path, fake: DiscordFake) -> None:
    async with running(write_config(tmp_path, fake)):
        before = len(fake.sent)
        raw = fake.message(CHANNEL, ALICE, "only once")
        await wait_for(lambda: len(fake.sent) > before)
        fake.redeliver(raw, tokens=[TOKEN])
        await say(fake, "and then")
        assert texts(fake.sent) == ["echo: only once", "echo: and then"]


async def test_odd_events_are_dropped_and_the_next_message_is_answered_once(
    tmp_path: Path, fake: DiscordFake
) -> None:
    async with running(write_config(tmp_path, fake)) as gateway:
        connector = gateway.hosted["parrot-dc"].connector
        assert isinstance(connector, DiscordConnector)
        fake.dispatch("SOME_FUTURE_EVENT", {"id": "1"}, tokens=[TOKEN])
        fake.message(CHANNEL, ALICE, "", attachments=[{"id": "1", "filename": "cat.png"}])
        fake.message(CHANNEL, ALICE, "", type=7)  # "alice joined the server"
        fake.message(CHANNEL, None, "a message from nobody")
        fake.dispatch("MESSAGE_CREATE", {"id": "5", "channel_id": "6"}, tokens=[TOKEN])
        stray = fake.build_message(UNKNOWN_CHANNEL, ALICE, "hello?", guild_id=GUILD)
        fake.dispatch("MESSAGE_CREATE", stray, tokens=[TOKEN])  # its reply gets a 404
        failures = "delivery_failures_total"
        await wait_for(lambda: gateway.metrics.value(failures, platform="discord") == 1)
        fake.drop_connections()
        reply = await say(fake, "anyone home?")
        assert reply.content == "echo: anyone home?"
        await say(fake, "still fine")
        assert texts(fake.sent) == ["echo: anyone home?", "echo: still fine"]
        assert dict(connector.dropped) == {
            "no_text": 1,
            "service_message": 1,
            "no_sender": 2,  # the senderless message and the bare {id, channel_id}
            "own_message": 2,  # Discord echoes the bot's own two replies
        }
        assert connector.connected
        assert fake.identifies == {TOKEN: 1}


async def test_typing_is_shown_while_a_slow_agent_works(tmp_path: Path, fake: DiscordFake) -> None:
    async with running(write_config(tmp_path, fake, delay=0.8)):
        reply = await say(fake, "take your time")
        assert reply.content == "echo: take your time"
        await wait_for(lambda: bool(fake.typing_calls))
        assert [(c.token, c.channel_id) for c in fake.typing_calls] == [(TOKEN, CHANNEL)]


async def test_subprocess_sigterm_exits_zero_and_never_prints_the_token(
    tmp_path: Path, fake: DiscordFake
) -> None:
    path = write_config(tmp_path, fake, TOKEN, TOKEN_B)
    async with gateway_process(path) as gateway:
        await gateway.ready()
        before = len(fake.sent)
        fake.message(STRICT_CHANNEL, ALICE, f"<@{PARROT.id}> hello from outside")
        # Both bots answer a person, in either order; the parrot drops its own mention.
        await wait_for(lambda: {m.author_id for m in fake.sent[before:]} == {PARROT.id, ECHO.id})
        replies: dict[int, str] = {}
        for message in fake.sent[before:]:  # each bot's first: they may answer each other too
            replies.setdefault(message.author_id, message.content)
        assert replies[PARROT.id].startswith("echo: hello from outside")
        assert replies[ECHO.id].startswith(f"echo: <@{PARROT.id}> hello from outside")
        fake.fail_next_sends(1, retry_after=0.05)
        await say(fake, "and through a 429", channel=THREAD)
        fake.drop_connections()
        await wait_for(lambda: fake.resumes.get(TOKEN) == 1 and fake.connected(TOKEN))
        await say(fake, "after the resume")
        taken = await gateway.terminate()
    assert gateway.returncode == 0, gateway.output
    assert taken < 10
    logged = gateway.output
    assert "DEBUG" in logged
    assert "IDENTIFY" in logged or "Shard ID None has sent the IDENTIFY payload" in logged
    assert_no_secret(logged, TOKEN, TOKEN_B)


async def test_the_fake_runs_as_a_process_of_its_own(tmp_path: Path) -> None:
    world = {
        "bots": [{"token": TOKEN, "id": PARROT.id, "username": "Parrot"}],
        "users": [{"id": ALICE.id, "username": "alice"}],
        "guilds": [
            {
                "id": GUILD,
                "name": "Lounge",
                "members": [ALICE.id, PARROT.id],
                "channels": [{"id": CHANNEL, "name": "general"}],
            }
        ],
    }
    spec = tmp_path / "fake.json"
    spec.write_text(json.dumps(world), encoding="utf-8")
    server = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.fakes.discord_server",
        "--port",
        "0",
        "--config",
        str(spec),
        stdout=asyncio.subprocess.PIPE,
        cwd=ROOT,
    )
    try:
        assert server.stdout is not None
        async with asyncio.timeout(WAIT_SECONDS):
            banner = (await server.stdout.readline()).decode()
        found = re.search(r"listening on http://127\.0\.0\.1:(\d+)/", banner)
        assert found is not None, banner
        path = write_config(tmp_path, RemoteFake(int(found.group(1))))
        control = f"http://127.0.0.1:{found.group(1)}/_fake"
        async with running(path) as gateway, aiohttp.ClientSession() as http:
            connector = gateway.hosted["parrot-dc"].connector
            await connector.send(str(CHANNEL), Reply("direct"))
            message = {"channel_id": CHANNEL, "author_id": ALICE.id, "content": "over there"}
            async with http.post(f"{control}/messages", json=message) as response:
                assert response.status == 200

            async def sent() -> list[str]:
                async with http.get(f"{control}/sent") as response:
                    return [m["content"] for m in await response.json()]

            async with asyncio.timeout(WAIT_SECONDS):
                while len(await sent()) < 2:  # noqa: ASYNC110 - the fake is another process
                    await asyncio.sleep(0.02)
            assert await sent() == ["direct", "echo: over there"]
    finally:
        if server.returncode is None:
            server.kill()
        await server.wait()


async def test_issue10_dropped_events_are_counted_at_metrics_by_reason(
    tmp_path: Path, fake: DiscordFake
) -> None:
    async with running(write_config(tmp_path, fake)) as gateway:
        connector = gateway.hosted["parrot-dc"].connector
        assert isinstance(connector, DiscordConnector)
        fake.message(CHANNEL, ALICE, "", attachments=[{"id": "1", "filename": "cat.png"}])
        fake.message(CHANNEL, ALICE, "", type=7)  # "alice joined the server"
        await say(fake, "counted?")
        await wait_for(lambda: connector.dropped["own_message"] == 1)  # the echo of the reply
        scraped = await dropped_at_metrics(gateway.port, "discord")
    assert scraped == {"no_text": 1, "service_message": 1, "own_message": 1}
    assert scraped == dict(connector.dropped)
