"""A local fake Discord (REST API and gateway websocket), over real loopback, for discord.py.

REST under `/api/v10`: `GET /users/@me`, `GET /oauth2/applications/@me`, `GET /gateway` and
`/gateway/bot`, `GET /channels/{id}`, `POST /channels/{id}/messages` (honours
`message_reference` and `allowed_mentions.replied_user`, answers a full message object),
`PATCH /channels/{id}/messages/{id}` (a bot edits its own message's content; recorded in
`edits`, not dispatched), `POST /channels/{id}/typing` and
`POST /channels/{id}/messages/{id}/threads`. Every answer
is `Content-Type: application/json` exactly (discord.py parses nothing else) and carries
`X-RateLimit-*` headers; an injected 429 also carries `Retry-After` and the `Via` header
whose absence discord.py reads as a Cloudflare ban.

The gateway at `/gateway` speaks JSON: HELLO, heartbeat/ACK, IDENTIFY → READY (with
`resume_gateway_url` pointing back here) then one GUILD_CREATE per guild, MESSAGE_CREATE
and THREAD_CREATE dispatches with increasing `s`, and RESUME → the missed dispatches, then
RESUMED (an unknown session gets INVALID_SESSION). `compress=zlib-stream` in the URL is
honoured (binary frames, one zlib stream per connection, each frame sync-flushed); any other
value is ignored and frames are sent as text, which discord.py also accepts.

Like Discord, a message (injected, or posted by a bot over REST) is dispatched to every
bot in the channel's guild, its author included, so hosted bots see each other's posts.
Dispatches to a bot whose connection is down wait in its session's backlog for a RESUME.

Hooks: `message` / `redeliver` / `dispatch` inject events; `sent`, `typing_calls`,
`threads_opened` and `intents` (the IDENTIFY intents of each token) record what bots
did; `fail_next_sends(n)` answers the next n message posts with 429, `fail_next_edits(n)`
the next n edits, and `refuse_next_edits(n)` answers them 403 (as for a message that can
no longer be edited); `content_of(id)` is a message's text now, edits included;
`lose_next_answers(n)` posts the next n but answers 503, as if the answer were lost (a
post with a `nonce` already seen and `enforce_nonce` gets the message that nonce made, as
on Discord); `drop_connections()` cuts every gateway connection without a close frame and
`close_connections(code)` closes them with a close code; `on_send` lets a test react to
each posted message (e.g. play another bot that answers).

Standalone, for tests that run gateways in other processes:
`python -m tests.fakes.discord_server --port N --config fake.json` serves a world described
by JSON (see `World.from_json`) and a small control API under `/_fake/` (`POST messages`,
`GET sent`, `POST fail_sends`, `POST drop`). Its first output line says where it listens,
so `--port 0` (the default: any free port) is what tests use.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import re
import time
import zlib
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any

from aiohttp import WSMsgType, web

from tests.fakes.loopback import serve_loopback

Json = dict[str, Any]

API_PREFIX = "/api/v10"
DISCORD_EPOCH_MS = 1_420_070_400_000
MAX_CONTENT = 2000
TEXT, DM, PUBLIC_THREAD = 0, 1, 11
DEFAULT, REPLY, THREAD_STARTER = 0, 19, 21
BACKLOG = 1000
_MENTION = re.compile(r"<@!?(\d+)>")


@dataclass(frozen=True, slots=True)
class FakeUser:
    """A Discord account: a person or a bot."""

    id: int
    username: str
    bot: bool = False
    global_name: str | None = None

    def to_json(self) -> Json:
        """The user object (the `bot` field is left out for people, as Discord does)."""
        data: Json = {
            "id": str(self.id),
            "username": self.username,
            "discriminator": "0",
            "global_name": self.global_name,
            "avatar": None,
            "public_flags": 0,
        }
        if self.bot:
            data["bot"] = True
        return data


@dataclass(frozen=True, slots=True)
class FakeChannel:
    """A guild text channel, a thread in one (`parent_id`), or a DM of a person with a bot."""

    id: int
    name: str
    type: int = TEXT
    guild_id: int | None = None
    parent_id: int | None = None
    recipient: FakeUser | None = None
    dm_bot_id: int | None = None

    def to_json(self) -> Json:
        """The channel object."""
        data: Json = {"id": str(self.id), "type": self.type, "last_message_id": None}
        if self.type == DM:
            data["recipients"] = [self.recipient.to_json()] if self.recipient else []
            return data
        data.update(
            guild_id=str(self.guild_id),
            name=self.name,
            position=0,
            permission_overwrites=[],
            nsfw=False,
            rate_limit_per_user=0,
            parent_id=str(self.parent_id) if self.parent_id else None,
        )
        if self.type == PUBLIC_THREAD:
            data.update(
                owner_id="1",
                message_count=0,
                member_count=1,
                total_message_sent=0,
                flags=0,
                thread_metadata={
                    "archived": False,
                    "auto_archive_duration": 1440,
                    "archive_timestamp": _iso(time.time()),
                    "locked": False,
                },
            )
        else:
            data["topic"] = None
        return data


@dataclass(slots=True)
class FakeGuild:
    """A guild: its channels (threads included) and members (people and bots)."""

    id: int
    name: str
    members: list[FakeUser] = field(default_factory=list)
    channels: list[FakeChannel] = field(default_factory=list)

    def to_json(self) -> Json:
        """The GUILD_CREATE payload."""
        joined = _iso(time.time())
        return {
            "id": str(self.id),
            "name": self.name,
            "icon": None,
            "owner_id": str(self.members[0].id) if self.members else "1",
            "unavailable": False,
            "large": False,
            "member_count": len(self.members),
            "joined_at": joined,
            "features": [],
            "emojis": [],
            "stickers": [],
            "roles": [
                {
                    "id": str(self.id),
                    "name": "@everyone",
                    "permissions": "1071698660929",
                    "position": 0,
                    "color": 0,
                    "hoist": False,
                    "managed": False,
                    "mentionable": False,
                    "flags": 0,
                }
            ],
            "channels": [c.to_json() for c in self.channels if c.type != PUBLIC_THREAD],
            "threads": [c.to_json() for c in self.channels if c.type == PUBLIC_THREAD],
            "members": [_member(user, joined) for user in self.members],
            "voice_states": [],
            "presences": [],
            "stage_instances": [],
            "guild_scheduled_events": [],
            "afk_timeout": 300,
            "verification_level": 0,
            "default_message_notifications": 0,
            "explicit_content_filter": 0,
            "mfa_level": 0,
            "nsfw_level": 0,
            "premium_tier": 0,
            "preferred_locale": "en-US",
            "system_channel_flags": 0,
        }


@dataclass(frozen=True, slots=True)
class PostedMessage:
    """One message a bot posted over REST."""

    token: str
    author_id: int
    channel_id: int
    message_id: int
    content: str
    reply_to: int | None
    pings_replied_user: bool
    sent_at: float


@dataclass(frozen=True, slots=True)
class EditedMessage:
    """One `PATCH /channels/{id}/messages/{id}` that changed a message."""

    token: str
    channel_id: int
    message_id: int
    content: str


@dataclass(frozen=True, slots=True)
class TypingCall:
    """One `POST /channels/{id}/typing`."""

    token: str
    channel_id: int


@dataclass(slots=True)
class _Session:
    """One gateway session of one bot: its sequence, backlog and current connection."""

    session_id: str
    token: str
    seq: int = 0
    backlog: deque[tuple[int, str]] = field(default_factory=lambda: deque(maxlen=BACKLOG))
    outbox: asyncio.Queue[str | None] | None = None


class _RestError(Exception):
    """An error answer of the REST API."""

    def __init__(self, status: int, code: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


@dataclass(slots=True)
class World:
    """The bots, people, guilds and DMs a fake serves."""

    bots: dict[str, FakeUser] = field(default_factory=dict)
    guilds: dict[int, FakeGuild] = field(default_factory=dict)
    channels: dict[int, FakeChannel] = field(default_factory=dict)
    users: dict[int, FakeUser] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: Json) -> World:
        """A world from JSON: `{"bots": [{token, id, username}], "users": [{id, username,
        bot?}], "guilds": [{id, name, members: [ids], channels: [{id, name, parent_id?}]}],
        "dms": [{id, user, bot}]}` (bots are listed as guild members by id too)."""
        world = cls()
        for bot in data.get("bots", []):
            world.add_bot(bot["token"], FakeUser(int(bot["id"]), bot["username"], bot=True))
        for user in data.get("users", []):
            world.users[int(user["id"])] = FakeUser(
                int(user["id"]), user["username"], bot=bool(user.get("bot", False))
            )
        for guild in data.get("guilds", []):
            members = [world.users[int(m)] for m in guild.get("members", [])]
            created = world.add_guild(int(guild["id"]), guild.get("name", "guild"), members)
            for channel in guild.get("channels", []):
                parent = channel.get("parent_id")
                world.add_channel(
                    created.id,
                    int(channel["id"]),
                    channel.get("name", "channel"),
                    parent_id=int(parent) if parent else None,
                )
        for dm in data.get("dms", []):
            world.add_dm(int(dm["id"]), world.users[int(dm["user"])], world.users[int(dm["bot"])])
        return world

    def add_bot(self, token: str, user: FakeUser) -> FakeUser:
        """A bot account that logs in with `token`."""
        self.bots[token] = user
        self.users[user.id] = user
        return user

    def add_guild(self, guild_id: int, name: str, members: Iterable[FakeUser]) -> FakeGuild:
        """A guild with these members (bots join it by being listed)."""
        guild = FakeGuild(guild_id, name, list(members))
        for user in guild.members:
            self.users[user.id] = user
        self.guilds[guild_id] = guild
        return guild

    def add_channel(
        self, guild_id: int, channel_id: int, name: str, *, parent_id: int | None = None
    ) -> FakeChannel:
        """A text channel, or a public thread when `parent_id` names its channel."""
        kind = PUBLIC_THREAD if parent_id else TEXT
        channel = FakeChannel(channel_id, name, kind, guild_id, parent_id)
        self.guilds[guild_id].channels.append(channel)
        self.channels[channel_id] = channel
        return channel

    def add_dm(self, channel_id: int, person: FakeUser, bot: FakeUser) -> FakeChannel:
        """A DM channel between a person and a bot."""
        channel = FakeChannel(channel_id, person.username, DM, recipient=person, dm_bot_id=bot.id)
        self.users[person.id] = person
        self.channels[channel_id] = channel
        return channel

    def guild_of(self, channel: FakeChannel) -> FakeGuild | None:
        """The guild a channel belongs to (None for a DM)."""
        return self.guilds.get(channel.guild_id) if channel.guild_id else None

    def tokens_seeing(self, channel: FakeChannel) -> list[str]:
        """The bots a message in this channel is dispatched to."""
        guild = self.guild_of(channel)
        ids = {user.id for user in guild.members} if guild else {channel.dm_bot_id}
        return [token for token, user in self.bots.items() if user.id in ids]


class DiscordFake:
    """The fake Discord: REST, gateway, world, recordings and fault injection."""

    def __init__(self, world: World | None = None, *, heartbeat_interval_ms: int = 41_250):
        self.world = world or World()
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.sent: list[PostedMessage] = []
        self.typing_calls: list[TypingCall] = []
        self.edits: list[EditedMessage] = []
        self.edit_attempts = 0
        self.threads_opened: list[FakeChannel] = []
        self.send_attempts = 0
        self.identifies: dict[str, int] = {}
        self.intents: dict[str, int] = {}
        self.resumes: dict[str, int] = {}
        self.on_send: Callable[[PostedMessage], None] | None = None
        self._messages: dict[int, Json] = {}
        self._sessions: dict[str, _Session] = {}
        self._live: dict[str, _Session] = {}
        self._transports: set[asyncio.Transport] = set()
        self._sockets: set[web.WebSocketResponse] = set()
        self._fail_sends: deque[float] = deque()
        self._fail_edits: deque[float] = deque()
        self._refuse_edits = 0
        self._lose_answers: deque[int] = deque()
        self._nonces: dict[tuple[int, int, str], Json] = {}
        self._ids = itertools.count(((int(time.time() * 1000) - DISCORD_EPOCH_MS) << 22) + 1)
        self._runner: web.AppRunner | None = None
        self.port = 0

    # ------------------------------------------------------------------ lifecycle

    async def start(self, port: int = 0) -> None:
        """Serve on 127.0.0.1 (port 0: any free port, see `port`)."""
        app = web.Application()
        api = API_PREFIX
        app.router.add_get(f"{api}/users/@me", self._me)
        app.router.add_get(f"{api}/oauth2/applications/@me", self._application)
        app.router.add_get(f"{api}/gateway", self._gateway_info)
        app.router.add_get(f"{api}/gateway/bot", self._gateway_info)
        app.router.add_get(f"{api}/channels/{{channel}}", self._get_channel)
        app.router.add_post(f"{api}/channels/{{channel}}/messages", self._post_message)
        app.router.add_patch(f"{api}/channels/{{channel}}/messages/{{message}}", self._edit_message)
        app.router.add_post(f"{api}/channels/{{channel}}/typing", self._typing)
        app.router.add_post(
            f"{api}/channels/{{channel}}/messages/{{message}}/threads", self._open_thread
        )
        app.router.add_get("/gateway", self._gateway)
        app.router.add_post("/_fake/messages", self._control_message)
        app.router.add_get("/_fake/sent", self._control_sent)
        app.router.add_post("/_fake/fail_sends", self._control_fail_sends)
        app.router.add_post("/_fake/drop", self._control_drop)
        self._runner = web.AppRunner(app, handle_signals=False)
        self.port = await serve_loopback(self._runner, port)

    async def close(self) -> None:
        """Cut every connection and stop serving."""
        self.drop_connections()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> DiscordFake:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    @property
    def base_url(self) -> str:
        """What a bot's `api_base_url` should be."""
        return f"http://127.0.0.1:{self.port}{API_PREFIX}"

    @property
    def gateway_url(self) -> str:
        """What a bot's `gateway_url` should be."""
        return f"ws://127.0.0.1:{self.port}/gateway"

    # ------------------------------------------------------------------ test hooks

    def connected(self, token: str) -> bool:
        """True while the bot of `token` has a live, identified gateway connection."""
        session = self._live.get(token)
        return session is not None and session.outbox is not None

    def message(
        self,
        channel_id: int,
        author: FakeUser | None,
        content: str,
        *,
        reply_to: int | None = None,
        ping_reply: bool = True,
        type: int | None = None,  # noqa: A002 - the field's name on the wire
        attachments: Iterable[Json] = (),
        webhook_id: int | None = None,
    ) -> Json:
        """Someone posts in a channel; every bot that can see it gets MESSAGE_CREATE."""
        channel = self.world.channels.get(channel_id)
        message = self.build_message(
            channel_id,
            author,
            content,
            guild_id=channel.guild_id if channel else None,
            reply_to=reply_to,
            ping_reply=ping_reply,
            type_=type,
        )
        message["attachments"] = list(attachments)
        if webhook_id is not None:
            message["webhook_id"] = str(webhook_id)
        self._messages[int(message["id"])] = message
        tokens = self.world.tokens_seeing(channel) if channel else list(self.world.bots)
        self.dispatch("MESSAGE_CREATE", message, tokens=tokens)
        return message

    def redeliver(self, payload: Json, *, tokens: Iterable[str] | None = None) -> None:
        """The same MESSAGE_CREATE again (a new sequence number, the same message)."""
        self.dispatch("MESSAGE_CREATE", payload, tokens=tokens)

    def dispatch(self, event: str, data: object, *, tokens: Iterable[str] | None = None) -> None:
        """Send a dispatch (op 0) to these bots (default: every bot)."""
        for token in list(self.world.bots) if tokens is None else tokens:
            session = self._live.get(token)
            if session is not None:
                self._send_dispatch(session, event, data)

    def fail_next_sends(self, count: int, retry_after: float = 0.05) -> None:
        """Answer the next `count` message posts with 429 and this `retry_after`."""
        self._fail_sends.extend([retry_after] * count)

    def fail_next_edits(self, count: int, retry_after: float = 0.05) -> None:
        """Answer the next `count` message edits with 429 and this `retry_after`."""
        self._fail_edits.extend([retry_after] * count)

    def refuse_next_edits(self, count: int) -> None:
        """Answer the next `count` message edits with 403, as for a message beyond editing."""
        self._refuse_edits += count

    def content_of(self, message_id: int) -> str:
        """The text of a message now, with its edits."""
        return str(self._messages[message_id]["content"])

    def lose_next_answers(self, count: int, status: int = 503) -> None:
        """Post the next `count` messages, then answer with this status (a lost answer)."""
        self._lose_answers.extend([status] * count)

    @property
    def pending_failures(self) -> int:
        """Injected 429s not yet served."""
        return len(self._fail_sends)

    def drop_connections(self) -> None:
        """Cut every gateway connection at the TCP level, without a close frame."""
        for transport in list(self._transports):
            transport.abort()

    async def close_connections(self, code: int) -> None:
        """Close every gateway connection with this close code (4010 etc.: no resuming)."""
        for ws in list(self._sockets):
            await ws.close(code=code)

    # ------------------------------------------------------------------ REST

    def _bot(self, request: web.Request) -> tuple[str, FakeUser]:
        header = request.headers.get("Authorization", "")
        token = header.removeprefix("Bot ")
        user = self.world.bots.get(token)
        if not header.startswith("Bot ") or user is None:
            raise _RestError(401, 0, "401: Unauthorized")
        return token, user

    def _channel_for(self, request: web.Request, token: str) -> FakeChannel:
        try:
            channel = self.world.channels.get(int(request.match_info["channel"]))
        except ValueError:
            channel = None
        if channel is None or token not in self.world.tokens_seeing(channel):
            raise _RestError(404, 10003, "Unknown Channel")
        return channel

    async def _me(self, request: web.Request) -> web.Response:
        def me() -> Json:
            return self._bot(request)[1].to_json()

        return await _answer(me)

    async def _application(self, request: web.Request) -> web.Response:
        def app() -> Json:
            _, user = self._bot(request)
            return {
                "id": str(user.id),
                "name": user.username,
                "icon": None,
                "description": "",
                "bot_public": True,
                "bot_require_code_grant": False,
                "owner": user.to_json(),
                "verify_key": "0" * 64,
                "flags": 1 << 19,
                "team": None,
            }

        return await _answer(app)

    async def _gateway_info(self, request: web.Request) -> web.Response:
        url = f"ws://127.0.0.1:{self.port}/gateway"
        limit = {"total": 1000, "remaining": 999, "reset_after": 0, "max_concurrency": 1}
        return _json({"url": url, "shards": 1, "session_start_limit": limit})

    async def _get_channel(self, request: web.Request) -> web.Response:
        def channel() -> Json:
            token, _ = self._bot(request)
            return self._channel_for(request, token).to_json()

        return await _answer(channel)

    async def _typing(self, request: web.Request) -> web.Response:
        try:
            token, _ = self._bot(request)
            channel = self._channel_for(request, token)
        except _RestError as exc:
            return _error(exc)
        self.typing_calls.append(TypingCall(token, channel.id))
        return web.Response(status=204, headers=_ratelimit_headers())

    async def _post_message(self, request: web.Request) -> web.Response:
        self.send_attempts += 1
        try:
            token, user = self._bot(request)
            channel = self._channel_for(request, token)
            if self._fail_sends:
                return _rate_limited(self._fail_sends.popleft())
            body = await _json_body(request)
            message = self._posted(token, user, channel, body)
        except _RestError as exc:
            return _error(exc)
        if self._lose_answers:
            status = self._lose_answers.popleft()
            return _json({"message": "Service Unavailable", "code": 0}, status=status)
        return _json(message)

    def _posted(self, token: str, user: FakeUser, channel: FakeChannel, body: Json) -> Json:
        nonce = body.get("nonce")
        if isinstance(nonce, str | int) and body.get("enforce_nonce"):
            key = (user.id, channel.id, str(nonce))
            if key in self._nonces:  # Discord returns the message this nonce already made
                return self._nonces[key]
        content = body.get("content")
        if not isinstance(content, str) or not content or len(content) > MAX_CONTENT:
            raise _RestError(400, 50035, "Invalid Form Body")
        reference = body.get("message_reference") or {}
        reply_to = int(reference["message_id"]) if reference.get("message_id") else None
        if reply_to is not None and int(self._messages.get(reply_to, {}).get("channel_id", 0)) != (
            channel.id
        ):
            if reference.get("fail_if_not_exists", True):
                raise _RestError(400, 50035, "Invalid Form Body (unknown message_reference)")
            reply_to = None
        allowed = body.get("allowed_mentions")
        ping = bool(allowed.get("replied_user", False)) if isinstance(allowed, dict) else True
        message = self.build_message(
            channel.id,
            user,
            content,
            guild_id=channel.guild_id,
            reply_to=reply_to,
            ping_reply=ping,
        )
        if isinstance(nonce, str | int):
            message["nonce"] = nonce
            if body.get("enforce_nonce"):
                self._nonces[(user.id, channel.id, str(nonce))] = message
        message_id = int(message["id"])
        self._messages[message_id] = message
        posted = PostedMessage(
            token, user.id, channel.id, message_id, content, reply_to, ping, time.monotonic()
        )
        self.sent.append(posted)
        self.dispatch("MESSAGE_CREATE", message, tokens=self.world.tokens_seeing(channel))
        if self.on_send is not None:
            self.on_send(posted)
        return message

    async def _edit_message(self, request: web.Request) -> web.Response:
        self.edit_attempts += 1
        try:
            token, user = self._bot(request)
            channel = self._channel_for(request, token)
            if self._fail_edits:
                return _rate_limited(self._fail_edits.popleft())
            body = await _json_body(request)
            message = self._edited(token, user, channel, request.match_info["message"], body)
        except _RestError as exc:
            return _error(exc)
        return _json(message)

    def _edited(
        self, token: str, user: FakeUser, channel: FakeChannel, message_id: str, body: Json
    ) -> Json:
        """Edit a bot's own message in this channel; the message as it is now."""
        message = self._messages.get(int(message_id)) if message_id.isdigit() else None
        if message is None or int(message["channel_id"]) != channel.id:
            raise _RestError(404, 10008, "Unknown Message")
        if self._refuse_edits or int(message.get("author", {}).get("id", 0)) != user.id:
            self._refuse_edits = max(0, self._refuse_edits - 1)
            raise _RestError(403, 50005, "Cannot edit a message authored by another user")
        content = body.get("content")
        if not isinstance(content, str) or not content or len(content) > MAX_CONTENT:
            raise _RestError(400, 50035, "Invalid Form Body")
        message["content"] = content
        message["edited_timestamp"] = _iso(time.time())
        self.edits.append(EditedMessage(token, channel.id, int(message["id"]), content))
        return message

    async def _open_thread(self, request: web.Request) -> web.Response:
        try:
            token, user = self._bot(request)
            parent = self._channel_for(request, token)
            starter = int(request.match_info["message"])
            name = (await _json_body(request)).get("name")
            thread = self._thread_on(parent, starter, name)
        except _RestError as exc:
            return _error(exc)
        self.threads_opened.append(thread)
        data = {**thread.to_json(), "owner_id": str(user.id), "newly_created": True}
        self.dispatch("THREAD_CREATE", data, tokens=self.world.tokens_seeing(parent))
        return _json(data, status=201)

    def _thread_on(self, parent: FakeChannel, starter: int, name: object) -> FakeChannel:
        """A public thread opened on a message; it takes the message's id, as on Discord."""
        if int(self._messages.get(starter, {}).get("channel_id", 0)) != parent.id:
            raise _RestError(404, 10008, "Unknown Message")
        if starter in self.world.channels:
            raise _RestError(400, 160004, "A thread has already been created for this message")
        if not isinstance(name, str) or not 1 <= len(name) <= 100 or parent.guild_id is None:
            raise _RestError(400, 50035, "Invalid Form Body")
        return self.world.add_channel(parent.guild_id, starter, name, parent_id=parent.id)

    def build_message(
        self,
        channel_id: int,
        author: FakeUser | None,
        content: str,
        *,
        guild_id: int | None = None,
        reply_to: int | None = None,
        ping_reply: bool = True,
        type_: int | None = None,
    ) -> Json:
        """A message object as Discord would send it (not stored, not dispatched)."""
        mentioned = {int(m) for m in _MENTION.findall(content)}
        referenced = self._messages.get(reply_to) if reply_to is not None else None
        if referenced is not None and ping_reply and referenced.get("author"):
            mentioned.add(int(referenced["author"]["id"]))
        mentions = [
            self.world.users[i].to_json() for i in sorted(mentioned) if i in self.world.users
        ]
        message: Json = {
            "id": str(next(self._ids)),
            "channel_id": str(channel_id),
            "content": content,
            "timestamp": _iso(time.time()),
            "edited_timestamp": None,
            "tts": False,
            "mention_everyone": False,
            "mentions": mentions,
            "mention_roles": [],
            "attachments": [],
            "embeds": [],
            "components": [],
            "pinned": False,
            "flags": 0,
            "type": type_ if type_ is not None else (REPLY if reply_to is not None else DEFAULT),
        }
        if author is not None:
            message["author"] = author.to_json()
        if guild_id is not None:
            message["guild_id"] = str(guild_id)
            if author is not None:
                message["member"] = _member(author, message["timestamp"], with_user=False)
        if reply_to is not None:
            message["message_reference"] = {
                "type": 0,
                "message_id": str(reply_to),
                "channel_id": str(channel_id),
                **({"guild_id": str(guild_id)} if guild_id is not None else {}),
            }
            message["referenced_message"] = (
                {k: v for k, v in referenced.items() if k != "referenced_message"}
                if referenced is not None
                else None
            )
        return message

    # ------------------------------------------------------------------ gateway

    async def _gateway(self, request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse(autoping=True, max_msg_size=0)
        await ws.prepare(request)
        transport = request.transport
        if transport is not None:
            self._transports.add(transport)
        self._sockets.add(ws)
        compressor = zlib.compressobj() if request.query.get("compress") == "zlib-stream" else None
        outbox: asyncio.Queue[str | None] = asyncio.Queue()
        writer = asyncio.create_task(self._write(ws, outbox, compressor))
        outbox.put_nowait(
            json.dumps({"op": 10, "d": {"heartbeat_interval": self.heartbeat_interval_ms}})
        )
        session: _Session | None = None
        try:
            async for frame in ws:
                if frame.type is not WSMsgType.TEXT:
                    continue
                payload = json.loads(frame.data)
                op = payload.get("op")
                if op == 1:
                    outbox.put_nowait(json.dumps({"op": 11}))
                elif op == 2:
                    session = self._identify(payload.get("d") or {}, outbox)
                    if session is None:
                        await ws.close(code=4004, message=b"Authentication failed.")
                elif op == 6:
                    session = self._resume(payload.get("d") or {}, outbox)
        finally:
            if session is not None and session.outbox is outbox:
                session.outbox = None
            outbox.put_nowait(None)
            with contextlib.suppress(asyncio.CancelledError):
                await writer
            if transport is not None:
                self._transports.discard(transport)
            self._sockets.discard(ws)
        return ws

    async def _write(
        self,
        ws: web.WebSocketResponse,
        outbox: asyncio.Queue[str | None],
        compressor: zlib._Compress | None,
    ) -> None:
        """Send queued frames in order (zlib-stream: one stream, sync-flushed per frame)."""
        while (text := await outbox.get()) is not None:
            if ws.closed:
                return
            try:
                if compressor is None:
                    await ws.send_str(text)
                else:
                    data = compressor.compress(text.encode()) + compressor.flush(zlib.Z_SYNC_FLUSH)
                    await ws.send_bytes(data)
            except ConnectionError:
                return

    def _identify(self, data: Json, outbox: asyncio.Queue[str | None]) -> _Session | None:
        token = data.get("token")
        user = self.world.bots.get(token) if isinstance(token, str) else None
        if user is None or not isinstance(token, str):
            return None
        self.identifies[token] = self.identifies.get(token, 0) + 1
        intents = data.get("intents")
        if isinstance(intents, int):
            self.intents[token] = intents
        old = self._live.get(token)
        if old is not None and old.outbox is not None:
            old.outbox.put_nowait(None)
        session = _Session(session_id=f"session-{user.id}-{self.identifies[token]}", token=token)
        self._sessions[session.session_id] = session
        self._live[token] = session
        session.outbox = outbox
        guilds = [g for g in self.world.guilds.values() if any(m.id == user.id for m in g.members)]
        self._send_dispatch(
            session,
            "READY",
            {
                "v": 10,
                "user": user.to_json(),
                "guilds": [{"id": str(g.id), "unavailable": True} for g in guilds],
                "session_id": session.session_id,
                "resume_gateway_url": self.gateway_url,
                "application": {"id": str(user.id), "flags": 1 << 19},
                "private_channels": [],
                "relationships": [],
            },
        )
        for guild in guilds:
            self._send_dispatch(session, "GUILD_CREATE", guild.to_json())
        return session

    def _resume(self, data: Json, outbox: asyncio.Queue[str | None]) -> _Session | None:
        session = self._sessions.get(str(data.get("session_id")))
        if (
            session is None
            or session.token != data.get("token")
            or self._live.get(session.token) is not session
        ):
            outbox.put_nowait(json.dumps({"op": 9, "d": False}))
            return None
        self.resumes[session.token] = self.resumes.get(session.token, 0) + 1
        seq = data.get("seq")
        seen = seq if isinstance(seq, int) else 0
        session.outbox = outbox
        for seq, frame in session.backlog:
            if seq > seen:
                outbox.put_nowait(frame)
        self._send_dispatch(session, "RESUMED", {})
        return session

    def _send_dispatch(self, session: _Session, event: str, data: object) -> None:
        session.seq += 1
        frame = json.dumps({"op": 0, "t": event, "s": session.seq, "d": data})
        session.backlog.append((session.seq, frame))
        if session.outbox is not None:
            session.outbox.put_nowait(frame)

    # ------------------------------------------------------------------ control API

    async def _control_message(self, request: web.Request) -> web.Response:
        body = await request.json()
        author = self.world.users.get(int(body["author_id"]))
        reply_to = body.get("reply_to")
        message = self.message(
            int(body["channel_id"]),
            author,
            str(body["content"]),
            reply_to=int(reply_to) if reply_to else None,
        )
        return _json(message)

    async def _control_sent(self, request: web.Request) -> web.Response:
        return _json(
            [
                {
                    "author_id": str(m.author_id),
                    "channel_id": str(m.channel_id),
                    "message_id": str(m.message_id),
                    "content": m.content,
                    "reply_to": str(m.reply_to) if m.reply_to else None,
                }
                for m in self.sent
            ]
        )

    async def _control_fail_sends(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.fail_next_sends(int(body.get("count", 1)), float(body.get("retry_after", 0.05)))
        return _json({"pending": self.pending_failures})

    async def _control_drop(self, request: web.Request) -> web.Response:
        self.drop_connections()
        return _json({"dropped": True})


def _member(user: FakeUser, joined: str, *, with_user: bool = True) -> Json:
    member: Json = {
        "roles": [],
        "joined_at": joined,
        "deaf": False,
        "mute": False,
        "flags": 0,
        "nick": None,
    }
    if with_user:
        member["user"] = user.to_json()
    return member


def _iso(moment: float) -> str:
    return datetime.fromtimestamp(moment, UTC).isoformat()


def _ratelimit_headers(remaining: int = 49, reset_after: float = 1.0) -> dict[str, str]:
    return {
        "X-RateLimit-Limit": "50",
        "X-RateLimit-Remaining": str(remaining),
        "X-RateLimit-Reset": f"{time.time() + reset_after:.3f}",
        "X-RateLimit-Reset-After": f"{reset_after:.3f}",
        "X-RateLimit-Bucket": "fake-bucket",
    }


def _json(
    data: object, *, status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    """A JSON answer whose Content-Type is exactly `application/json`, as Discord's is."""
    return web.Response(
        body=json.dumps(data).encode(),
        status=status,
        headers={"Content-Type": "application/json", **_ratelimit_headers(), **(headers or {})},
    )


def _error(exc: _RestError) -> web.Response:
    return _json({"message": exc.message, "code": exc.code}, status=exc.status)


def _rate_limited(retry_after: float) -> web.Response:
    """Discord's 429: JSON body, Retry-After, exhausted bucket headers and a `Via` header."""
    return web.Response(
        body=json.dumps(
            {"message": "You are being rate limited.", "retry_after": retry_after, "global": False}
        ).encode(),
        status=429,
        headers={
            "Content-Type": "application/json",
            **_ratelimit_headers(remaining=0, reset_after=retry_after),
            "Retry-After": str(max(1, round(retry_after))),
            "X-RateLimit-Scope": "user",
            "Via": "1.1 google",
        },
    )


async def _answer(build: Callable[[], Json]) -> web.Response:
    try:
        return _json(build())
    except _RestError as exc:
        return _error(exc)


async def _json_body(request: web.Request) -> Json:
    try:
        body = await request.json()
    except ValueError:
        raise _RestError(400, 50109, "The request body contains invalid JSON.") from None
    if not isinstance(body, dict):
        raise _RestError(400, 50035, "Invalid Form Body")
    return body


async def _serve(port: int, world: World) -> None:
    fake = DiscordFake(world)
    await fake.start(port)
    print(f"discord fake listening on {fake.base_url} (gateway {fake.gateway_url})", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await fake.close()


def main(argv: list[str] | None = None) -> None:
    """Run the fake as a process until interrupted."""
    parser = argparse.ArgumentParser(description="A fake Discord for loopwarden tests.")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--config", type=Path, required=True, help="the world, as JSON")
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        world = World.from_json(json.loads(args.config.read_text(encoding="utf-8")))
        asyncio.run(_serve(args.port, world))


if __name__ == "__main__":
    main()
