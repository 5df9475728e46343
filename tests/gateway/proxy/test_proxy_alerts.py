"""Alerts to local receivers: an aiohttp webhook, the Telegram fake and aiosmtpd (issue 6)."""

from __future__ import annotations

import asyncio
import email
import email.policy
import socket
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from email.message import EmailMessage

import aiohttp
import openai
import pytest
from aiohttp import web
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, AuthResult, Envelope, LoginPassword, Session
from pydantic import SecretStr

from gateway.app.errors import LoopwardenError
from gateway.config.proxy import EmailAlert, TelegramAlert, WebhookAlert
from gateway.proxy.alerts import (
    Alert,
    AlertDeliveryError,
    Alerter,
    EmailChannel,
    TelegramChannel,
    WebhookChannel,
)
from tests.fakes.loopback import LOOPBACK_HOST, serve_loopback
from tests.fakes.telegram_server import FakeChat, TelegramFake
from tests.gateway.proxy.proxy_helpers import MODEL, PROXY_KEY, running_proxy

BOT_TOKEN = "123456:alert-bot-token-xyz"
CHAT_ID = -100_777
SMTP_PASSWORD = "smtp-pass-4f3e"
HOOK_PATH = "/services/T000/B000/hook-secret-9z"

ALERT = Alert(
    agent="billing-bot",
    session="run-1",
    circuit="billing-bot/session=run-1",
    count=6,
    code="loop_detected",
    subject="loopwarden: billing-bot paused (loop_detected)",
    text="loopwarden: agent billing-bot looks stuck in a loop",
)


async def no_wait(seconds: float) -> None:
    """Retries without waiting (the backoff itself is tenacity's)."""


@dataclass
class Hook:
    """A local webhook receiver that can fail or hang on demand."""

    url: str = ""
    received: list[dict[str, object]] = field(default_factory=list)
    failures: int = 0
    hold: asyncio.Event | None = None

    async def handle(self, request: web.Request) -> web.Response:
        if self.hold is not None:
            await self.hold.wait()
        if self.failures:
            self.failures -= 1
            return web.Response(status=500)
        self.received.append(await request.json())
        return web.Response(status=204)


@pytest.fixture
async def hook() -> AsyncIterator[Hook]:
    receiver = Hook()
    app = web.Application()
    app.router.add_post(HOOK_PATH, receiver.handle)
    runner = web.AppRunner(app, access_log=None)
    port = await serve_loopback(runner)
    receiver.url = f"http://{LOOPBACK_HOST}:{port}{HOOK_PATH}"
    yield receiver
    if receiver.hold is not None:
        receiver.hold.set()
    await runner.cleanup()


@pytest.fixture
async def telegram() -> AsyncIterator[TelegramFake]:
    async with TelegramFake() as fake:
        fake.add_bot(BOT_TOKEN, 123456, "alert_bot")
        fake.add_chat(FakeChat(CHAT_ID, "supergroup", "ops"), BOT_TOKEN)
        yield fake


class Mailbox:
    """An aiosmtpd handler that keeps the messages and the logins it saw."""

    def __init__(self) -> None:
        self.messages: list[EmailMessage] = []
        self.logins: list[tuple[bytes, bytes]] = []

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        content = envelope.content
        assert isinstance(content, bytes)
        parsed = email.message_from_bytes(content, policy=email.policy.default)
        assert isinstance(parsed, EmailMessage)
        self.messages.append(parsed)
        return "250 OK"

    def authenticate(
        self,
        server: SMTP,
        session: Session,
        envelope: Envelope,
        mechanism: str,
        auth_data: object,
    ) -> AuthResult:
        assert isinstance(auth_data, LoginPassword)
        self.logins.append((auth_data.login, auth_data.password))
        return AuthResult(success=auth_data.password == SMTP_PASSWORD.encode())


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@pytest.fixture
def smtp() -> Iterator[tuple[Mailbox, int]]:
    mailbox = Mailbox()
    port = free_port()
    controller = Controller(
        mailbox,
        hostname="127.0.0.1",
        port=port,
        authenticator=mailbox.authenticate,
        auth_require_tls=False,
    )
    controller.start()
    yield mailbox, port
    controller.stop()


def email_config(port: int, **extra: object) -> EmailAlert:
    data: dict[str, object] = {
        "host": "127.0.0.1",
        "port": port,
        "from": "loopwarden@example.com",
        "to": ["ops@example.com", "oncall@example.com"],
        "starttls": False,
    }
    data.update(extra)
    return EmailAlert.model_validate(data)


async def test_issue6_the_webhook_gets_slack_and_discord_json(hook: Hook) -> None:
    alerter = Alerter([WebhookChannel(WebhookAlert(url=SecretStr(hook.url)))], sleep=no_wait)
    alerter.notify(ALERT)
    await alerter.settle()
    await alerter.drain(1.0)
    assert hook.received == [{"text": ALERT.text, "content": ALERT.text}]
    assert alerter.delivered == 1


async def test_issue6_a_failing_delivery_is_retried(hook: Hook) -> None:
    hook.failures = 2
    alerter = Alerter([WebhookChannel(WebhookAlert(url=SecretStr(hook.url)))], sleep=no_wait)
    alerter.notify(ALERT)
    await alerter.settle()
    await alerter.drain(1.0)
    assert len(hook.received) == 1


async def test_a_delivery_given_up_is_logged_without_the_url(
    hook: Hook, caplog: pytest.LogCaptureFixture
) -> None:
    hook.failures = 10
    alerter = Alerter(
        [WebhookChannel(WebhookAlert(url=SecretStr(hook.url)))], attempts=3, sleep=no_wait
    )
    alerter.notify(ALERT)
    await alerter.settle()
    await alerter.drain(1.0)
    assert (alerter.delivered, alerter.failed) == (0, 1)
    assert hook.received == []
    warning = next(r for r in caplog.records if "not delivered" in r.getMessage())
    assert "HTTP 500" in warning.getMessage()
    assert all("hook-secret" not in r.getMessage() for r in caplog.records)


async def test_issue6_notify_never_waits_and_drain_is_bounded(hook: Hook) -> None:
    hook.hold = asyncio.Event()
    alerter = Alerter([WebhookChannel(WebhookAlert(url=SecretStr(hook.url)))], sleep=no_wait)
    alerter.notify(ALERT)  # returns at once although the receiver hangs
    assert alerter.pending == 1
    await alerter.drain(0.1)
    assert alerter.pending == 0
    assert hook.received == []


async def test_issue6_telegram_gets_send_message(telegram: TelegramFake) -> None:
    config = TelegramAlert(
        bot_token=SecretStr(BOT_TOKEN), chat_id=str(CHAT_ID), api_base_url=telegram.base_url
    )
    alerter = Alerter([TelegramChannel(config)], sleep=no_wait)
    alerter.notify(ALERT)
    await alerter.settle()
    await alerter.drain(1.0)
    assert [m.text for m in telegram.sent_to(CHAT_ID, BOT_TOKEN)] == [ALERT.text]


async def test_telegram_failures_are_retried(telegram: TelegramFake) -> None:
    telegram.fail_next_sends(2, retry_after=0)
    config = TelegramAlert(
        bot_token=SecretStr(BOT_TOKEN), chat_id=str(CHAT_ID), api_base_url=telegram.base_url
    )
    alerter = Alerter([TelegramChannel(config)], sleep=no_wait)
    alerter.notify(ALERT)
    await alerter.settle()
    await alerter.drain(1.0)
    assert len(telegram.sent_to(CHAT_ID)) == 1
    assert telegram.send_attempts == 3


async def test_issue6_email_goes_out_by_smtp_with_login(smtp: tuple[Mailbox, int]) -> None:
    mailbox, port = smtp
    config = email_config(port, username="alerts", password=SMTP_PASSWORD)
    alerter = Alerter([EmailChannel(config)], sleep=no_wait)
    alerter.notify(ALERT)
    await alerter.settle()
    await alerter.drain(1.0)
    (message,) = mailbox.messages
    assert message["Subject"] == ALERT.subject
    assert message["To"] == "ops@example.com, oncall@example.com"
    assert ALERT.text in message.get_content()
    assert mailbox.logins == [(b"alerts", SMTP_PASSWORD.encode())]


async def test_an_unreachable_smtp_server_is_a_failed_delivery(
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = email_config(free_port(), username="alerts", password=SMTP_PASSWORD)
    alerter = Alerter([EmailChannel(config)], attempts=2, sleep=no_wait)
    alerter.notify(ALERT)
    await alerter.settle()
    await alerter.drain(1.0)
    assert (alerter.delivered, alerter.failed) == (0, 1)
    assert any("not delivered by email" in r.getMessage() for r in caplog.records)
    assert all(SMTP_PASSWORD not in r.getMessage() for r in caplog.records)


async def test_issue6_a_loop_through_the_proxy_alerts_all_three(
    hook: Hook, telegram: TelegramFake, smtp: tuple[Mailbox, int]
) -> None:
    mailbox, port = smtp
    alerts = f"""
    alerts:
      webhook: '{hook.url}'
      telegram:
        {{bot_token: '{BOT_TOKEN}', chat_id: {CHAT_ID}, api_base_url: '{telegram.base_url}'}}
      email:
        {{host: 127.0.0.1, port: {port}, from: lw@example.com, to: ops@example.com,
          starttls: false}}
    """
    async with running_proxy(alerts, configured_alerts=True) as rig:
        async with openai.AsyncOpenAI(
            base_url=f"{rig.url}/openai/v1",
            api_key=PROXY_KEY,
            default_headers={"X-Loopwarden-Session": "night-run"},
        ) as sdk:
            for _ in range(5):
                await sdk.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": "again"}]
                )
            with pytest.raises(openai.RateLimitError):
                await sdk.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": "again"}]
                )
        await rig.proxy.settle()
    for text in (
        str(hook.received[0]["text"]),
        telegram.sent_to(CHAT_ID)[0].text,
        mailbox.messages[0].get_content(),
    ):
        assert "billing-bot" in text
        assert "night-run" in text
        assert "6 identical calls" in text
        assert "billing-bot/session=night-run" in text


async def test_issue10_a_failed_delivery_is_a_loopwarden_error_without_the_url() -> None:
    """A webhook answering 500 raises AlertDeliveryError, one of loopwarden's own errors."""

    async def refuse(request: web.Request) -> web.Response:
        return web.Response(status=500)

    app = web.Application()
    app.router.add_post(HOOK_PATH, refuse)
    runner = web.AppRunner(app)
    port = await serve_loopback(runner)
    url = f"http://{LOOPBACK_HOST}:{port}{HOOK_PATH}"
    channel = WebhookChannel(WebhookAlert(url=SecretStr(url)))
    try:
        async with aiohttp.ClientSession() as http:
            with pytest.raises(LoopwardenError) as caught:
                await channel.deliver(ALERT, http)
    finally:
        await runner.cleanup()
    assert isinstance(caught.value, AlertDeliveryError)
    assert str(caught.value) == "webhook: HTTP 500"
