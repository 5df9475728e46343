"""A bridged room end to end (issue 23): a Synapse room and a Telegram group, linked.

A relay plays the bridge: every message of the Matrix room (but its own) is copied into the
Telegram fake's group by an outside Telegram bot, and every message a bot posts in the
group is copied back into the Matrix room by the relay's Matrix user (named in the
Matrix bot's `bot_users`, as a bridge's ghosts are). One hosted bot on each side answers
everything, so a person's message starts a ping-pong that crosses the bridge. With
`links:` naming the two rooms it is cut at one pair budget, with one notice in each room.
Every wait is a bounded poll, never a fixed sleep.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from tests.connectors.connector_helpers import BUDGET, NOTICE, WAIT_SECONDS, running, wait_for
from tests.connectors.connector_helpers import write_e2e_config as _write_e2e_config
from tests.fakes.synapse_server import SynapseClient, SynapseServer
from tests.fakes.telegram_server import FakeChat, FakeUser, SentMessage, TelegramFake

TOKEN = "123456:AAHbridgeTokenE2E_abcdefghijklmnopq"
GROUP = FakeChat(-100123, "supergroup", "Bridged lounge")
RELAY_TG = FakeUser(8100, "Relay", "RelayBridgeBot", is_bot=True)

MATRIX_BOT = """  - id: mx
    platform: matrix
    homeserver: "{homeserver}"
    user_id: "{user_id}"
    access_token: "{token}"
    agent: parrot
    sync_timeout: 2
    bot_users: ["{relay}"]
"""
TELEGRAM_BOT = """  - id: tg
    platform: telegram
    token: "{token}"
    agent: parrot
    api_base_url: "{base_url}"
    poll_timeout: 1
"""


@pytest.fixture(autouse=True)
def _timedelta_periods(monkeypatch: pytest.MonkeyPatch) -> None:
    """Opt in to PTB's timedelta periods, else its RetryAfter warns (an error under pytest)."""
    monkeypatch.setenv("PTB_TIMEDELTA", "true")


async def _user(synapse: SynapseClient, name: str, *, admin: bool = False) -> tuple[str, str]:
    return await synapse.register(f"issue23-bridge-{name}-{secrets.token_hex(3)}", admin=admin)


class Relay:
    """The bridge: copies the Matrix room into the Telegram group and the group's bots back."""

    def __init__(
        self, synapse: SynapseClient, fake: TelegramFake, room_id: str, user: tuple[str, str]
    ) -> None:
        self._synapse = synapse
        self._fake = fake
        self._room_id = room_id
        self._user_id, self._token = user
        self._copied: set[str] = set()
        self._to_matrix: asyncio.Queue[str] = asyncio.Queue()

    def _sent(self, sent: SentMessage) -> None:
        if sent.chat_id == GROUP.id:
            self._to_matrix.put_nowait(sent.text)

    async def _matrix_to_telegram(self) -> None:
        while True:
            for event in await self._synapse.messages(self._token, self._room_id):
                if event["sender"] != self._user_id and event["event_id"] not in self._copied:
                    self._copied.add(event["event_id"])
                    self._fake.group_message(GROUP, RELAY_TG, event["content"].get("body", ""))
            await asyncio.sleep(0.05)

    async def _telegram_to_matrix(self) -> None:
        while True:
            text = await self._to_matrix.get()
            await self._synapse.send_text(self._token, self._room_id, text)

    @asynccontextmanager
    async def running(self) -> AsyncIterator[Relay]:
        """Copy both ways until the block ends."""
        self._fake.on_send = self._sent
        tasks = [
            asyncio.create_task(self._matrix_to_telegram()),
            asyncio.create_task(self._telegram_to_matrix()),
        ]
        try:
            yield self
        finally:
            self._fake.on_send = None
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


async def _bodies(synapse: SynapseClient, token: str, room_id: str) -> list[tuple[str, str]]:
    events = await synapse.messages(token, room_id)
    return [(e["sender"], e["content"].get("body", "")) for e in events]


async def _until(
    probe: Callable[[], Awaitable[None]], done: Callable[[], bool], limit: float = 3 * WAIT_SECONDS
) -> None:
    """Run the async `probe` until `done` holds (bounded)."""
    async with asyncio.timeout(limit):
        while True:
            await probe()
            if done():
                return
            await asyncio.sleep(0.05)


async def test_issue23_a_ping_pong_across_a_bridge_is_cut_at_one_pair_budget(
    tmp_path: Path, synapse_server: SynapseServer, synapse: SynapseClient
) -> None:
    alice_id, alice_token = await _user(synapse, "alice", admin=True)
    bot_id, bot_token = await _user(synapse, "bot")
    relay = await _user(synapse, "relay")
    room_id = await synapse.create_room(alice_token, invite=[bot_id, relay[0]])
    await synapse.join(bot_token, room_id)
    await synapse.join(relay[1], room_id)

    async with TelegramFake() as fake:
        fake.add_bot(TOKEN, 7001, "ParrotBot")
        fake.add_chat(GROUP, TOKEN)
        bots = MATRIX_BOT.format(
            homeserver=synapse_server.base_url, user_id=bot_id, token=bot_token, relay=relay[0]
        ) + TELEGRAM_BOT.format(token=TOKEN, base_url=fake.base_url)
        links = f'links:\n  - ["matrix:{room_id}", "telegram:{GROUP.id}"]\n'
        config = _write_e2e_config(
            tmp_path, platform="matrix", admin=alice_id, bots=bots, extra=links
        )
        matrix: list[tuple[str, str]] = []

        async def read_matrix() -> None:
            matrix[:] = await _bodies(synapse, alice_token, room_id)

        def from_telegram_bot() -> list[str]:
            return [m.text for m in fake.sent_to(GROUP.id, TOKEN)]

        def from_matrix_bot() -> list[str]:
            return [text for sender, text in matrix if sender == bot_id]

        def notices() -> tuple[int, int]:
            matrix_notices = sum(t.startswith(NOTICE) for t in from_matrix_bot())
            telegram_notices = sum(t.startswith(NOTICE) for t in from_telegram_bot())
            return matrix_notices, telegram_notices

        async with running(config), Relay(synapse, fake, room_id, relay).running():
            await synapse.send_text(alice_token, room_id, "hi bridge")
            await _until(read_matrix, lambda: notices() == (1, 1))
            await synapse.send_text(alice_token, room_id, "/loop status")
            await _until(
                read_matrix, lambda: any(t.startswith("Loop status") for t in from_matrix_bot())
            )
            await wait_for(lambda: not fake.pending(TOKEN))

    echoes = [t for t in from_matrix_bot() + from_telegram_bot() if t.startswith("echo: ")]
    # The Matrix bot answers alice; every other answer is a bot exchange of the link's one
    # pair (the relayed "hi bridge" is a bot's message on Telegram), BUDGET of them, then
    # the cut: one notice in the Matrix room and one in the Telegram group.
    assert len(echoes) == 1 + BUDGET
    assert notices() == (1, 1)
    [status] = [t for t in from_matrix_bot() if t.startswith("Loop status")]
    assert f"Linked with: telegram:{GROUP.id}" in status
    assert "link ↔ link: cooling down" in status
