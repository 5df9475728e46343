"""python-telegram-bot and aiogram bots, guarded, against the fake Telegram Bot API.

Both libraries run for real: PTB's Application with `LoopwardenHandler` in group -1 and
`GuardedBot`, aiogram's Dispatcher with the outer middleware and `ReplyFilter`, polling
the fake over loopback. Each scenario runs with both bots of one library, and with one
bot of each (the cross-library pair shares a SQLite file; the two-process case is in
test_cross_process.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from pathlib import Path

import pytest

from loopwarden_integrations import RoomGuard
from tests.connectors.connector_helpers import wait_for
from tests.fakes.telegram_server import TelegramFake
from tests.integrations import telegram_room as room
from tests.integrations.recording_guard import RecordingGuard
from tests.integrations.telegram_bots import BOTS, POLICY

Runner = Callable[[str, str, str, RoomGuard], AbstractAsyncContextManager[None]]
PAIRS = {
    "ptb": (BOTS["ptb"], BOTS["ptb"]),
    "aiogram": (BOTS["aiogram"], BOTS["aiogram"]),
    "ptb+aiogram": (BOTS["ptb"], BOTS["aiogram"]),
}


@pytest.fixture
async def fake() -> AsyncIterator[TelegramFake]:
    async with TelegramFake() as server:
        room.setup(server)
        yield server


async def run_pair(
    stack: AsyncExitStack,
    fake: TelegramFake,
    pair: str,
    state: str,
    policy: object = POLICY,
) -> tuple[RecordingGuard, RecordingGuard]:
    """Start Parrot and Echo with the pair's libraries, guarded on one state."""
    parrot_runner, echo_runner = PAIRS[pair]
    parrot = RecordingGuard(policy, state, bot_id=room.PARROT_ID, bot_name="Parrot")
    echo = RecordingGuard(policy, state, bot_id=room.ECHO_ID, bot_name="Echo")
    for guard in (parrot, echo):
        await stack.enter_async_context(guard)
    await stack.enter_async_context(
        parrot_runner(room.PARROT_TOKEN, "parrot", fake.base_url, parrot)
    )
    await stack.enter_async_context(echo_runner(room.ECHO_TOKEN, "echo", fake.base_url, echo))
    return parrot, echo


@pytest.mark.parametrize("pair", list(PAIRS))
async def test_issue15_ping_pong_stops_at_the_budget_with_one_notice(
    fake: TelegramFake, tmp_path: Path, pair: str
) -> None:
    async with AsyncExitStack() as stack:
        parrot, echo = await run_pair(stack, fake, pair, f"sqlite:///{tmp_path / 'state.db'}")
        room.kickoff(fake)
        # Exchanges 1-4 are answered, the 5th opens the cooldown (the notice) and the
        # notice itself, relayed to the other bot, is the 6th: refused in silence.
        await wait_for(lambda: len(parrot.decisions) + len(echo.decisions) == 6)
        await wait_for(lambda: len(fake.sent_to(room.GROUP.id)) == 5)
    posted = room.texts(fake)
    notices = [text for text in posted if text.startswith("Loop guard:")]
    assert len(notices) == 1
    assert "pausing replies between" in notices[0]
    assert len(posted) == 5
    reasons = sorted(d.reason for d in parrot.decisions + echo.decisions)
    assert reasons == ["budget_exceeded", "cooldown", "ok", "ok", "ok", "ok"]


@pytest.mark.parametrize("pair", ["ptb", "aiogram"])
async def test_issue15_a_human_resets_the_consecutive_turn_count(
    fake: TelegramFake, tmp_path: Path, pair: str
) -> None:
    policy = {"bot_loop": {"max_events_per_window": 100, "max_consecutive_bot_turns": 2}}
    async with AsyncExitStack() as stack:
        parrot, echo = await run_pair(stack, fake, pair, f"sqlite:///{tmp_path / 's.db'}", policy)
        room.kickoff(fake)
        # Turn 1 (kickoff) and 2 are answered; the reply to turn 2 is turn 3, over the cap.
        await wait_for(lambda: len(parrot.decisions) + len(echo.decisions) == 3)
        assert len(fake.sent_to(room.GROUP.id)) == 2
        reasons = sorted(d.reason for d in parrot.decisions + echo.decisions)
        assert reasons == ["bot_turn_cap", "ok", "ok"]
        fake.group_message(room.GROUP, room.ALICE, "go on")
        # Alice resets the count: both bots answer her, and each answer is answered once.
        await wait_for(lambda: len(fake.sent_to(room.GROUP.id)) == 6)
        await wait_for(lambda: len(parrot.decisions) + len(echo.decisions) == 9)
    caps = [d for d in parrot.decisions + echo.decisions if d.reason == "bot_turn_cap"]
    assert len(caps) == 3
    assert not any(text.startswith("Loop guard:") for text in room.texts(fake))


@pytest.mark.parametrize("pair", ["ptb", "aiogram"])
async def test_issue15_no_reply_never_reaches_the_chat(
    fake: TelegramFake, tmp_path: Path, pair: str
) -> None:
    async with AsyncExitStack() as stack:
        parrot, echo = await run_pair(stack, fake, pair, f"sqlite:///{tmp_path / 'q.db'}")
        fake.group_message(room.GROUP, room.ALICE, "be quiet please")
        fake.group_message(room.GROUP, room.ALICE, "hi")
        await wait_for(lambda: len(parrot.decisions) + len(echo.decisions) >= 4)
        await wait_for(lambda: len(fake.sent_to(room.GROUP.id)) >= 2)
        posted = room.texts(fake)
    assert all("NO_REPLY" not in text for text in room.texts(fake))
    assert any(text.startswith("ping from") for text in posted)


async def test_issue15_a_guard_with_another_bot_id_is_a_clear_error(
    fake: TelegramFake, caplog: pytest.LogCaptureFixture
) -> None:
    guard = RecordingGuard(POLICY, bot_id="9999")
    async with BOTS["ptb"](room.PARROT_TOKEN, "parrot", fake.base_url, guard):
        fake.group_message(room.GROUP, room.ALICE, "hi")
        await wait_for(lambda: "bot_id: the guard's bot_id is '9999'" in caplog.text)
        await wait_for(lambda: not fake.pending(room.PARROT_TOKEN))
    assert fake.sent_to(room.GROUP.id) == []
