"""The Mattermost connector: REST API v4 and the websocket event stream, over aiohttp.

Why aiohttp directly: the one client library, `mattermostdriver` (7.3.2 on PyPI), has had no
release since January 2022, is built on `requests` (blocking) with an async variant on the
side, and would still leave reconnects, catch-up, rate limits and bot identity to us. The
API this connector needs is seven calls and one websocket, which aiohttp (a core
dependency) speaks already, so `loopwarden[mattermost]` adds no package.
`connectors.mattermost.inbound`, `outbound` and `catchup` translate; this class only wires
them to the server and the gateway's sink.

Decisions where DESIGN.md is silent:
- `start` checks the token (`GET /users/me`: the bot's user id and username; a refused
  token is a ConnectorError), then opens the websocket (`/api/v4/websocket`), sends the
  `authentication_challenge` and returns once the server said `hello`. REST calls carry
  `Authorization: Bearer <token>`; the token is never logged.
- A websocket that closes or is cut (aiohttp's `heartbeat` pings find a dead one within
  about `heartbeat` seconds) marks the bot disconnected (`/readyz` 503) and is opened again
  with doubling delays (`gateway.app.backoff`), until `aclose`.
- No post is lost to a reconnect or a restart: Mattermost does not replay to a new
  websocket what it missed, so after every `hello` (the first start's too) the connector
  catches up before it reads a live event (`connectors.mattermost.missed`: the channels
  with a newer post, then `GET /channels/{id}/posts?since=<ms>`, bounded); the posts
  created after each channel's position (not the ones edited or deleted since, which were
  handled when made), oldest first, go through the same translation and lanes as live
  events. A post made while the websocket opens can come both ways; the pipeline's dedupe
  (by post id) answers it once.
- Each channel's position (newest `create_at` handled, and the ids handled at that
  millisecond) moves once a post is handed over, or skipped (the bot's own, system
  messages) in its turn, and is kept in the state backend's cursor store
  (`connectors.mattermost.cursors`; with sqlite or redis state a restart catches up too).
  A channel without a position is read from the floor: the first start ever, so nothing
  posted before the connector first ran is answered, as on Matrix; after a complete
  catch-up, the time that websocket opened. The floor is the gateway's clock, positions
  the server's `create_at`: keep both clocks synchronised (NTP).
- Messages of one channel are handed over in order, one at a time; channels run
  concurrently (`connectors.lanes`: at most 1,000 waiting per channel and 10,000 in all,
  more are dropped as `queue_full`). A message the pipeline fails on is dropped
  (`sink_error`); one that arrives while the gateway stops is counted `stopping` and its
  channel's position stays before it, so the next start catches it up.
- Bot identity, so the pair guard bites: a post flagged `props.from_bot`/`from_webhook` is
  a bot's; for any other sender the connector asks `GET /users/{id}` (`is_bot`) in the
  message's lane before handing it over, once per user (`connectors.mattermost.users`,
  bounded). A sender the server could not answer about counts as a bot (fail closed). The
  same answer names a caught-up post's sender (a REST post has no `sender_name`).
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
from connectors.mattermost.catchup import post_position
from connectors.mattermost.cursors import ChannelCursors
from connectors.mattermost.inbound import (
    MATTERMOST_ID,
    MAX_FRAME_BYTES,
    PLATFORM,
    BotIdentity,
    event_name,
    is_message_event,
    parse_frame,
    posted_post,
    translate_event,
)
from connectors.mattermost.missed import CATCH_UP_CHANNELS, CATCH_UP_POSTS, Answer, MissedPosts
from connectors.mattermost.outbound import (
    error_id,
    pending_post_id,
    posted_id,
    retry_after,
    to_patch,
    to_post,
)
from connectors.mattermost.users import Account, BotDirectory
from connectors.runtime import ConnectorRuntime, Outcome
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
_USERNAME = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
"""A username as Mattermost allows them (at most 22 of these characters), with room."""


@dataclasses.dataclass(frozen=True, slots=True)
class _Seen:
    """A post that is not handed over (the bot's own, a system message…), queued in its
    channel's lane so that the channel's position moves past it in order."""

    channel_id: str
    create_at: int
    post_id: str


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
        catch_up_posts: int = CATCH_UP_POSTS,
        catch_up_channels: int = CATCH_UP_CHANNELS,
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
        self._cursors = ChannelCursors(services.cursors, config.id)
        self._opened_ms = 0
        self._refused = False
        self._session: aiohttp.ClientSession | None = None
        self._socket: aiohttp.ClientWebSocketResponse | None = None
        self._identity: BotIdentity | None = None
        self._connected = False
        self._users = BotDirectory(self._lookup_account)
        self._lanes: Lanes[InboundMessage | _Seen] = Lanes(self._hand_over)
        self._tasks = BackgroundTasks()
        self._answering: dict[str, tuple[str, int]] = {}
        self._missed = MissedPosts(
            get=self._get,
            cursors=self._cursors,
            runtime=self._runtime,
            feed=self._on_event,
            timing=timing,
            max_posts=catch_up_posts,
            max_channels=catch_up_channels,
        )

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
        """Check the token (`/users/me`), open the websocket, catch up, listen until closed."""
        session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT))
        try:
            identity = await self._authenticate(session)
            await self._cursors.start(self._now_ms())
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
        await self._cursors.flush()
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
                        self._opened_ms = self._now_ms()
                        return socket
        except BaseException:
            await socket.close()
            raise
        await socket.close()
        raise ConnectorError(
            PLATFORM, f"bot {self.bot_id}: the websocket closed before hello (token refused?)"
        )

    async def _listen(self, socket: aiohttp.ClientWebSocketResponse | None) -> None:
        """Catch up, read events until the websocket ends, reopen it with doubling delays."""
        backoff = self._timing.backoff()
        while True:
            if socket is not None:
                backoff.reset()
                try:
                    opened_ms = self._opened_ms
                    if await self._missed.read(self.bot_user_id):
                        await self._cursors.set_floor(opened_ms)
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
        """One websocket frame: an event for `_on_event`, or counted as malformed."""
        frame = parse_frame(text)
        if frame is None:
            self._runtime.drop(Skip.MALFORMED, "a websocket frame")
            return
        self._on_event(frame)

    def _on_event(self, frame: Mapping[str, object]) -> None:
        """Translate one event (live or caught up) and queue it on its channel's lane.

        A `posted` event that is not handed over (counted by its `Skip`) still queues a
        `_Seen`, so the channel's position moves past it once the posts before it are done.
        """
        identity = self._identity
        if identity is None or not is_message_event(frame):
            return
        message = self._runtime.accept(
            lambda: translate_event(frame, bot=identity, received_at=self._timing.clock()),
            f"a {event_name(frame)} event",
        )
        if message is not None:
            if not self._lanes.put(message.channel_id, message):
                self._runtime.drop(Skip.QUEUE_FULL, f"message {message.message_id}")
                log.warning(
                    "mattermost bot %s: too many messages waiting, one dropped", self.bot_id
                )
            return
        seen = _seen(frame)
        if seen is not None:
            self._lanes.put(seen.channel_id, seen)

    async def _hand_over(self, item: InboundMessage | _Seen) -> None:
        """Settle whether the sender is a bot (asking the server once), then hand it over;
        move the channel's position past it, unless the gateway refused it (stopping)."""
        if isinstance(item, _Seen):
            if not self._refused:
                self._cursors.advance(item.channel_id, item.create_at, item.post_id)
            return
        message = await self._with_account(item)
        outcome = await self._runtime.offer(message)
        if outcome is Outcome.REFUSED:
            # Not moved past: the next start catches this post up again.
            self._refused = True
            self._runtime.drop(Skip.STOPPING, f"message {message.message_id}")
            return
        if outcome is Outcome.FAILED:
            self._runtime.drop(Skip.SINK_ERROR, f"message {message.message_id}")
        at = post_position(message.raw) if isinstance(message.raw, Mapping) else None
        if at is not None and not self._refused:
            self._cursors.advance(message.channel_id, *at)

    async def _with_account(self, message: InboundMessage) -> InboundMessage:
        """The message with what the server says of its sender: a bot account (asked unless
        the post says so; fail closed), and its username when the post did not carry one
        (a caught-up post)."""
        unnamed = message.sender_name == message.sender_id
        if message.sender_is_bot and not unnamed:
            return message
        account = await self._users.account(message.sender_id)
        is_bot = message.sender_is_bot or account is None or account.is_bot
        name = account.username if unnamed and account and account.username else None
        return dataclasses.replace(
            message, sender_is_bot=is_bot, sender_name=name or message.sender_name
        )

    async def _get(self, path: str) -> Answer | None:
        """One GET of the API for the catch-up; None once the connector is closing."""
        session = self._session
        if session is None:
            return None
        async with session.get(f"{self._api}{path}", headers=self._auth) as response:
            body = _json_or_none(await response.read())
            return Answer(response.status, response.headers, body)

    def _now_ms(self) -> int:
        return int(self._timing.clock() * 1000)

    async def _lookup_account(self, user_id: str) -> Account | None:
        """`GET /users/{id}`'s `is_bot` and `username`; None (logged) when it could not say."""
        session = self._session
        if session is None or not MATTERMOST_ID.match(user_id):
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
        username = answer.get("username") if isinstance(answer, Mapping) else None
        named = isinstance(username, str) and _USERNAME.match(username)
        return Account(is_bot, username if named and isinstance(username, str) else "")

    # -------------------------------------------------------------------- outbound

    async def send(self, channel_id: str, reply: Reply) -> str | None:
        """Post one chunk; a 429 raises a retryable DeliveryError with the server's wait.

        Its `pending_post_id` is derived from the message answered (the first chunk's
        `reply_to`) and the chunk's index in the channel, so the server keeps one post for
        a chunk a restart sends again soon after (`connectors.mattermost.outbound`).
        """
        if reply.reply_to:
            answered, chunk = reply.reply_to, 0
        else:
            answered, previous = self._answering.get(channel_id, ("", -1))
            chunk = previous + 1
        self._answering[channel_id] = (answered, chunk)
        pending = pending_post_id(self.bot_id, channel_id, answered, chunk, reply.text)
        body = to_post(channel_id, reply, pending_post_id=pending).body()
        return posted_id(await self._call("POST", "/posts", body, "POST /posts"))

    async def edit(self, channel_id: str, message_id: str, reply: Reply) -> None:
        """Give a posted message new text; a 429 raises a retryable DeliveryError."""
        if not MATTERMOST_ID.match(message_id):
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


def _seen(frame: Mapping[str, object]) -> _Seen | None:
    """The position of a `posted` event's post, None for other events or a malformed post."""
    post = posted_post(frame)
    at = post_position(post) if post is not None else None
    channel_id = post.get("channel_id") if post is not None else None
    if at is None or not isinstance(channel_id, str) or not channel_id:
        return None
    return _Seen(channel_id, *at)


def _json_or_none(body: bytes) -> object:
    """A REST answer's JSON value, or None when it is not JSON (a proxy's HTML page)."""
    try:
        return parse_json(body)
    except ValueError:
        return None
