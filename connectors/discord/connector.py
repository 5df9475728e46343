"""The Discord connector: one discord.py `Client` per hosted bot, composed, never subclassed.

A `discord.Client` keeps the gateway connection (heartbeats, RESUME, reconnects) and does
the REST calls with its rate limiting; `connectors.discord.inbound` translates messages;
this class only wires the two to the gateway's sink. `commands.Bot` is not used: it drops
messages from bots, and bot messages are exactly what the loop guard must see.

Decisions where DESIGN.md is silent:
- API base and gateway per bot: discord.py builds every REST URL from `Route.BASE` and opens
  the gateway at `DiscordWebSocket.DEFAULT_GATEWAY`, class attributes shared by the whole
  process, so setting them would point every bot of the process at one server. Each client
  gets a `RoutedHTTPClient` instead (discord.py's HTTP client rewriting those two URLs to the
  bot's own), installed in place of the one the client made. Resume URLs that the gateway
  hands out are used as given. Without `gateway_url` the gateway's address is asked of the
  API (`GET /gateway/bot`), as Discord recommends.
- Messages are read from the raw MESSAGE_CREATE dispatch (the client's parser for it is
  replaced) and translated by the pure `inbound` module; discord.py's Message objects and
  message cache are not used. Every other parser of the client is wrapped so that an event
  discord.py cannot parse is logged, counted and dropped instead of ending its connection.
  These two choices rely on discord.py internals that 2.x has kept stable
  (`Client._connection.http` and `.parsers`); the connector tests exercise both.
- Messages of one Discord channel (a thread is one) reach the sink in order, one at a time;
  channels run concurrently (`connectors.lanes`: at most 1,000 messages wait per channel
  and 10,000 in all; more are dropped as `queue_full`, so a flood cannot exhaust memory).
  Discord never sends a dispatch again, so a message the pipeline fails on or refuses
  while the gateway stops is dropped (`sink_error`, `stopping`).
- `connected` (`/readyz`) is true from READY or RESUMED until the connection drops.
  `start` returns at READY: discord.py's `on_ready` waits `guild_ready_timeout` after the
  last GUILD_CREATE, which nothing here needs. discord.py reconnects and resumes by itself;
  if its loop ends anyway (a revoked token, an unexpected error), the connector logs in
  again with doubling delays until closed (`gateway.app.backoff`).
- Replies are translated by the pure `outbound` module (reply reference, mention rules).
  A reply with a `thread_id` goes into that thread. With
  `reply_in_thread`, the first reply to a channel message opens a thread on it (named after
  the message) and goes there; a thread already open on it is used, and if opening fails
  the reply goes to the channel instead.
- Rate limits: discord.py waits out a 429 and tries again (5 tries) by itself, so a send
  normally succeeds once. When it gives up, or the wait would exceed `max_ratelimit_timeout`
  (30 s), `send` raises `DeliveryError(retryable=True, retry_after=…)`; so does a connection
  that could not be opened (nothing was sent).
- Exactly once: every message is posted with a nonce and `enforce_nonce`, so Discord
  returns the message already created instead of posting the same nonce twice (for a few
  minutes). A send that failed after it may have reached Discord (a timeout, a dropped
  connection, a 5xx) is retryable, and the next send of the same text to the same place
  reuses its nonce; any other send gets a fresh one. Other failures (403, 404, 400) are
  final.
- Streamed replies (`Capabilities.edits`): `edit` changes a posted message's text with a
  message edit, in the thread or channel the post went to, with the post's mention rules;
  rate limits as for a send. An edit repeats nothing on Discord, so any failure is final
  but a 429 or a connection that could not be opened.
- Typing: shown when the turn is still running after `typing_delay` (0.5 s) and nothing was
  posted to the channel meanwhile; one `POST …/typing`, which Discord shows for about 10 s
  or until the bot posts. A quick answer needs no indicator, and a typing request that
  arrived after the reply would leave the indicator on for 10 s.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import secrets
import warnings
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal

import aiohttp
import yarl

from connectors.discord.inbound import PLATFORM, BotIdentity, thread_name, translate_message
from connectors.discord.outbound import (
    ALLOWED_MENTIONS,
    Post,
    may_have_posted,
    retry_after,
    to_edit,
    to_post,
)
from connectors.lanes import Lanes
from connectors.runtime import ConnectorRuntime
from connectors.skips import Skip
from connectors.timing import Timing
from gateway.app.connector import Capabilities, ConnectorServices, Sink
from gateway.app.errors import ConnectorError, DeliveryError
from gateway.app.types import InboundMessage, Reply
from gateway.config import DiscordBotConfig

with warnings.catch_warnings():
    # discord.py imports the stdlib `audioop` (for voice), deprecated since Python 3.11.
    warnings.filterwarnings("ignore", "'audioop' is deprecated", DeprecationWarning)
    import discord
    from discord.gateway import DiscordWebSocket
    from discord.http import HTTPClient, Route

log = logging.getLogger(__name__)

MAX_MESSAGE_LENGTH = 2000
STARTERS_KEPT = 1024
UNSETTLED_KEPT = 256
TIMING = Timing(retry_delays=(1.0, 60.0), typing_delay=0.5)
THREAD_ARCHIVE_MINUTES: Literal[1440] = 1440
THREAD_EXISTS = 160004  # Discord error code: a thread was already opened on this message


def gateway_intents() -> discord.Intents:
    """Guilds (channel and thread cache), guild and DM messages, and message content."""
    intents = discord.Intents.none()
    intents.guilds = True
    intents.guild_messages = True
    intents.dm_messages = True
    intents.message_content = True
    return intents


class RoutedHTTPClient(HTTPClient):
    """discord.py's HTTP client aimed at one bot's API base and gateway, not the process's."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        *,
        api_base_url: str,
        max_ratelimit_timeout: float | None = None,
    ) -> None:
        super().__init__(loop, max_ratelimit_timeout=max_ratelimit_timeout)
        self.api_base_url = api_base_url.rstrip("/")
        self.gateway_url: yarl.URL | None = None

    async def request(
        self,
        route: Route,
        *,
        files: Sequence[discord.File] | None = None,
        form: Iterable[dict[str, Any]] | None = None,
        **kwargs: Any,
    ) -> Any:
        """Send `route` to this bot's API base instead of `Route.BASE`."""
        base = Route.BASE
        if base != self.api_base_url and route.url.startswith(base):
            route.url = self.api_base_url + route.url[len(base) :]
        return await super().request(route, files=files, form=form, **kwargs)

    async def ws_connect(self, url: str, *, compress: int = 0) -> aiohttp.ClientWebSocketResponse:
        """Open the gateway at this bot's URL when discord.py asks for the default one."""
        target = yarl.URL(url)
        if self.gateway_url is not None and target.with_query(None) == (
            DiscordWebSocket.DEFAULT_GATEWAY
        ):
            target = self.gateway_url.with_query(target.query)
        log.debug("opening the gateway at %s", target.with_query(None))
        return await super().ws_connect(str(target), compress=compress)


class DiscordConnector:
    """One hosted Discord bot: the gateway in, REST replies out."""

    name = PLATFORM
    capabilities = Capabilities(
        max_message_length=MAX_MESSAGE_LENGTH,
        threads=True,
        knows_bots=True,
        typing=True,
        edits=True,
    )

    def __init__(
        self,
        config: DiscordBotConfig,
        services: ConnectorServices,
        *,
        timing: Timing = TIMING,
        max_ratelimit_timeout: float = 30.0,
    ) -> None:
        self.bot_id = config.id
        self._config = config
        self._token = config.token.get_secret_value()
        self._runtime = ConnectorRuntime(
            PLATFORM, config.id, services, log=log, secrets=(self._token,)
        )
        self.dropped = self._runtime.dropped
        self._timing = timing
        self._backoff = timing.backoff()
        self._max_ratelimit_timeout = max_ratelimit_timeout
        self._client: discord.Client | None = None
        self._identity: BotIdentity | None = None
        self._connected = False
        self._closing = False
        self._ups = 0
        self._runner: asyncio.Task[None] | None = None
        self._lanes: Lanes[InboundMessage] = Lanes(self._runtime.hand_over)
        self._posts: Counter[str] = Counter()
        # Sends that failed after they may have reached Discord: (target, reply_to, text) →
        # the nonce to post the same message with again.
        self._unsettled: OrderedDict[tuple[int, str | None, str], int] = OrderedDict()
        # reply_in_thread: message id → name of the thread to open on it (None: replying in
        # the channel because opening failed). Opened threads leave the map.
        self._starters: OrderedDict[str, str | None] = OrderedDict()

    @property
    def connected(self) -> bool:
        """True while the gateway connection is up (READY or RESUMED, not yet dropped)."""
        return self._connected

    @property
    def bot_user_id(self) -> str:
        """The bot's Discord user id ("" before the first login)."""
        return self._identity.user_id if self._identity else ""

    # ------------------------------------------------------------------- lifecycle

    async def start(self, sink: Sink) -> None:
        """Log in and open the gateway; return at READY. Raises ConnectorError on failure."""
        if self._runner is not None and not self._runner.done():
            return
        self._runtime.sink = sink
        self._closing = False
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._runner = asyncio.create_task(self._run(ready))
        try:
            await asyncio.shield(ready)
        except BaseException:
            await self._stop_runner()
            raise
        log.info("discord bot %s connected as user %s", self.bot_id, self.bot_user_id)

    async def aclose(self) -> None:
        """Close the gateway and HTTP session, stop handing messages over."""
        self._closing = True
        self._connected = False
        client = self._client
        if client is not None:
            await client.close()
        await self._stop_runner()
        await self._lanes.aclose()
        self._runtime.sink = None

    async def _stop_runner(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None and not runner.done():
            runner.cancel()
            await asyncio.wait([runner])

    async def _run(self, ready: asyncio.Future[None]) -> None:
        """Keep a logged-in client connected until closed; the first failure fails `start`."""
        self._backoff.reset()
        while not self._closing:
            ups = self._ups
            client = self._new_client(ready)
            self._client = client
            try:
                await self._login(client)
                await client.connect(reconnect=True)
                reason = "the gateway connection ended"
            except Exception as exc:  # any failure: report it to start, or log in again
                error = self._start_error(exc, client)
                if not ready.done():
                    ready.set_exception(error)
                    return
                reason = str(error)
            finally:
                self._connected = False
                self._client = None
                await client.close()
            if not ready.done():
                ready.set_exception(ConnectorError(PLATFORM, f"bot {self.bot_id}: {reason}"))
                return
            if self._closing:
                return
            if self._ups != ups:
                self._backoff.reset()
            log.warning(
                "discord bot %s: %s; logging in again in %.1fs",
                self.bot_id,
                reason,
                self._backoff.delay,
            )
            await self._backoff.wait()

    def _new_client(self, ready: asyncio.Future[None]) -> discord.Client:
        """A client with this bot's HTTP routing, guarded parsers and connection events."""
        # discord.py warns once that voice needs extra packages; voice is never used here.
        for flag in ("warn_nacl", "warn_dave"):
            if getattr(discord.VoiceClient, flag, False):
                setattr(discord.VoiceClient, flag, False)
        client = discord.Client(
            intents=gateway_intents(),
            max_messages=None,
            chunk_guilds_at_startup=False,
            max_ratelimit_timeout=self._max_ratelimit_timeout,
        )
        http = RoutedHTTPClient(
            client.loop,
            api_base_url=self._config.api_base_url,
            max_ratelimit_timeout=self._max_ratelimit_timeout,
        )
        client.http = http
        client._connection.http = http
        parsers = client._connection.parsers
        for event, parse in list(parsers.items()):
            parsers[event] = self._guarded(event, parse)
        parsers["MESSAGE_CREATE"] = self._guarded(
            "MESSAGE_CREATE", functools.partial(self._on_message_create, client)
        )

        async def on_connect() -> None:
            self._up(ready)

        async def on_resumed() -> None:
            self._up(ready)

        async def on_disconnect() -> None:
            if self._connected:
                log.info("discord bot %s: gateway connection lost, reconnecting", self.bot_id)
            self._connected = False

        for handler in (on_connect, on_resumed, on_disconnect):
            client.event(handler)
        return client

    async def _login(self, client: discord.Client) -> None:
        """Log in (GET /users/@me), learn the bot's user id, and find the gateway."""
        await client.login(self._token)
        user = client.user
        if user is None:
            raise ConnectorError(PLATFORM, f"bot {self.bot_id}: login returned no user")
        self._identity = BotIdentity(self.bot_id, str(user.id), self._config.reply_in_thread)
        http = client.http
        if isinstance(http, RoutedHTTPClient):
            if self._config.gateway_url:
                http.gateway_url = yarl.URL(self._config.gateway_url)
            else:
                _, url, _ = await http.get_bot_gateway()
                http.gateway_url = yarl.URL(url)

    def _up(self, ready: asyncio.Future[None]) -> None:
        if not self._connected and ready.done():
            log.info("discord bot %s: gateway connection is back", self.bot_id)
        self._connected = True
        self._ups += 1
        if not ready.done():
            ready.set_result(None)

    def _start_error(self, exc: Exception, client: discord.Client) -> ConnectorError:
        """A failure as a ConnectorError that says what to fix and never holds the token."""
        if isinstance(exc, ConnectorError):
            return exc
        http = client.http
        if client.ws is None and isinstance(http, RoutedHTTPClient) and http.gateway_url:
            # discord.py fails oddly (AttributeError) when its very first connection fails.
            return ConnectorError(
                PLATFORM,
                f"bot {self.bot_id}: could not open the gateway at "
                f"{http.gateway_url.with_query(None)} ({type(exc).__name__})",
            )
        if isinstance(exc, discord.LoginFailure) or (
            isinstance(exc, discord.ConnectionClosed) and exc.code == 4004
        ):
            detail = "Discord refused the token"
        elif isinstance(exc, discord.PrivilegedIntentsRequired):
            detail = (
                "the Message Content intent is not enabled for this application "
                "(Developer Portal > Bot > Privileged Gateway Intents)"
            )
        else:
            detail = self._runtime.describe(exc)
        return ConnectorError(PLATFORM, f"bot {self.bot_id}: {detail}")

    # ------------------------------------------------------------------ inbound

    def _guarded(self, event: str, parse: Callable[[Any], None]) -> Callable[[Any], None]:
        """A parser that logs, counts and drops an event it cannot handle instead of raising."""

        def guarded(data: Any) -> None:
            try:
                parse(data)
            except Exception as exc:  # a bad event must not end discord.py's connection loop
                self._runtime.drop(Skip.MALFORMED, f"a {event} event")
                log.warning(
                    "discord bot %s: %s event dropped (%s)", self.bot_id, event, type(exc).__name__
                )
                log.debug("discord bot %s: %s event failed", self.bot_id, event, exc_info=True)

        return guarded

    def _on_message_create(self, client: discord.Client, data: object) -> None:
        """Translate one MESSAGE_CREATE and queue it on its channel's lane."""
        identity = self._identity
        if identity is None or self._closing:
            return
        channel = data.get("channel_id") if isinstance(data, Mapping) else None
        result = self._runtime.accept(
            lambda: translate_message(
                data,
                bot=identity,
                thread_parent=_thread_parent(client, channel),
                received_at=self._timing.clock(),
            ),
            "a MESSAGE_CREATE",
        )
        if result is None:
            return
        if result.thread_id is not None and result.thread_id == result.message_id:
            self._remember_starter(result)
        if not self._lanes.put(str(channel), result):
            self._runtime.drop(Skip.QUEUE_FULL, f"message {result.message_id}")
            log.warning("discord bot %s: too many messages waiting, one dropped", self.bot_id)

    def _remember_starter(self, message: InboundMessage) -> None:
        self._starters[message.message_id] = thread_name(message.text)
        while len(self._starters) > STARTERS_KEPT:
            self._starters.popitem(last=False)

    # ----------------------------------------------------------------- outbound

    async def send(self, channel_id: str, reply: Reply) -> str | None:
        """Post one chunk as a reply; a 429 the SDK gave up on raises a retryable DeliveryError."""
        client = self._client
        if client is None or client.is_closed():
            raise DeliveryError(
                f"discord bot {self.bot_id}: not connected", retryable=not self._closing
            )
        post = await self._post(client, channel_id, reply)
        key = (post.target, reply.reply_to, reply.text)
        nonce = self._unsettled.pop(key, None)
        if nonce is None:
            nonce = secrets.randbits(63)
        channel = client.get_partial_messageable(post.target)
        try:
            message = await channel.send(post.content, **post.send_options(nonce))
        except Exception as exc:  # each failure says whether a retry is safe
            error = self._delivery_error("sending a message", exc)
            if may_have_posted(exc):
                self._unsettled[key] = nonce
                while len(self._unsettled) > UNSETTLED_KEPT:
                    self._unsettled.popitem(last=False)
                error.retryable = True
            raise error from None
        self._posts[str(post.target)] += 1
        return str(message.id)

    async def edit(self, channel_id: str, message_id: str, reply: Reply) -> None:
        """Make a message `send` posted read `reply.text`; a 429 the SDK gave up on is retryable."""
        client = self._client
        if client is None or client.is_closed():
            raise DeliveryError(
                f"discord bot {self.bot_id}: not connected", retryable=not self._closing
            )
        # A reply whose thread is a starter still listed went to the channel: no thread opened.
        thread = None if reply.thread_id in self._starters else reply.thread_id
        edit = to_edit(channel_id, message_id, reply, thread=thread)
        message = client.get_partial_messageable(edit.target).get_partial_message(edit.message_id)
        try:
            await message.edit(content=edit.content, allowed_mentions=ALLOWED_MENTIONS)
        except Exception as exc:  # the error says whether trying again is safe
            raise self._delivery_error("editing a message", exc) from None

    async def typing(self, channel_id: str, thread_id: str | None) -> None:
        """Show "typing…" if the turn is still running after `typing_delay` (never raises)."""
        target = channel_id if thread_id is None or thread_id in self._starters else thread_id
        posted = self._posts[target]
        if self._timing.typing_delay > 0:
            await self._timing.sleep(self._timing.typing_delay)
        client = self._client
        if client is None or self._closing or self._posts[target] != posted:
            return
        try:
            await client.http.send_typing(int(target))
        except (discord.DiscordException, aiohttp.ClientError, OSError, ValueError) as exc:
            log.debug("discord bot %s: typing failed (%s)", self.bot_id, type(exc).__name__)

    async def _post(self, client: discord.Client, channel_id: str, reply: Reply) -> Post:
        """The chunk's post: into the thread opened on the message it answers, if one is due."""
        thread = reply.thread_id
        if thread is not None and thread in self._starters:
            if await self._open_thread(client, channel_id, thread):
                return to_post(channel_id, reply, thread=thread, on_starter=True)
            thread = None
        return to_post(channel_id, reply, thread=thread, on_starter=False)

    async def _open_thread(self, client: discord.Client, channel_id: str, starter: str) -> bool:
        """Open the reply thread on `starter`; False (remembered) when replying in the channel."""
        name = self._starters.get(starter)
        if name is None:
            return False
        try:
            await client.http.start_thread_with_message(
                int(channel_id),
                int(starter),
                name=name,
                auto_archive_duration=THREAD_ARCHIVE_MINUTES,
            )
        except discord.HTTPException as exc:
            if exc.code != THREAD_EXISTS:
                if exc.status == 429:
                    raise self._delivery_error("opening a thread", exc) from None
                log.info(
                    "discord bot %s: no reply thread (HTTP %s, code %s); replying in the channel",
                    self.bot_id,
                    exc.status,
                    exc.code,
                )
                self._starters[starter] = None
                return False
        except Exception as exc:  # as for a send: retry only what surely did nothing
            raise self._delivery_error("opening a thread", exc) from None
        del self._starters[starter]
        return True

    def _delivery_error(self, action: str, exc: Exception) -> DeliveryError:
        where = f"discord bot {self.bot_id}: {action} failed"
        if isinstance(exc, discord.RateLimited):
            return DeliveryError(
                f"{where}: rate limited", retryable=True, retry_after=exc.retry_after
            )
        if isinstance(exc, discord.HTTPException):
            if exc.status == 429:
                return DeliveryError(
                    f"{where}: rate limited", retryable=True, retry_after=retry_after(exc)
                )
            return DeliveryError(f"{where}: HTTP {exc.status} (code {exc.code})")
        if isinstance(exc, aiohttp.ClientConnectorError):
            return DeliveryError(f"{where}: cannot connect", retryable=True)
        return DeliveryError(f"{where}: {self._runtime.describe(exc)}")


def _thread_parent(client: discord.Client, channel_id: object) -> str | None:
    """The parent channel's id when `channel_id` is a thread discord.py knows of."""
    if not isinstance(channel_id, str) or not channel_id.isdigit():
        return None
    channel = client.get_channel(int(channel_id))
    return str(channel.parent_id) if isinstance(channel, discord.Thread) else None
