"""The Slack connector: a slack-bolt `AsyncApp` routes payloads, slack-sdk's web client posts.

Composition, not inheritance: slack-bolt's `AsyncApp` routes each payload (from slack-sdk's
aiohttp Socket Mode client, or from the Events API route this connector adds to the
gateway's aiohttp server) to this class's two listeners; `connectors.slack.inbound`
translates; an `AsyncWebClient(token, base_url)` posts replies. Replies go through the
gateway's delivery, not bolt's `say()`.

Decisions where DESIGN.md is silent:
- Socket Mode when `app_token` is set, else the Events API at `/slack/{bot_id}/events`.
  That route reads at most `MAX_BODY_BYTES` (1 MiB; more is 413), then checks the
  signature before it parses anything (slack-sdk's `SignatureVerifier`, over the body's
  bytes: v0 HMAC, at most 5 minutes old): a forged, unsigned or stale request gets 401,
  a request while the connector is not running 503 (Slack redelivers it), then a signed
  body that is neither a JSON object `gateway.app.jsonbody.parse_json` accepts nor a
  form-encoded slash command gets 400 (not UTF-8, nested deeper than 64, a 5,000-digit
  number…), so bolt only ever parses what was already found safe. `url_verification` and
  `ssl_check` are answered by bolt. A payload nobody listens to, one bolt cannot even read
  or route (an `event` that is not an object) gets 200 all the same and is counted as
  dropped (in Socket Mode: every envelope is acknowledged), so Slack does not retry what
  will never be handled.
- Every listener only translates and queues: the message waits in its channel's lane
  (`connectors.lanes`) and bolt acknowledges (HTTP 200 or the Socket Mode ack) at once,
  well within Slack's 3 seconds. Messages of one channel are handed over one at a time,
  in the order they arrived; channels run concurrently; at most 1,000 wait per channel and
  10,000 in all (more are dropped as `queue_full`). `aclose` cancels the lanes: by then
  the gateway has drained the turns in flight. Slack never sends an acknowledged payload
  again, so one the pipeline fails on is dropped (`sink_error`), and one that arrives
  while the gateway is stopping too (`stopping`), not left for the next run as on Telegram.
- Redeliveries (`X-Slack-Retry-Num`, a Socket Mode `retry_attempt`, a repeated event id)
  and the `message` + `app_mention` pair that one mention produces are answered once by the
  pipeline's dedupe, keyed by channel + ts (see `connectors.slack.inbound`).
- bolt gets the identity `auth.test` gave at start through `authorize`, so it does no
  per-request I/O, and drops the bot's own events (by user id or bot id) before the
  listeners; `inbound` drops them too, should one get through.
- `send` posts one chunk as the pure `outbound` module translates it: `chat.postMessage`
  (in the thread when the reply has one), or `chat.postEphemeral` when the reply is
  `ephemeral_to` someone. A 429 (`ratelimited`)
  raises `DeliveryError(retryable=True, retry_after=Retry-After)` and the gateway's
  delivery retries it; the web client's own retry handlers are off, so a chunk is never
  posted twice. A connection that could not be opened is retryable too (nothing was sent);
  any other failure, a timeout included, is not.
- Streamed replies (`Capabilities.edits`): `edit` is one `chat.update` of the message's
  `ts`, failing as a send does (`message_not_found`, `cant_update_message`… are final).
- Slack has no typing indicator for apps: `typing` does nothing.
- Socket Mode reconnects are slack-sdk's: a close frame or a `disconnect` message at once, a
  connection cut without one within about `ping_interval` (5 s). bolt reads
  `SLACK_CLIENT_ID`/`SLACK_CLIENT_SECRET` from the environment and then logs that it set up
  its OAuth stores, which this connector never uses; its advice about `SLACK_BOT_TOKEN` in
  the environment (unused here too) is filtered out of the log.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import parse_qs

import aiohttp
from aiohttp import web
from slack_bolt.async_app import AsyncAck, AsyncApp, AsyncBoltRequest
from slack_bolt.authorization import AuthorizeResult
from slack_bolt.error import BoltUnhandledRequestError
from slack_bolt.logger.messages import (
    warning_client_prioritized_and_token_skipped,
    warning_token_skipped,
)
from slack_bolt.response import BoltResponse
from slack_sdk.errors import SlackApiError
from slack_sdk.signature import Clock, SignatureVerifier
from slack_sdk.socket_mode.aiohttp import SocketModeClient
from slack_sdk.socket_mode.async_client import AsyncBaseSocketModeClient
from slack_sdk.socket_mode.request import SocketModeRequest
from slack_sdk.socket_mode.response import SocketModeResponse
from slack_sdk.web.async_client import AsyncWebClient

from connectors.lanes import Lanes
from connectors.runtime import ConnectorRuntime
from connectors.skips import Skip
from connectors.slack.inbound import COMMAND, PLATFORM, BotIdentity, translate_payload, unroutable
from connectors.slack.outbound import (
    error_code,
    posted_id,
    rate_limited,
    retry_after,
    to_post,
    to_update,
)
from connectors.timing import Timing
from gateway.app.connector import Capabilities, ConnectorServices, Sink
from gateway.app.errors import ConnectorError, DeliveryError
from gateway.app.jsonbody import JsonBodyError, parse_json, read_body
from gateway.app.types import InboundMessage, Reply
from gateway.config import SlackBotConfig

log = logging.getLogger(__name__)
_bolt_log = logging.getLogger(f"{__name__}.bolt")

MAX_MESSAGE_LENGTH = 4000
MAX_BODY_BYTES = 1024 * 1024
PING_INTERVAL = 5.0
TIMING = Timing()
_FORM = "application/x-www-form-urlencoded"
_ANY_EVENT = re.compile(".*")


class _DropAdvice(logging.Filter):
    """Drops bolt's start-up advice about SLACK_BOT_TOKEN, which this composition never uses.

    bolt reads that environment variable even when given a client, and warns that the token
    "will be unused": true, and misleading in a gateway whose tokens come from its config.
    """

    _ADVICE = frozenset({warning_client_prioritized_and_token_skipped(), warning_token_skipped()})

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() not in self._ADVICE


_bolt_log.addFilter(_DropAdvice())


class _WallClock(Clock):
    """slack-sdk's clock interface over an injected time source (signature staleness)."""

    def __init__(self, now: Callable[[], float]) -> None:
        self._now = now

    def now(self) -> float:
        return self._now()


class _RawBodyVerifier(SignatureVerifier):
    """slack-sdk's verifier, signing the body's bytes as they came (they may not be UTF-8).

    slack-sdk decodes the body first, so a signed body that is not UTF-8 would look forged
    (401); signed, it is a bad request (400) like any other body this route cannot read.
    """

    def generate_signature(self, *, timestamp: str, body: str | bytes) -> str:
        raw = body.encode() if isinstance(body, str) else body
        base = b"v0:" + timestamp.encode() + b":" + raw
        digest = hmac.new(self.signing_secret.encode(), base, hashlib.sha256).hexdigest()
        return f"v0={digest}"


class SlackConnector:
    """One hosted Slack app: Socket Mode or the Events API in, chat.postMessage out."""

    name = PLATFORM
    capabilities = Capabilities(
        max_message_length=MAX_MESSAGE_LENGTH,
        threads=True,
        knows_bots=True,
        typing=False,
        ephemeral=True,
        command_prefix="!loop",
        edits=True,
    )

    def __init__(
        self,
        config: SlackBotConfig,
        services: ConnectorServices,
        *,
        timing: Timing = TIMING,
        ping_interval: float = PING_INTERVAL,
    ) -> None:
        self.bot_id = config.id
        secrets = [config.bot_token, config.app_token, config.signing_secret]
        self._runtime = ConnectorRuntime(
            PLATFORM,
            config.id,
            services,
            log=log,
            secrets=[secret.get_secret_value() for secret in secrets if secret is not None],
        )
        self.dropped = self._runtime.dropped
        self._config = config
        self._clock = timing.clock
        self._ping_interval = ping_interval
        self._base_url = config.api_base_url.rstrip("/") + "/"
        secret = config.signing_secret
        self._verifier = (
            _RawBodyVerifier(secret.get_secret_value(), clock=_WallClock(timing.clock))
            if secret is not None and config.app_token is None
            else None
        )
        self._session: aiohttp.ClientSession | None = None
        self._web: AsyncWebClient | None = None
        self._app: AsyncApp | None = None
        self._socket: SocketModeClient | None = None
        self._identity: BotIdentity | None = None
        self._running = False
        self._lanes: Lanes[InboundMessage] = Lanes(self._runtime.hand_over)
        if self.socket_mode:
            return
        services.http.router.add_post(f"/slack/{config.id}/events", self.handle_events)

    @property
    def socket_mode(self) -> bool:
        """True when the app receives payloads over Socket Mode (an app token is set)."""
        return self._config.app_token is not None

    @property
    def connected(self) -> bool:
        """Events API: running. Socket Mode: running and the websocket is open."""
        if not self._running:
            return False
        if self._socket is None:
            return True
        client = self._socket
        session = client.current_session
        return not client.closed and session is not None and not session.closed

    @property
    def bot_user_id(self) -> str:
        """The bot's Slack user id ("" before `start`)."""
        return self._identity.user_id if self._identity else ""

    # ------------------------------------------------------------------- lifecycle

    async def start(self, sink: Sink) -> None:
        """Check the token (auth.test), set up bolt, open Socket Mode when configured."""
        session = aiohttp.ClientSession()
        web_client = AsyncWebClient(
            token=self._config.bot_token.get_secret_value(),
            base_url=self._base_url,
            session=session,
            retry_handlers=[],
        )
        socket: SocketModeClient | None = None
        try:
            identity = await self._authenticate(web_client)
            app = self._build_app(identity, session)
            if self.socket_mode:
                socket = await self._open_socket(app)
        except BaseException:
            await session.close()
            raise
        self._session, self._web, self._app, self._socket = session, web_client, app, socket
        self._identity, self._runtime.sink, self._running = identity, sink, True
        log.info(
            "slack bot %s started as %s (%s)",
            self.bot_id,
            identity.user_id,
            "socket mode" if socket else "events api",
        )

    async def _authenticate(self, web_client: AsyncWebClient) -> BotIdentity:
        """auth.test: the bot's user id, bot id and team, or a ConnectorError."""
        try:
            auth = await web_client.auth_test()
        except SlackApiError as exc:
            raise ConnectorError(
                PLATFORM, f"bot {self.bot_id}: auth.test refused the bot token ({error_code(exc)})"
            ) from None
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ConnectorError(
                PLATFORM, f"bot {self.bot_id}: auth.test failed ({type(exc).__name__})"
            ) from None
        user_id = auth.get("user_id")
        if not isinstance(user_id, str) or not user_id:
            raise ConnectorError(PLATFORM, f"bot {self.bot_id}: auth.test gave no user id")
        return BotIdentity(
            bot_id=self.bot_id,
            user_id=user_id,
            app_bot_id=str(auth.get("bot_id") or ""),
            team_id=str(auth.get("team_id") or ""),
        )

    def _build_app(self, identity: BotIdentity, session: aiohttp.ClientSession) -> AsyncApp:
        """A bolt app that knows who it is and hands every payload to this connector."""
        known = AuthorizeResult(
            enterprise_id=None,
            team_id=identity.team_id or None,
            bot_user_id=identity.user_id,
            bot_id=identity.app_bot_id or None,
            bot_token=self._config.bot_token.get_secret_value(),
        )

        async def authorize() -> AuthorizeResult:
            return known

        app = AsyncApp(
            name=f"loopwarden.{self.bot_id}",
            # No token on bolt's own client: with `authorize` it would be ignored (and warned
            # about); bolt's per-request clients take the token from `known`.
            client=AsyncWebClient(base_url=self._base_url, session=session, retry_handlers=[]),
            authorize=authorize,
            # The listeners only queue, so running them before the ack costs nothing and
            # leaves no untracked task behind.
            process_before_response=True,
            # handle_events verifies before parsing, so that forged is 401 and garbage 400.
            request_verification_enabled=False,
            # Unhandled payloads go to _on_bolt_error (quiet, counted) instead of a warning.
            raise_error_for_unhandled_request=True,
            logger=_bolt_log,
        )
        app.event(_ANY_EVENT)(self._on_event)
        app.command(COMMAND)(self._on_command)
        app.error(self._on_bolt_error)
        return app

    async def _open_socket(self, app: AsyncApp) -> SocketModeClient:
        """Open the Socket Mode websocket; a refused app token is a ConnectorError."""
        app_token = self._config.app_token
        if app_token is None:
            raise ConnectorError(PLATFORM, f"bot {self.bot_id}: socket mode needs app_token")
        client = SocketModeClient(
            app_token=app_token.get_secret_value(),
            logger=logging.getLogger(f"{__name__}.socket"),
            web_client=app.client,
            ping_interval=self._ping_interval,
        )
        client.socket_mode_request_listeners.append(self._on_envelope)
        try:
            # Asked here, not in connect(), which retries a refused token forever.
            client.wss_uri = await client.issue_new_wss_url()
            await client.connect()  # type: ignore[no-untyped-call]  # slack-sdk leaves it untyped
        except SlackApiError as exc:
            await _close_socket(client)
            raise ConnectorError(
                PLATFORM,
                f"bot {self.bot_id}: apps.connections.open refused the app token "
                f"({error_code(exc)})",
            ) from None
        except BaseException:
            await _close_socket(client)
            raise
        return client

    async def aclose(self) -> None:
        """Close Socket Mode, cancel hand-overs still waiting, release the HTTP session."""
        self._running = False
        socket, self._socket = self._socket, None
        if socket is not None:
            await _close_socket(socket)
        await self._lanes.aclose()
        self._runtime.sink = None
        session, self._session = self._session, None
        self._web = self._app = None
        if session is not None:
            await session.close()

    # --------------------------------------------------------------------- inbound

    async def handle_events(self, request: web.Request) -> web.Response:
        """`POST /slack/{bot_id}/events`: verify, parse, let bolt route; answer at once."""
        body = await read_body(request, MAX_BODY_BYTES)
        if body is None:
            self._runtime.drop(Skip.TOO_LARGE, "an events api body")
            return web.Response(status=413, text=f"the body is larger than {MAX_BODY_BYTES} bytes")
        if not self._signed(request, body):
            self._runtime.drop(Skip.UNAUTHORIZED, "an events api request")
            log.warning("slack bot %s: events request with a bad or stale signature", self.bot_id)
            return web.Response(status=401, text="invalid signature")
        app = self._app
        if app is None or not self._running:
            return web.Response(status=503, text="not running")
        problem = _unreadable(body, request.content_type)
        if problem is not None:
            self._runtime.drop(Skip.MALFORMED, f"an events api body ({problem})")
            return web.Response(
                status=400, text=f"the body must be a JSON event or a command: {problem}"
            )
        retry = request.headers.get("X-Slack-Retry-Num")
        if retry is not None:
            log.debug(
                "slack bot %s: redelivery %s (%s)",
                self.bot_id,
                retry,
                request.headers.get("X-Slack-Retry-Reason", "no reason"),
            )
        text = body.decode("utf-8")
        response = await self._dispatch(app, text, dict(request.headers), mode="http")
        if response is None:
            return web.Response(text="")
        return web.Response(
            status=response.status,
            text=response.body,
            headers=response.first_headers_without_set_cookie(),
        )

    async def _on_envelope(
        self, client: AsyncBaseSocketModeClient, request: SocketModeRequest
    ) -> None:
        """Socket Mode: let bolt route the payload, then acknowledge the envelope.

        Every envelope is acknowledged once bolt is done with it, also one that was dropped
        (a retry would not help); only while the connector is closing is nothing sent, so
        Slack redelivers the envelope to the next connection.
        """
        app = self._app
        if app is None or not self._running:
            return
        if request.retry_attempt:
            log.debug(
                "slack bot %s: redelivery %s (%s)",
                self.bot_id,
                request.retry_attempt,
                request.retry_reason or "no reason",
            )
        response = await self._dispatch(app, request.payload, {}, mode="socket_mode")
        payload = None
        if response is not None and response.body and request.accepts_response_payload:
            body = json.loads(response.body) if _is_json(response) else {"text": response.body}
            payload = body if isinstance(body, dict) else None
        await client.send_socket_mode_response(
            SocketModeResponse(envelope_id=request.envelope_id, payload=payload)
        )

    async def _dispatch(
        self,
        app: AsyncApp,
        body: str | dict[str, Any],
        headers: dict[str, str | Sequence[str]],
        *,
        mode: str,
    ) -> BoltResponse | None:
        """bolt's answer to one payload; None when there is nothing for Slack to retry."""
        try:
            request = AsyncBoltRequest(body=body, headers=headers, mode=mode)
        except Exception:  # noqa: BLE001 - bolt cannot read it: odd values in untrusted JSON
            self._runtime.drop(Skip.MALFORMED, f"a {mode} payload")
            return None
        skip = unroutable(request.body)
        if skip is not None:
            self._runtime.drop(skip, f"a {mode} payload")
            return None
        response = await app.async_dispatch(request)
        if response.status == 404:
            # Unhandled by bolt (a payload type nobody listens to): a retry would not help.
            self._runtime.drop(Skip.UNSUPPORTED, f"a {mode} payload")
            return None
        if response.status >= 500:
            # The listeners never raise, so bolt itself failed on the payload's shape.
            self._runtime.drop(Skip.MALFORMED, f"a {mode} payload")
            return None
        return response

    def _signed(self, request: web.Request, body: bytes) -> bool:
        verifier = self._verifier
        if verifier is None:
            return False
        try:
            return verifier.is_valid(
                body=body,
                timestamp=request.headers.get("X-Slack-Request-Timestamp"),
                signature=request.headers.get("X-Slack-Signature"),
            )
        except ValueError:  # a timestamp that is not a number
            return False

    async def _on_event(self, body: dict[str, Any]) -> None:
        """bolt listener for every event: translate and queue (bolt acks on return)."""
        self._accept(body)

    async def _on_command(self, ack: AsyncAck, body: dict[str, Any]) -> None:
        """bolt listener for `/loop`: acknowledge with no text, queue the command."""
        await ack()
        self._accept(body)

    async def _on_bolt_error(self, error: Exception) -> None:
        """bolt's error handler: an unhandled payload is counted by _dispatch, others logged."""
        if isinstance(error, BoltUnhandledRequestError):
            return
        log.warning(
            "slack bot %s: bolt failed on a payload (%s)", self.bot_id, type(error).__name__
        )
        log.debug("bolt failure of slack bot %s", self.bot_id, exc_info=error)

    def _accept(self, payload: Mapping[str, Any]) -> None:
        """Translate one payload and queue it on its channel's lane, or count why it was not."""
        identity = self._identity
        if identity is None or not self._running:
            self._runtime.drop(Skip.STOPPING, "a payload while not running")
            return
        message = self._runtime.accept(
            lambda: translate_payload(payload, bot=identity, received_at=self._clock()),
            _event_type(payload),
        )
        if message is not None and not self._lanes.put(message.channel_id, message):
            self._runtime.drop(Skip.QUEUE_FULL, f"message {message.message_id}")
            log.warning("slack bot %s: too many messages waiting, one dropped", self.bot_id)

    # -------------------------------------------------------------------- outbound

    async def send(self, channel_id: str, reply: Reply) -> str | None:
        """Post one chunk; a 429 raises a retryable DeliveryError with Slack's Retry-After."""
        web_client = self._web
        if web_client is None:
            raise DeliveryError(f"slack bot {self.bot_id}: not started", retryable=True)
        post = to_post(channel_id, reply)
        try:
            if post.user:
                response = await web_client.chat_postEphemeral(
                    channel=post.channel, user=post.user, text=post.text, thread_ts=post.thread_ts
                )
            else:
                response = await web_client.chat_postMessage(
                    channel=post.channel, text=post.text, thread_ts=post.thread_ts
                )
        except (SlackApiError, aiohttp.ClientError, TimeoutError) as exc:
            raise self._call_failed(post.method, exc) from None
        return posted_id(post, response.data if isinstance(response.data, Mapping) else {})

    async def edit(self, channel_id: str, message_id: str, reply: Reply) -> None:
        """Give a posted message new text; a 429 raises a retryable DeliveryError."""
        web_client = self._web
        if web_client is None:
            raise DeliveryError(f"slack bot {self.bot_id}: not started", retryable=True)
        update = to_update(channel_id, message_id, reply)
        try:
            await web_client.chat_update(channel=update.channel, ts=update.ts, text=update.text)
        except (SlackApiError, aiohttp.ClientError, TimeoutError) as exc:
            raise self._call_failed("chat.update", exc) from None

    def _call_failed(
        self, method: str, exc: SlackApiError | aiohttp.ClientError | TimeoutError
    ) -> DeliveryError:
        """A failed Web API call as a DeliveryError: retryable when nothing can have happened."""
        where = f"slack bot {self.bot_id}: {method}"
        if isinstance(exc, SlackApiError):
            if rate_limited(exc):
                return DeliveryError(
                    f"{where} rate limited", retryable=True, retry_after=retry_after(exc)
                )
            return DeliveryError(f"{where} failed ({error_code(exc)})")
        if isinstance(exc, aiohttp.ClientConnectorError):
            return DeliveryError(
                f"{where} could not connect ({type(exc).__name__})", retryable=True
            )
        return DeliveryError(f"{where} failed ({type(exc).__name__})")

    async def typing(self, channel_id: str, thread_id: str | None) -> None:
        """Slack shows apps no typing indicator: nothing to do."""


def _unreadable(body: bytes, content_type: str) -> str | None:
    """Why bolt must not be given a body; None for a safe JSON object or a slash command."""
    if content_type == _FORM:
        try:
            form = parse_qs(body.decode("utf-8"))
        except UnicodeDecodeError as exc:
            return f"body is not UTF-8 (byte {exc.start})"
        return None if "command" in form else "a form body must be a slash command"
    try:
        payload = parse_json(body)
    except JsonBodyError as exc:
        return str(exc)
    return None if isinstance(payload, dict) else "a JSON payload must be an object"


async def _close_socket(client: SocketModeClient) -> None:
    """Close the websocket, its monitor tasks and its own HTTP session."""
    await client.close()  # type: ignore[no-untyped-call]  # slack-sdk leaves it untyped


def _is_json(response: BoltResponse) -> bool:
    content_type = response.first_headers_without_set_cookie().get("content-type", "")
    return content_type.startswith("application/json")


def _event_type(payload: Mapping[str, Any]) -> str:
    """A short description of a payload for debug logs: its type and event type, no text."""
    event = payload.get("event")
    kind = event.get("type") if isinstance(event, Mapping) else payload.get("command")
    return f"{payload.get('type', 'payload')}/{kind}"
