"""Streamed replies on Discord: real discord.py, message edits on the fake."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from connectors.discord import DiscordConnector
from connectors.discord.connector import MAX_MESSAGE_LENGTH
from gateway.config import DiscordBotConfig
from gateway.delivery.chunking import chunk_text
from tests.connectors import stream_cases
from tests.connectors.connector_helpers import Inbox, running, services, wait_for
from tests.connectors.stream_cases import STREAMED_REPLY, StreamRoom, write_streaming_config
from tests.fakes.discord_server import DiscordFake, FakeUser
from tests.fakes.llm_upstream import FakeLLM

TOKEN = "MTAwMDAwMDAwMDAwMDAwMDAx.parrot.streaming-test-token"
PARROT = FakeUser(900001, "Parrot", bot=True)
ALICE = FakeUser(500001, "alice")
GUILD, CHANNEL, OTHER_CHANNEL = 100, 200, 201
RETRY_AFTER = 0.05
SDK_TRIES = 5  # discord.py waits out this many 429s itself before it gives up


@pytest.fixture
async def room() -> AsyncIterator[StreamRoom]:
    async with DiscordFake() as fake:
        fake.world.add_bot(TOKEN, PARROT)
        fake.world.add_guild(GUILD, "Lounge", [ALICE, PARROT])
        fake.world.add_channel(GUILD, CHANNEL, "general")
        fake.world.add_channel(GUILD, OTHER_CHANNEL, "random")
        config = DiscordBotConfig.model_validate(
            {
                "id": "parrot-dc",
                "platform": "discord",
                "token": TOKEN,
                "agent": "parrot",
                "api_base_url": fake.base_url,
                "gateway_url": fake.gateway_url,
            }
        )
        connector = DiscordConnector(config, services())
        await connector.start(Inbox())
        try:
            yield StreamRoom(
                connector=connector,
                channel=str(CHANNEL),
                other_channel=str(OTHER_CHANNEL),
                shown=lambda channel: [
                    fake.content_of(sent.message_id)
                    for sent in fake.sent
                    if sent.channel_id == int(channel)
                ],
                rate_limit_next_edit=lambda seconds: fake.fail_next_edits(SDK_TRIES, seconds),
                refuse_next_edit=lambda: fake.refuse_next_edits(1),
                edit_attempts=lambda: fake.edit_attempts,
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
    async with FakeLLM() as llm, DiscordFake() as fake:
        fake.world.add_bot(TOKEN, PARROT)
        fake.world.add_guild(GUILD, "Lounge", [ALICE, PARROT])
        fake.world.add_channel(GUILD, CHANNEL, "general")
        bot = f"""  - id: parrot-dc
    platform: discord
    token: "{TOKEN}"
    agent: helper
    api_base_url: "{fake.base_url}"
    gateway_url: "{fake.gateway_url}"
"""
        async with running(write_streaming_config(tmp_path, llm, bot)):
            fake.message(CHANNEL, ALICE, "quiet please")
            fake.message(CHANNEL, ALICE, "tell me everything")
            expected = chunk_text(STREAMED_REPLY, MAX_MESSAGE_LENGTH)

            def shown() -> list[str]:
                return [fake.content_of(m.message_id) for m in fake.sent]

            await wait_for(lambda: shown() == expected)
        assert len(llm.requests) == 2, "both turns reached the model"
        assert fake.edits, "the reply was edited as it streamed"
        everything = [m.content for m in fake.sent] + [edit.content for edit in fake.edits]
        assert all("NO_REPLY" not in text for text in everything)
