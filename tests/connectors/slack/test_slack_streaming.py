"""Streamed replies on Slack: real slack-sdk, `chat.update` on the fake."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from pydantic import SecretStr

from connectors.slack import SlackConnector
from connectors.slack.connector import MAX_MESSAGE_LENGTH
from gateway.config import SlackBotConfig
from gateway.delivery.chunking import chunk_text
from tests.connectors import stream_cases
from tests.connectors.connector_helpers import Inbox, running, services, wait_for
from tests.connectors.stream_cases import STREAMED_REPLY, StreamRoom, write_streaming_config
from tests.fakes.llm_upstream import FakeLLM
from tests.fakes.slack_server import FakeUser, SlackFake

BOT_TOKEN = "xoxb-1111-parrot-streaming-token"
APP_TOKEN = "xapp-1-A1111-parrot-streaming-app-token"
RETRY_AFTER = 3.0
ALICE = FakeUser("U0ALICE", "alice")


def add_parrot(fake: SlackFake) -> None:
    """The hosted app, on Socket Mode."""
    fake.add_app("parrot", bot_token=BOT_TOKEN, user_id="U0P", bot_id="B0P", app_token=APP_TOKEN)


@pytest.fixture
async def room() -> AsyncIterator[StreamRoom]:
    async with SlackFake() as fake:
        add_parrot(fake)
        fake.add_channel("C0LOBBY", "parrot")
        fake.add_channel("C0OTHER", "parrot")
        config = SlackBotConfig(
            id="parrot-sl",
            platform="slack",
            agent="parrot",
            bot_token=SecretStr(BOT_TOKEN),
            app_token=SecretStr(APP_TOKEN),
            api_base_url=fake.base_url,
        )
        connector = SlackConnector(config, services(), ping_interval=0.2)
        await connector.start(Inbox())
        try:
            yield StreamRoom(
                connector=connector,
                channel="C0LOBBY",
                other_channel="C0OTHER",
                shown=lambda channel: [
                    fake.text_of(channel, posted.ts)
                    for posted in fake.posted
                    if posted.channel == channel
                ],
                rate_limit_next_edit=lambda seconds: fake.fail_next_updates(1, retry_after=seconds),
                refuse_next_edit=lambda: fake.refuse_next_updates(1),
                edit_attempts=lambda: fake.update_attempts,
                retry_after=RETRY_AFTER,
            )
        finally:
            await connector.aclose()


@pytest.mark.parametrize("case", list(stream_cases.CASES))
async def test_issue11_streaming(room: StreamRoom, case: str) -> None:
    await stream_cases.CASES[case](room)


async def test_issue11_gateway_streams_openai_replies_and_silent_turns_post_nothing(
    tmp_path: Path,
) -> None:
    async with FakeLLM() as llm, SlackFake() as fake:
        fake.add_app(
            "parrot",
            bot_token=BOT_TOKEN,
            user_id="U0PARROT",
            bot_id="B0PARROT",
            app_token=APP_TOKEN,
        )
        fake.add_channel("C0LOBBY", "parrot")
        bot = f"""  - id: parrot-sl
    platform: slack
    bot_token: "{BOT_TOKEN}"
    app_token: "{APP_TOKEN}"
    agent: helper
    api_base_url: "{fake.base_url}"
"""
        async with running(write_streaming_config(tmp_path, llm, bot)):
            fake.message("C0LOBBY", ALICE, "quiet please")
            fake.message("C0LOBBY", ALICE, "tell me everything")
            expected = chunk_text(STREAMED_REPLY, MAX_MESSAGE_LENGTH)

            def shown() -> list[str]:
                return [fake.text_of("C0LOBBY", posted.ts) for posted in fake.posted]

            await wait_for(lambda: shown() == expected)
        assert len(llm.requests) == 2, "both turns reached the model"
        assert fake.updates, "the reply was edited as it streamed"
        everything = [p.text for p in fake.posted] + [update.text for update in fake.updates]
        assert all("NO_REPLY" not in text for text in everything)
