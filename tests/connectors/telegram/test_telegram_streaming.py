"""Streamed replies on Telegram: real python-telegram-bot, `editMessageText` on the fake."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from pydantic import SecretStr

from connectors.telegram import TelegramConnector
from connectors.telegram.connector import MAX_MESSAGE_LENGTH, TIMING
from gateway.config import TelegramBotConfig
from gateway.delivery.chunking import chunk_text
from tests.connectors import stream_cases
from tests.connectors.connector_helpers import running, services, wait_for
from tests.connectors.stream_cases import STREAMED_REPLY, StreamRoom, write_streaming_config
from tests.fakes.llm_upstream import FakeLLM
from tests.fakes.telegram_server import FakeChat, FakeUser, TelegramFake

TOKEN = "123456:AAHstreamTokenForTests_abcdefghijkl"
GROUP = FakeChat(-1001, "supergroup", "Lounge")
OTHER_GROUP = FakeChat(-1002, "supergroup", "Elsewhere")
ALICE = FakeUser(5678, "Alice", "alice")
RETRY_AFTER = 3


@pytest.fixture(autouse=True)
def _timedelta_periods(monkeypatch: pytest.MonkeyPatch) -> None:
    """Opt in to PTB's timedelta periods, else its RetryAfter warns (an error under pytest)."""
    monkeypatch.setenv("PTB_TIMEDELTA", "true")


@pytest.fixture
async def room() -> AsyncIterator[StreamRoom]:
    async with TelegramFake() as fake:
        fake.add_bot(TOKEN, 7001, "ParrotBot")
        fake.add_chat(GROUP, TOKEN)
        fake.add_chat(OTHER_GROUP, TOKEN)
        config = TelegramBotConfig(
            id="parrot-tg",
            platform="telegram",
            agent="parrot",
            token=SecretStr(TOKEN),
            api_base_url=fake.base_url,
            poll_timeout=1,
        )
        connector = TelegramConnector(config, services(), timing=TIMING)
        await connector.start(lambda message: _ignore())
        try:
            yield StreamRoom(
                connector=connector,
                channel=str(GROUP.id),
                other_channel=str(OTHER_GROUP.id),
                shown=lambda chat: [
                    fake.text_of(int(chat), sent.message_id) for sent in fake.sent_to(int(chat))
                ],
                rate_limit_next_edit=lambda seconds: fake.fail_next_edits(
                    1, retry_after=int(seconds)
                ),
                refuse_next_edit=lambda: fake.refuse_next_edits(1),
                edit_attempts=lambda: fake.edit_attempts,
                retry_after=RETRY_AFTER,
            )
        finally:
            await connector.aclose()


async def _ignore() -> None:
    """The sink: these tests post, they do not read the group."""


@pytest.mark.parametrize("case", list(stream_cases.CASES))
async def test_issue11_streaming(room: StreamRoom, case: str) -> None:
    await stream_cases.CASES[case](room)


async def test_issue11_gateway_streams_openai_replies_and_silent_turns_post_nothing(
    tmp_path: Path,
) -> None:
    bot = f"""  - id: parrot-tg
    platform: telegram
    token: "{TOKEN}"
    agent: helper
    api_base_url: "{{base_url}}"
    poll_timeout: 1
"""
    async with FakeLLM() as llm, TelegramFake() as fake:
        fake.add_bot(TOKEN, 7001, "ParrotBot")
        fake.add_chat(GROUP, TOKEN)
        path = write_streaming_config(tmp_path, llm, bot.format(base_url=fake.base_url))
        async with running(path):
            fake.group_message(GROUP, ALICE, "quiet please")
            fake.group_message(GROUP, ALICE, "tell me everything")
            expected = chunk_text(STREAMED_REPLY, MAX_MESSAGE_LENGTH, units="utf16")

            def shown() -> list[str]:
                return [fake.text_of(GROUP.id, m.message_id) for m in fake.sent_to(GROUP.id)]

            await wait_for(lambda: shown() == expected)
        assert len(llm.requests) == 2, "both turns reached the model"
        assert fake.edits, "the reply was edited as it streamed"
        everything = [m.text for m in fake.sent] + [edit.text for edit in fake.edits]
        assert all("NO_REPLY" not in text for text in everything)
