"""Alerts when a circuit pauses: a webhook (Slack, Discord), Telegram and e-mail.

`Alerter.notify` never waits: each channel's delivery is a background task the alerter
tracks, retried with tenacity (exponential waits, `alerts.attempts` tries), and
`drain()` gives the tasks in flight a bounded time to finish on shutdown. A delivery
that fails for good is logged with the channel and the kind of failure only: error texts
of HTTP clients carry the URL, and the Telegram and webhook URLs carry their token.

Decisions where DESIGN.md is silent:
- The webhook gets `{"text": …, "content": …}`: Slack incoming webhooks read `text`,
  Discord webhooks `content`, and each ignores the other. Any 2xx is a delivery.
- Telegram gets one `sendMessage` (JSON body, `chat_id` and `text`) on `api_base_url`
  (default https://api.telegram.org); `{"ok": false}` is a failure like a 4xx/5xx.
- E-mail goes through the standard library's smtplib in a worker thread: STARTTLS when
  `starttls` (default true), login when `username` is set, one message to every `to`.
"""

from __future__ import annotations

import asyncio
import logging
import smtplib
import ssl
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from email.message import EmailMessage
from typing import Protocol

import aiohttp
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt
from tenacity.wait import wait_exponential

from gateway.app.errors import LoopwardenError
from gateway.config.proxy import AlertsConfig, EmailAlert, TelegramAlert, WebhookAlert
from gateway.proxy import background

log = logging.getLogger("loopwarden.proxy.alerts")

Sleep = Callable[[float], Awaitable[None]]
_HTTP_TIMEOUT = aiohttp.ClientTimeout(total=15)


@dataclass(frozen=True, slots=True)
class Alert:
    """A paused circuit (or rule group): who, where, how many calls, and the text to send."""

    agent: str
    session: str
    circuit: str
    count: int
    code: str
    subject: str
    text: str


class AlertDeliveryError(LoopwardenError):
    """A channel refused or could not take an alert; the text never holds a secret."""


class AlertChannel(Protocol):
    """One place alerts go."""

    @property
    def name(self) -> str:
        """The channel, for logs: "webhook", "telegram" or "email"."""

    async def deliver(self, alert: Alert, http: aiohttp.ClientSession) -> None:
        """Send one alert once; raise AlertDeliveryError (or OSError) when it did not go."""


class WebhookChannel:
    """POSTs `{"text", "content"}` to a Slack or Discord incoming webhook."""

    def __init__(self, config: WebhookAlert) -> None:
        self._url = config.url.get_secret_value()

    @property
    def name(self) -> str:
        """The channel name."""
        return "webhook"

    async def deliver(self, alert: Alert, http: aiohttp.ClientSession) -> None:
        """One POST; any 2xx is a delivery."""
        await _post(self.name, http, self._url, {"text": alert.text, "content": alert.text})


class TelegramChannel:
    """Posts the alert to a Telegram chat with the Bot API's sendMessage."""

    def __init__(self, config: TelegramAlert) -> None:
        base = config.api_base_url.rstrip("/")
        self._url = f"{base}/bot{config.bot_token.get_secret_value()}/sendMessage"
        self._chat_id = config.chat_id

    @property
    def name(self) -> str:
        """The channel name."""
        return "telegram"

    async def deliver(self, alert: Alert, http: aiohttp.ClientSession) -> None:
        """One sendMessage; `ok: false` is a failure."""
        answer = await _post(
            self.name, http, self._url, {"chat_id": self._chat_id, "text": alert.text}
        )
        if not (isinstance(answer, dict) and answer.get("ok") is True):
            raise AlertDeliveryError("telegram: the Bot API did not answer ok")


class EmailChannel:
    """Sends the alert by SMTP (smtplib in a worker thread)."""

    def __init__(self, config: EmailAlert) -> None:
        self._config = config

    @property
    def name(self) -> str:
        """The channel name."""
        return "email"

    async def deliver(self, alert: Alert, http: aiohttp.ClientSession) -> None:
        """One message to every recipient."""
        await asyncio.to_thread(self._send, alert)

    def _send(self, alert: Alert) -> None:
        config = self._config
        message = EmailMessage()
        message["Subject"] = alert.subject
        message["From"] = config.sender
        message["To"] = ", ".join(config.to)
        message.set_content(alert.text)
        try:
            with smtplib.SMTP(config.host, config.port, timeout=config.timeout) as smtp:
                if config.starttls:
                    smtp.starttls(context=ssl.create_default_context())
                if config.username is not None:
                    password = config.password.get_secret_value() if config.password else ""
                    smtp.login(config.username, password)
                smtp.send_message(message)
        except smtplib.SMTPException as exc:
            # SMTP replies do not echo the password, but keep to the reply code anyway.
            code = getattr(exc, "smtp_code", None)
            raise AlertDeliveryError(f"email: {type(exc).__name__} {code or ''}".rstrip()) from None


async def _post(
    channel: str, http: aiohttp.ClientSession, url: str, payload: dict[str, object]
) -> object:
    """POST JSON; the JSON answer (None when not JSON). Failures never carry the URL."""
    try:
        async with http.post(url, json=payload, timeout=_HTTP_TIMEOUT) as response:
            if response.status >= 300:
                raise AlertDeliveryError(f"{channel}: HTTP {response.status}")
            try:
                return await response.json(content_type=None)
            except ValueError:
                return None
    except aiohttp.ClientError as exc:
        raise AlertDeliveryError(f"{channel}: {type(exc).__name__}") from None
    except TimeoutError:
        raise AlertDeliveryError(f"{channel}: timed out") from None


def channels_from(config: AlertsConfig) -> list[AlertChannel]:
    """The channels configured under `proxy.alerts`."""
    channels: list[AlertChannel] = []
    if config.webhook is not None:
        channels.append(WebhookChannel(config.webhook))
    if config.telegram is not None:
        channels.append(TelegramChannel(config.telegram))
    if config.email is not None:
        channels.append(EmailChannel(config.email))
    return channels


class Alerter:
    """Sends each alert to every channel in the background, with retries."""

    def __init__(
        self,
        channels: Sequence[AlertChannel],
        *,
        attempts: int = 5,
        sleep: Sleep = asyncio.sleep,
        session_factory: Callable[[], aiohttp.ClientSession] = aiohttp.ClientSession,
    ) -> None:
        self._channels = list(channels)
        self._attempts = attempts
        self._sleep = sleep
        self._session_factory = session_factory
        self._http: aiohttp.ClientSession | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.delivered = 0
        """Deliveries that went through (one per channel per alert)."""
        self.failed = 0
        """Deliveries given up after every attempt."""

    @classmethod
    def from_config(cls, config: AlertsConfig) -> Alerter:
        """An alerter for the configured channels."""
        return cls(channels_from(config), attempts=config.attempts)

    @property
    def pending(self) -> int:
        """Deliveries in flight."""
        return len(self._tasks)

    def notify(self, alert: Alert) -> None:
        """Start delivering `alert` to every channel; returns at once."""
        for channel in self._channels:
            task = asyncio.create_task(self._deliver(channel, alert))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def settle(self) -> None:
        """Wait for the deliveries started so far (retries included)."""
        if self._tasks:
            await asyncio.wait(set(self._tasks))

    async def _deliver(self, channel: AlertChannel, alert: Alert) -> None:
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self._attempts),
            wait=wait_exponential(multiplier=0.5, max=30),
            retry=retry_if_exception_type((AlertDeliveryError, OSError)),
            sleep=self._sleep,
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    await channel.deliver(alert, self._client())
        except (AlertDeliveryError, OSError) as exc:
            self.failed += 1
            # OSError texts name only hosts and ports, never a URL path.
            log.warning(
                "alert for %s not delivered by %s after %d attempts: %s",
                alert.circuit,
                channel.name,
                self._attempts,
                exc,
            )
            return
        self.delivered += 1
        log.info("alert for %s delivered by %s", alert.circuit, channel.name)

    def _client(self) -> aiohttp.ClientSession:
        if self._http is None or self._http.closed:
            self._http = self._session_factory()
        return self._http

    async def drain(self, seconds: float) -> None:
        """Let deliveries in flight finish for up to `seconds`, cancel the rest, close."""
        late = await background.drain(self._tasks, seconds)
        if late:
            log.warning("%d alert deliveries cancelled at shutdown", late)
        http, self._http = self._http, None
        if http is not None:
            await http.close()
