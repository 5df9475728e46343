"""The Mattermost connector: REST API v4 and the websocket event stream, over aiohttp.

Why aiohttp directly: the one client library, `mattermostdriver` (7.3.2 on PyPI), has had no
release since January 2022, is built on `requests` (blocking) with an async variant on the
side, and would still leave reconnects, rate limits and bot identity to us. The API this
connector needs is five calls and one websocket, which aiohttp (a core dependency) speaks
already, so `loopwarden[mattermost]` adds no package. `connectors.mattermost.inbound` and
`outbound` translate; this class only wires them to the server and the gateway's sink.

Decisions where DESIGN.md is silent:
- `start` checks the token (`GET /users/me`: the bot's user id and username; a refused
  token is a ConnectorError), then opens the websocket (`/api/v4/websocket`), sends the
  `authentication_challenge` and returns once the server said `hello`. REST calls carry
  `Authorization: Bearer <token>`; the token is never logged.
- A websocket that closes or is cut (aiohttp's `heartbeat` pings find a dead one within
  about `heartbeat` seconds) marks the bot disconnected (`/readyz` 503) and is opened again
  with doubling delays (`gateway.app.backoff`), until `aclose`. Posts made while it was down
  are not fetched afterwards: Mattermost does not replay them to a new connection.
- Messages of one channel are handed over in order, one at a time; channels run
  concurrently (`connectors.lanes`: at most 1,000 waiting per channel and 10,000 in all,
  more are dropped as `queue_full`). A message the pipeline fails on (`sink_error`) or one
  that arrives while the gateway stops (`stopping`) is dropped: the server never sends an
  event again.
- Bot identity, so the pair guard bites: a post flagged `props.from_bot`/`from_webhook` is
  a bot's; for any other sender the connector asks `GET /users/{id}` (`is_bot`) in the
  message's lane before handing it over, once per user (`connectors.mattermost.users`,
  bounded). A sender the server could not answer about counts as a bot (fail closed).
- `send` is one `POST /posts` (`root_id` for a thread); `edit` (streamed replies,
  `Capabilities.edits`) one `PUT /posts/{id}/patch`. A 429 raises
  `DeliveryError(retryable=True, retry_after=…)` from `Retry-After` or `X-RateLimit-Reset`,
  and the gateway's delivery waits and posts once; so does a connection that could not be
  opened (nothing was sent). Any other failure, a timeout included (the post may exist),
  is final: a reply is posted at most once.
- Messages are at most 16,383 characters (the server's limit). Mattermost runs messages
  starting with `/` as slash commands, so the admin command is written `!loop` in notices.
- No typing indicator: `typing` does nothing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
from collections.abc import Mapping

import aiohttp
from aiohttp import WSMsgType

from connectors.lanes import Lanes
from connectors.mattermost.inbound import (
    MAX_FRAME_BYTES,
    PLATFORM,
    BotIdentity,
    event_name,
    is_message_event,
    parse_frame,
    translate_event,
)
from connectors.mattermost.outbound import error_id, posted_id, retry_after, to_patch, to_post
from connectors.mattermost.users import BotDirectory
from connectors.runtime import ConnectorRuntime
from connectors.skips import Skip
from connectors.tasks import BackgroundTasks
from connectors.timing import Timing
from gateway.app.connector import Capabilities, ConnectorServices, Sink
from gateway.app.errors import ConnectorError, DeliveryError
from gateway.app.jsonbody import parse_json
from gateway.app.types import InboundMessage, Reply
from gateway.config import MattermostBotConfig

log = logging.getLogger(__name__)

MAX_MESSAGE_LENGTH = 16383
HEARTBEAT = 30.0
"""Seconds between websocket pings; a connection that does not answer one is reopened."""
HELLO_TIMEOUT = 10.0
"""Seconds the server has to say `hello` after the authentication challenge."""
REQUEST_TIMEOUT = 30.0
TIMING = Timing()
_ID = re.compile(r"^[a-z0-9]{26}$")
"""Mattermost ids (users, posts): 26 characters of its base-32 alphabet."""


class MattermostConnector:
    """One hosted Mattermost bot account: the websocket in, REST v4 out."""

    name = PLATFORM
    capabilities = Capabilities(
        max_message_length=MAX_MESSAGE_LENGTH,
        threads=True,
        knows_bots=True,
        typing=False,
        command_prefix="!loop",
        edits=True,
    )

    def __init__(
        self,
        config: MattermostBotConfig,
        services: ConnectorServices,
        *,
        timing: Timing = TIMING,
        heartbeat: float = HEARTBEAT,
        hello_timeout: float = HELLO_TIMEOUT,
    ) -> None:
        self.bot_id = config.id
        self._token = config.token.get_secret_value()
        self._runtime = ConnectorRuntime(
            PLATFORM, config.id, services, log=log, secrets=[self._token]
        )
        self.dropped = self._runtime.dropped
        self._api = f"{config.url}/api/v4"
        scheme, _, rest = config.url.partition("://")
        self._websocket_url = f"{'wss' if scheme == 'https' else 'ws'}://{rest}/api/v4/websocket"
        self._timing = timing
        self._heartbeat = heartbeat
        self._hello_timeout = hello_timeout
        self._session: aiohttp.ClientSession | None = None
        self._socket: aiohttp.ClientWebSocketResponse | None = None
        self._identity: BotIdentity | None = None
        self._connected = False
        self._users = BotDirectory(self._lookup_is_bot)
        self._lanes: Lanes[InboundMessage] = Lanes(self._hand_over)
        self._tasks = BackgroundTasks()

    @property
    def connected(self) -> bool:
        """True while the websocket is open and authenticated."""
        return self._connected

    @property
    def bot_user_id(self) -> str:
        """The bot's Mattermost user id ("" before `start`)."""
        return self._identity.user_id if self._identity else ""

    # ------------------------------------------------------------------- lifecycle

    async def start(self, sink: Sink) -> None:
        """Check the token (`/users/me`), open the websocket, listen until closed."""
        session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT))
        try:
            identity = await self._authenticate(session)
            socket = await self._open_socket(session)
        except BaseException:
            await session.close()
            raise
        self._session, self._identity, self._runtime.sink = session, identity, sink
        self._tasks.spawn(self._listen(socket))
        log.info("mattermost bot %s started as %s", self.bot_id, identity.username)

    async def aclose(self) -> None:
        """Stop listening, cancel hand-overs still waiting, close the websocket and session."""
        self._connected = False
        await self._tasks.cancel()
        socket, self._socket = self._socket, None
        if socket is not None:
            await socket.close()
        await self._lanes.aclose()
        self._runtime.sink = None
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    async def _authenticate(self, session: aiohttp.ClientSession) -> BotIdentity:
        """`GET /users/me`: the bot's user id and username, or a ConnectorError."""
        where = f"bot {self.bot_id}: GET /users/me"
        try:
            async with session.get(f"{self._api}/users/me", headers=self._auth) as response:
                answer = _json_or_none(await response.read())
                status = response.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ConnectorError(PLATFORM, f"{where} failed ({type(exc).__name__})") from None
        if status != 200:
            raise ConnectorError(
                PLATFORM, f"{where} refused the token ({error_id(status, answer)})"
            )
        user_id = answer.get("id") if isinstance(answer, Mapping) else None
        username = answer.get("username") if isinstance(answer, Mapping) else None
        if not isinstance(user_id, str) or not isinstance(username, str) or not username:
            raise ConnectorError(PLATFORM, f"{where} gave no user id and username")
        return BotIdentity(bot_id=self.bot_id, user_id=user_id, username=username)

    async def _open_socket(self, session: aiohttp.ClientSession) -> aiohttp.ClientWebSocketResponse:
        """Open and authenticate the websocket; return once the server said `hello`."""
        socket = await session.ws_connect(
            self._websocket_url, heartbeat=self._heartbeat, max_msg_size=MAX_FRAME_BYTES
        )
        try:
            challenge = {"token": self._token}
            await socket.send_json(
                {"seq": 1, "action": "authentication_challenge", "data": challenge}
            )
            async with asyncio.timeout(self._hello_timeout):
                async for frame in socket:
                    if frame.type is not WSMsgType.TEXT:
                        continue
                    parsed = parse_frame(frame.data)
                    if parsed is not None and event_name(parsed) == "hello":
                        self._socket, self._connected = socket, True
                        return socket
        except BaseException:
            await socket.close()
            raise
        await socket.close()
        raise ConnectorError(
            PLATFORM, f"bot {self.bot_id}: the websocket closed before hello (token refused?)"
        )

    async def _listen(self, socket: aiohttp.ClientWebSocketResponse | None) -> None:
        """Read events until the websocket ends, then reopen it with doubling delays."""
        backoff = self._timing.backoff()
        while True:
            if socket is not None:
                backoff.reset()
                try:
                    await self._read(socket)
                except Exception as exc:  # a broken connection must not end the listener
                    log.warning(
                        "mattermost bot %s: websocket failed (%s)",
                        self.bot_id,
                        self._runtime.describe(exc),
                    )
                    await socket.close()
                self._connected, self._socket = False, None
                log.warning("mattermost bot %s: websocket closed, reconnecting", self.bot_id)
            await backoff.wait()
            session = self._session
            if session is None:
                return
            try:
                socket = await self._open_socket(session)
            except (aiohttp.ClientError, TimeoutError, ConnectorError) as exc:
                log.warning(
                    "mattermost bot %s: reconnect failed (%s)",
                    self.bot_id,
                    self._runtime.describe(exc),
                )
                socket = None
            else:
                log.info("mattermost bot %s: websocket reconnected", self.bot_id)

    async def _read(self, socket: aiohttp.ClientWebSocketResponse) -> None:
        async for frame in socket:
            if frame.type is WSMsgType.TEXT:
                self._on_frame(frame.data)
            elif frame.type is WSMsgType.ERROR:
                return

    # --------------------------------------------------------------------- inbound

    def _on_frame(self, text: str) -> None:
        """Translate one event and queue it on its channel's lane, or count why it was not."""
        frame = parse_frame(text)
        if frame is None:
            self._runtime.drop(Skip.MALFORMED, "a websocket frame")
            return
        identity = self._identity
        if identity is None or not is_message_event(frame):
            return
        message = self._runtime.accept(
            lambda: translate_event(frame, bot=identity, received_at=self._timing.clock()),
            f"a {event_name(frame)} event",
        )
        if message is not None and not self._lanes.put(message.channel_id, message):
            self._runtime.drop(Skip.QUEUE_FULL, f"message {message.message_id}")
            log.warning("mattermost bot %s: too many messages waiting, one dropped", self.bot_id)

    async def _hand_over(self, message: InboundMessage) -> None:
        """Settle whether the sender is a bot (asking the server once), then hand it over."""
        if not message.sender_is_bot and await self._users.is_bot(message.sender_id):
            message = dataclasses.replace(message, sender_is_bot=True)
        await self._runtime.hand_over(message)

    async def _lookup_is_bot(self, user_id: str) -> bool | None:
        """`GET /users/{id}`'s `is_bot`; None (logged) when the server could not say."""
        session = self._session
        if session is None or not _ID.match(user_id):
            return None
        try:
            async with session.get(f"{self._api}/users/{user_id}", headers=self._auth) as response:
                answer = _json_or_none(await response.read())
                status = response.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.warning(
                "mattermost bot %s: user lookup failed (%s); the sender counts as a bot",
                self.bot_id,
                type(exc).__name__,
            )
            return None
        is_bot = answer.get("is_bot") if isinstance(answer, Mapping) else None
        if status != 200 or not isinstance(is_bot, bool):
            log.warning(
                "mattermost bot %s: user lookup answered %s; the sender counts as a bot",
                self.bot_id,
                error_id(status, answer),
            )
            return None
        return is_bot

    # -------------------------------------------------------------------- outbound

    async def send(self, channel_id: str, reply: Reply) -> str | None:
        """Post one chunk; a 429 raises a retryable DeliveryError with the server's wait."""
        answer = await self._call(
            "POST", "/posts", to_post(channel_id, reply).body(), "POST /posts"
        )
        return posted_id(answer)

    async def edit(self, channel_id: str, message_id: str, reply: Reply) -> None:
        """Give a posted message new text; a 429 raises a retryable DeliveryError."""
        if not _ID.match(message_id):
            raise DeliveryError(
                f"mattermost bot {self.bot_id}: post id {message_id[:40]!r} is not a post id"
            )
        await self._call(
            "PUT", f"/posts/{message_id}/patch", to_patch(reply), "PUT /posts/{id}/patch"
        )

    async def _call(self, method: str, path: str, body: Mapping[str, str], what: str) -> object:
        """One REST call's JSON answer, or a DeliveryError (retryable when nothing happened)."""
        where = f"mattermost bot {self.bot_id}: {what}"
        session = self._session
        if session is None:
            raise DeliveryError(f"{where}: not started", retryable=True)
        try:
            async with session.request(
                method, f"{self._api}{path}", json=body, headers=self._auth
            ) as response:
                answer = _json_or_none(await response.read())
                status, headers = response.status, response.headers
        except aiohttp.ClientConnectorError as exc:
            raise DeliveryError(
                f"{where} could not connect ({type(exc).__name__})", retryable=True
            ) from None
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise DeliveryError(f"{where} failed ({type(exc).__name__})") from None
        if status == 429:
            raise DeliveryError(
                f"{where} rate limited", retryable=True, retry_after=retry_after(headers)
            )
        if status >= 400:
            raise DeliveryError(f"{where} failed ({error_id(status, answer)})")
        return answer

    async def typing(self, channel_id: str, thread_id: str | None) -> None:
        """No typing indicator on Mattermost here: nothing to do."""

    @property
    def _auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._token}"}


def _json_or_none(body: bytes) -> object:
    """A REST answer's JSON value, or None when it is not JSON (a proxy's HTML page)."""
    try:
        return parse_json(body)
    except ValueError:
        return None
