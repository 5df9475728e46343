"""slack-bolt apps guarded by `loopwarden_middleware`, against the fake Slack over Socket Mode.

Parrot is a sync `App` (the guard's sync face, bolt's threads), Echo an `AsyncApp` (the
async face); both use `app.use(loopwarden_middleware(guard))` and answer every message with
`say()`. The fake delivers each post to every member app, so they ping-pong. They share
one SQLite file: one pair budget.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from slack_bolt import App, Say
from slack_bolt.adapter.socket_mode import SocketModeHandler
from slack_bolt.adapter.socket_mode.aiohttp import AsyncSocketModeHandler
from slack_bolt.async_app import AsyncApp, AsyncSay
from slack_sdk.web import WebClient
from slack_sdk.web.async_client import AsyncWebClient

from loopwarden_integrations import RoomGuard
from loopwarden_integrations.slack_bolt import loopwarden_middleware
from tests.connectors.connector_helpers import wait_for
from tests.fakes.slack_server import FakeUser, SlackFake
from tests.integrations.recording_guard import RecordingGuard

CHANNEL = "C0PAIR"
ALICE = FakeUser("U0ALICE", "alice")
APPS = {
    "parrot": ("xoxb-parrot-integration", "xapp-1-A0PARROT-parrot", "U0PARROT", "B0PARROT"),
    "echo": ("xoxb-echo-integration", "xapp-1-A0ECHO-echo", "U0ECHO", "B0ECHO"),
}
POLICY = {"bot_loop": {"max_events_per_window": 4, "window_seconds": 300, "cooldown_seconds": 300}}


@pytest.fixture
async def fake() -> AsyncIterator[SlackFake]:
    async with SlackFake() as server:
        for name, (bot_token, app_token, user_id, bot_id) in APPS.items():
            server.add_app(
                name, bot_token=bot_token, user_id=user_id, bot_id=bot_id, app_token=app_token
            )
        server.add_channel(CHANNEL, "parrot", "echo")
        yield server


def answer(name: str) -> Callable[[str], str]:
    counter = itertools.count(1)
    return lambda text: "NO_REPLY" if "quiet" in text else f"ping from {name} {next(counter)}"


def build_sync_app(fake: SlackFake, guard: RoomGuard) -> SocketModeHandler:
    """Parrot's App and its Socket Mode handler (blocking HTTP: built in a thread)."""
    bot_token, app_token, _, _ = APPS["parrot"]
    app = App(client=WebClient(token=bot_token, base_url=fake.base_url))
    app.use(loopwarden_middleware(guard))
    reply = answer("parrot")

    @app.event("message")
    def on_message(event: dict[str, Any], say: Say) -> None:
        say(reply(event.get("text", "")))

    handler = SocketModeHandler(app, app_token, web_client=app.client)
    handler.connect()  # type: ignore[no-untyped-call]
    return handler


@asynccontextmanager
async def sync_app(fake: SlackFake, guard: RoomGuard) -> AsyncIterator[None]:
    """The sync App runs in bolt's threads; the fake needs this loop free meanwhile."""
    handler = await asyncio.to_thread(build_sync_app, fake, guard)
    try:
        yield
    finally:
        await asyncio.to_thread(handler.close)


@asynccontextmanager
async def async_app(fake: SlackFake, guard: RoomGuard) -> AsyncIterator[None]:
    bot_token, app_token, _, _ = APPS["echo"]
    app = AsyncApp(client=AsyncWebClient(token=bot_token, base_url=fake.base_url))
    app.use(loopwarden_middleware(guard))
    reply = answer("echo")

    @app.event("message")
    async def on_message(event: dict[str, Any], say: AsyncSay) -> None:
        await say(reply(event.get("text", "")))

    handler = AsyncSocketModeHandler(app, app_token, web_client=app.client)
    await handler.connect_async()  # type: ignore[no-untyped-call]
    try:
        yield
    finally:
        await handler.close_async()  # type: ignore[no-untyped-call]


async def start_pair(
    stack: AsyncExitStack, fake: SlackFake, state: str
) -> tuple[RecordingGuard, RecordingGuard]:
    parrot = RecordingGuard(POLICY, state, bot_id="U0PARROT", bot_name="parrot")
    echo = RecordingGuard(POLICY, state, bot_id="U0ECHO", bot_name="echo")
    stack.push_async_callback(asyncio.to_thread, parrot.close)
    await stack.enter_async_context(sync_app(fake, parrot))
    await stack.enter_async_context(echo)
    await stack.enter_async_context(async_app(fake, echo))
    await wait_for(lambda: all(app.sockets for app in fake.apps.values()))
    return parrot, echo


def decided(*guards: RecordingGuard) -> int:
    return sum(len(guard.decisions) for guard in guards)


async def test_issue15_slack_app_and_async_app_stop_at_the_budget_with_one_notice(
    fake: SlackFake, tmp_path: Path
) -> None:
    async with AsyncExitStack() as stack:
        parrot, echo = await start_pair(stack, fake, f"sqlite:///{tmp_path / 's.db'}")
        fake.message(CHANNEL, fake.apps["echo"].user, "hello parrot")
        await wait_for(lambda: decided(parrot, echo) >= 6)
        await wait_for(lambda: len(fake.texts()) == 5)
    notices = [text for text in fake.texts() if text.startswith("Loop guard:")]
    assert len(notices) == 1
    reasons = sorted(d.reason for d in parrot.decisions + echo.decisions)
    assert reasons[:2] == ["budget_exceeded", "cooldown"]
    assert reasons.count("ok") == 4


async def test_issue15_slack_no_reply_never_reaches_the_channel(
    fake: SlackFake, tmp_path: Path
) -> None:
    async with AsyncExitStack() as stack:
        parrot, echo = await start_pair(stack, fake, f"sqlite:///{tmp_path / 'q.db'}")
        fake.message(CHANNEL, ALICE, "be quiet please")
        await wait_for(lambda: decided(parrot, echo) == 2)
        fake.message(CHANNEL, ALICE, "hi")
        await wait_for(lambda: len(fake.texts()) >= 2)
    assert all("NO_REPLY" not in text for text in fake.texts())
