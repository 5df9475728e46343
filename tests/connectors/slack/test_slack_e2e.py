"""End to end: a YAML config file in, the real runtime, slack-bolt and slack-sdk, the fake out.

In-process tests build the gateway the way `loopwarden run` does (`load_config` of a file,
then `Gateway`); one test runs `python -m gateway run` as a real subprocess for SIGTERM and
token hygiene. The main flows run over Socket Mode; signatures, url_verification, retries
and slash commands over the Events API. Every wait is a bounded poll, never a fixed sleep.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from connectors.slack import SlackConnector
from gateway.app.messages import REFUSAL
from gateway.app.runtime import Gateway
from tests.connectors import connector_helpers
from tests.connectors.connector_helpers import (
    BUDGET,
    LONG_REPLY,
    NOTICE,
    assert_no_secret,
    dropped_at_metrics,
    gateway_process,
    wait_for,
    write_e2e_config,
)
from tests.fakes.slack_server import FakeUser, Posted, SlackFake

BOT_TOKEN = "xoxb-1111-2222-parrotBotTokenE2E"
APP_TOKEN = "xapp-1-A0PARROT-3333-parrotAppTokenE2E"
ECHO_BOT_TOKEN = "xoxb-4444-5555-echoBotTokenE2E"
ECHO_APP_TOKEN = "xapp-1-A0ECHO-6666-echoAppTokenE2E"
HOOK_BOT_TOKEN = "xoxb-7777-8888-hookBotTokenE2E"
SIGNING_SECRET = "e2eSigningSecret0123456789abcdef"
ALICE = FakeUser("U0ALICE", "alice")  # an admin
MALLORY = FakeUser("U0MALLORY", "mallory")  # not an admin
OUTSIDER = FakeUser("U0OUTSIDE", "outside-echo", bot_id="B0OUTSIDE")  # a bot not hosted here
LOBBY = "C0LOBBY"
PAIR = "C0PAIR"
HOOKS = "C0HOOKS"
PARROT = """  - id: parrot-sl
    platform: slack
    bot_token: "{bot_token}"
    app_token: "{app_token}"
    agent: parrot
    api_base_url: "{base_url}"
"""

ECHO = """  - id: echo-sl
    platform: slack
    bot_token: "{echo_bot_token}"
    app_token: "{echo_app_token}"
    agent: parrot
    api_base_url: "{base_url}"
"""

HOOK = """  - id: hook-sl
    platform: slack
    bot_token: "{hook_bot_token}"
    signing_secret: "{signing_secret}"
    agent: parrot
    api_base_url: "{base_url}"
"""


def write_config(tmp_path: Path, fake: SlackFake, *bots: str) -> Path:
    values = {
        "bot_token": BOT_TOKEN,
        "app_token": APP_TOKEN,
        "echo_bot_token": ECHO_BOT_TOKEN,
        "echo_app_token": ECHO_APP_TOKEN,
        "hook_bot_token": HOOK_BOT_TOKEN,
        "signing_secret": SIGNING_SECRET,
        "base_url": fake.base_url,
    }
    listed = "".join(bot.format(**values) for bot in bots)
    return write_e2e_config(tmp_path, platform="slack", admin=ALICE.id, bots=listed)


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
            "echo",
            bot_token=ECHO_BOT_TOKEN,
            user_id="U0ECHO",
            bot_id="B0ECHO",
            app_token=ECHO_APP_TOKEN,
        )
        server.add_app(
            "hook",
            bot_token=HOOK_BOT_TOKEN,
            user_id="U0HOOK",
            bot_id="B0HOOK",
            signing_secret=SIGNING_SECRET,
        )
        server.add_channel(LOBBY, "parrot")
        server.add_channel(PAIR, "parrot", "echo")
        server.add_channel(HOOKS, "hook")
        yield server


@asynccontextmanager
async def running(path: Path, fake: SlackFake) -> AsyncIterator[Gateway]:
    """The gateway of a config file, run as `loopwarden run` does; the fake posts events to it."""
    async with connector_helpers.running(path) as gateway:
        fake.apps["hook"].events_url = events_url(gateway.port)
        yield gateway


def events_url(port: int) -> str:
    """The Events API route of the `hook-sl` bot on a gateway serving on `port`."""
    return f"http://127.0.0.1:{port}/slack/hook-sl/events"


def assert_never_posted_silence(fake: SlackFake) -> None:
    assert all("NO_REPLY" not in p.text for p in fake.posted)


async def say(
    fake: SlackFake,
    text: str,
    sender: FakeUser = ALICE,
    channel: str = LOBBY,
    thread_ts: str | None = None,
) -> Posted:
    """A message in a channel; waits for and returns the next post."""
    before = len(fake.posted)
    fake.message(channel, sender, text, thread_ts=thread_ts)
    await wait_for(lambda: len(fake.posted) > before)
    return fake.posted[before]


async def test_human_message_gets_the_agents_reply_in_place(
    tmp_path: Path, fake: SlackFake
) -> None:
    async with running(write_config(tmp_path, fake, PARROT), fake):
        reply = await say(fake, "hello there")
        assert (reply.app, reply.channel, reply.text) == ("parrot", LOBBY, "echo: hello there")
        assert reply.thread_ts is None
        threaded = await say(fake, "in a thread", thread_ts=reply.ts)
        assert threaded.text == "echo: in a thread"
        assert threaded.thread_ts == reply.ts
        assert fake.texts() == ["echo: hello there", "echo: in a thread"]


async def test_outside_bot_loop_is_cut_announced_once_and_reset_by_admin_only(
    tmp_path: Path, fake: SlackFake
) -> None:
    def outside_bot_answers(posted: Posted) -> None:
        if posted.app == "parrot" and posted.ephemeral_to is None:
            fake.message(LOBBY, OUTSIDER, f"ping {posted.ts}")

    async with running(write_config(tmp_path, fake, PARROT), fake):
        fake.on_post = outside_bot_answers
        await say(fake, "start the ping-pong")
        await wait_for(lambda: any(p.text.startswith(NOTICE) for p in fake.posted))
        # The notice itself draws one more ping, refused in cooldown: wait until it was read.
        await wait_for(lambda: not fake.pending("parrot"))
        answers_to_bot = [p for p in fake.posted if p.text.startswith("echo: ping")]
        assert len(answers_to_bot) == BUDGET
        assert "!loop reset" in next(p.text for p in fake.posted if p.text.startswith(NOTICE))
        fake.on_post = None

        refusal = await say(fake, "!loop reset", sender=MALLORY)
        assert refusal.text == REFUSAL
        assert refusal.ephemeral_to == MALLORY.id
        fake.message(LOBBY, OUTSIDER, "ping after refusal")
        ack = await say(fake, "<@U0PARROT> !loop reset")
        assert "reset" in ack.text.lower()
        assert ack.ephemeral_to is None
        assert not any(p.text == "echo: ping after refusal" for p in fake.posted)
        # Two pings were dropped in this cooldown (the notice's and the one above): one notice.
        assert sum(p.text.startswith(NOTICE) for p in fake.posted) == 1

        fake.on_post = outside_bot_answers
        resumed = await say(fake, "ping again", sender=OUTSIDER)
        assert resumed.text == "echo: ping again"
        await wait_for(lambda: sum(p.text.startswith(NOTICE) for p in fake.posted) == 2)
        fake.on_post = None
        await wait_for(lambda: not fake.pending("parrot"))
        notices = [p for p in fake.posted if p.text.startswith(NOTICE)]
        assert len(notices) == 2  # one per cooldown, not one per dropped message
        assert_never_posted_silence(fake)


async def test_two_hosted_bots_answering_each_other_are_cut_at_the_budget(
    tmp_path: Path, fake: SlackFake
) -> None:
    async with running(write_config(tmp_path, fake, PARROT, ECHO), fake):
        fake.message(PAIR, ALICE, "hi bots")
        await wait_for(lambda: any(p.text.startswith(NOTICE) for p in fake.posted))
        await wait_for(lambda: not fake.pending("parrot") and not fake.pending("echo"))
        before = len(fake.posted)
        fake.message(PAIR, ALICE, "still there?")
        await wait_for(
            lambda: (
                sorted(p.app for p in fake.posted[before:] if p.text == "echo: still there?")
                == ["echo", "parrot"]
            )
        )
        await wait_for(lambda: not fake.pending("parrot") and not fake.pending("echo"))
        bot_to_bot = [p for p in fake.posted if p.text.startswith("echo: echo:")]
        assert len(bot_to_bot) == BUDGET
        assert len([p for p in fake.posted if p.text.startswith(NOTICE)]) == 1
        assert {p.app for p in fake.posted if p.text == "echo: hi bots"} == {"parrot", "echo"}


async def test_silence_is_never_posted(tmp_path: Path, fake: SlackFake) -> None:
    async with running(write_config(tmp_path, fake, PARROT), fake):
        fake.message(LOBBY, ALICE, "quiet please")
        reply = await say(fake, "after the silence")
        assert reply.text == "echo: after the silence"
        assert fake.texts() == ["echo: after the silence"]
        assert_never_posted_silence(fake)


async def test_long_reply_arrives_as_ordered_chunks_within_the_limit(
    tmp_path: Path, fake: SlackFake
) -> None:
    async with running(write_config(tmp_path, fake, PARROT), fake):
        fake.message(LOBBY, ALICE, "long story please")
        await wait_for(lambda: sum(len(p.text) for p in fake.posted) >= len(LONG_REPLY) - 10)
        chunks = fake.texts()
        assert len(chunks) == 2
        assert all(len(chunk) <= 4000 for chunk in chunks)
        assert " ".join(chunk.strip() for chunk in chunks).split() == LONG_REPLY.split()
        assert "(1/2)" not in chunks[0]


async def test_rate_limit_delays_then_delivers_exactly_once(
    tmp_path: Path, fake: SlackFake
) -> None:
    async with running(write_config(tmp_path, fake, PARROT), fake):
        fake.fail_next_posts(1, retry_after=1)
        attempts = fake.post_attempts
        limited_at = time.monotonic()
        reply = await say(fake, "through the flood")
        assert reply.text == "echo: through the flood"
        assert fake.post_attempts == attempts + 2
        assert reply.at - limited_at >= 0.9  # waited for Slack's Retry-After
        await say(fake, "next")
        assert fake.texts() == ["echo: through the flood", "echo: next"]


async def test_redelivered_envelope_and_mention_pair_are_answered_once(
    tmp_path: Path, fake: SlackFake
) -> None:
    event = {
        "type": "message",
        "channel": LOBBY,
        "user": ALICE.id,
        "text": "only once",
        "ts": "1699999999.000100",
        "channel_type": "channel",
    }
    async with running(write_config(tmp_path, fake, PARROT), fake):
        payload = fake.deliver_event("parrot", event)
        fake.redeliver("parrot", payload, attempt=1)
        fake.redeliver("parrot", {**payload, "event_id": "Ev0RETRY"}, attempt=2)
        await wait_for(lambda: not fake.pending("parrot"))
        fake.message(LOBBY, ALICE, "<@U0PARROT> you there?")  # message + app_mention
        await wait_for(lambda: not fake.pending("parrot"))
        await say(fake, "and then")
        assert fake.texts() == ["echo: only once", "echo: you there?", "echo: and then"]


async def test_odd_events_are_dropped_and_the_next_message_is_answered_once(
    tmp_path: Path, fake: SlackFake
) -> None:
    async with running(write_config(tmp_path, fake, PARROT), fake) as gateway:
        connector = gateway.hosted["parrot-sl"].connector
        fake.deliver_event("parrot", {"type": "reaction_added", "user": ALICE.id, "reaction": "+1"})
        fake.deliver("parrot", {"type": "mystery_payload"})
        fake.message(LOBBY, ALICE, "", extra={"subtype": "file_share", "files": [{"id": "F1"}]})
        fake.message(
            LOBBY, ALICE, "<@U0BOB> has joined the channel", extra={"subtype": "channel_join"}
        )
        fake.deliver_event(
            "parrot", {"type": "message", "channel": LOBBY, "ts": "1.000001", "text": "nobody"}
        )
        fake.deliver_event(
            "parrot",
            {
                "type": "message",
                "channel": "C0GHOST",
                "user": ALICE.id,
                "ts": "1.000002",
                "text": "from a channel the bot is not in",
            },
        )
        await fake.send_raw("parrot", "{not json")
        await wait_for(lambda: not fake.pending("parrot"))
        await fake.drop_connections("parrot")
        await wait_for(lambda: fake.apps["parrot"].connections == 2 and connector.connected)
        await fake.send_disconnect("parrot")
        await wait_for(lambda: fake.apps["parrot"].connections == 3 and connector.connected)
        reply = await say(fake, "anyone home?")
        assert reply.text == "echo: anyone home?"
        await say(fake, "still fine")
        assert fake.texts() == ["echo: anyone home?", "echo: still fine"]
        assert gateway.ready


async def test_events_api_verifies_signatures_and_answers_a_retry_once(
    tmp_path: Path, fake: SlackFake
) -> None:
    async with running(write_config(tmp_path, fake, HOOK), fake):
        challenge = {"token": "x", "challenge": "c-123", "type": "url_verification"}
        status, body = await fake.post_event("hook", challenge)
        assert (status, json.loads(body)) == (200, {"challenge": "c-123"})

        event = fake.event_callback(
            "hook",
            {
                "type": "message",
                "channel": HOOKS,
                "user": ALICE.id,
                "ts": "1699999999.000200",
                "text": "by events api",
            },
        )
        assert (await fake.post_event("hook", event, signed=False))[0] == 401
        assert (await fake.post_event("hook", event, secret="forged-secret"))[0] == 401
        assert (await fake.post_event("hook", event, timestamp=int(time.time()) - 600))[0] == 401
        assert (await fake.post_event("hook", "not json"))[0] == 400
        assert (await fake.post_event("hook", event))[0] == 200
        await wait_for(lambda: fake.texts() == ["echo: by events api"])
        assert (await fake.post_event("hook", event, retry_num=1))[0] == 200
        assert (await fake.post_event("hook", event, retry_num=2))[0] == 200

        before = len(fake.posted)
        fake.message(HOOKS, ALICE, "delivered by slack")
        await wait_for(lambda: len(fake.posted) > before)
        assert fake.texts() == ["echo: by events api", "echo: delivered by slack"]

        fake.slash_command("hook", HOOKS, MALLORY, "reset")
        await wait_for(lambda: len(fake.posted) == before + 2)
        assert (fake.posted[-1].text, fake.posted[-1].ephemeral_to) == (REFUSAL, MALLORY.id)
        fake.slash_command("hook", HOOKS, ALICE, "status")
        await wait_for(lambda: len(fake.posted) == before + 3)
        assert fake.posted[-1].ephemeral_to is None
        assert fake.posted[-1].text != REFUSAL
        assert all(answer == 200 for answer in fake.apps["hook"].http_answers)


async def test_subprocess_sigterm_exits_zero_and_never_prints_a_secret(
    tmp_path: Path, fake: SlackFake
) -> None:
    path = write_config(tmp_path, fake, PARROT, HOOK)
    async with gateway_process(path) as gateway:
        fake.apps["hook"].events_url = events_url(await gateway.ready())
        reply = await say(fake, "hello from outside")
        assert reply.text == "echo: hello from outside"
        fake.fail_next_posts(1, retry_after=1)
        await say(fake, "and through a 429")
        hooked = await say(fake, "and over http", channel=HOOKS)
        assert hooked.text == "echo: and over http"
        assert (await fake.post_event("hook", "junk"))[0] == 400
        assert (await fake.post_event("hook", {"type": "x"}, secret="forged"))[0] == 401
        await fake.drop_connections("parrot")
        await wait_for(lambda: fake.apps["parrot"].connections == 2)
        await say(fake, "after the reconnect")
        taken = await gateway.terminate()
    assert gateway.returncode == 0, gateway.output
    assert taken < 10
    logged = gateway.output
    assert "DEBUG" in logged
    assert "apps.connections.open" in logged  # slack-sdk's DEBUG request lines were emitted
    assert_no_secret(logged, BOT_TOKEN, APP_TOKEN, HOOK_BOT_TOKEN, SIGNING_SECRET)


async def test_issue10_dropped_events_are_counted_at_metrics_by_reason(
    tmp_path: Path, fake: SlackFake
) -> None:
    async with running(write_config(tmp_path, fake, PARROT, HOOK), fake) as gateway:
        parrot = gateway.hosted["parrot-sl"].connector
        hook = gateway.hosted["hook-sl"].connector
        assert isinstance(parrot, SlackConnector)
        assert isinstance(hook, SlackConnector)
        fake.deliver_event("parrot", {"type": "reaction_added", "user": ALICE.id, "reaction": "+1"})
        fake.message(LOBBY, ALICE, "", extra={"subtype": "file_share", "files": [{"id": "F1"}]})
        await wait_for(lambda: not fake.pending("parrot"))
        event = fake.event_callback(
            "hook",
            {"type": "message", "channel": HOOKS, "user": ALICE.id, "ts": "1.5", "text": "x"},
        )
        assert (await fake.post_event("hook", event, secret="forged-secret"))[0] == 401
        assert (await fake.post_event("hook", "[1, 2]"))[0] == 400
        await say(fake, "counted?")
        scraped = await dropped_at_metrics(gateway.port, "slack")
    assert scraped == {"unsupported": 1, "no_text": 1, "unauthorized": 1, "malformed": 1}
    assert scraped == dict(parrot.dropped + hook.dropped)
