"""A local fake Mattermost (REST API v4 and the websocket event stream), over real loopback.

REST under `/api/v4`, authenticated by `Authorization: Bearer <token>` (or `Token <token>`,
as Mattermost also reads); a missing or unknown token gets 401 with Mattermost's AppError
JSON (`id`, `message`, `detailed_error`, `request_id`, `status_code`). Routes:
`GET /users/me` and `GET /users/{id}` (a user object with `is_bot`),
`GET /users/{id}/channels` (the caller's own channels, by `me` or its id, each with
`last_post_at`), `GET /channels/{id}` (a private, direct or group channel only to its
members), `GET /channels/{id}/posts` (a `PostList`: a page, or with `since` the posts
changed after it, as the server answers it), `POST /posts` (`channel_id`, `message`,
`root_id`, `props`, `pending_post_id`; answers 201 and the post with `id`, `create_at`,
`user_id`...; a bot's post gets `props.from_bot = "true"`, as on the server, and a
`pending_post_id` seen in the last 30 seconds answers its post again, posting nothing) and
`PUT /posts/{id}/patch` (an author edits a post's `message` or `props`).

The websocket at `/api/v4/websocket`: a client authenticates with an `Authorization` header
on the upgrade or with the `authentication_challenge` action (`{"seq": 1, "action":
"authentication_challenge", "data": {"token": ...}}`); the fake then sends the `hello` event
and answers `{"status": "OK", "seq_reply": 1}` (an unknown token closes the socket, as the
server does; other actions before it get a FAIL answer). `ping` answers `pong`. Events carry
`event`, `data`, `broadcast` and a per-connection `seq` counting from 0: `posted` (`data.post`
is the post as a JSON string, with `channel_type`, `channel_name`, `channel_display_name`,
`sender_name` (`@username`, or a webhook's `override_username`), `team_id`, `set_online`
and, when someone is mentioned by `@username`, `mentions` as a JSON string of user ids) and
`post_edited` (`data.post`), both with `broadcast.channel_id`. Like Mattermost, a post
(injected or made over REST) goes to every connection of every channel member, its author
included.

Hooks: `add_user` / `add_channel` build the world; `post_as` makes a person, a bot (then
`props.from_bot`) or an incoming webhook (`props.from_webhook`) post, `edit_as` edit one
and `delete_as` delete one (`post_deleted`); `posts` lists the posts as they were made,
`post(id)` and `texts` as they are now (edits included), `edits` what bots patched;
`set_rate_limit(limit, per_second)` answers requests past a token bucket with 429,
`limit exceeded` and the `X-RateLimit-Limit/Remaining/Reset` and `Retry-After` headers (the
clock is injectable); `drop_connections` closes (or cuts) websockets and
`refuse_websockets = True` answers new ones 503 (an outage: post while it lasts);
`wait_connected` waits for a user's authenticated socket; `send_event` sends any event;
`break_route` answers a route with any body (a broken proxy, a server bug) until
`mend_routes`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import re
import secrets
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from aiohttp import WSCloseCode, WSMsgType, web
from aiohttp.typedefs import Handler

from tests.fakes.loopback import LOOPBACK_HOST, serve_loopback

Json = dict[str, Any]
API = "/api/v4"
TEAM_ID = "loopwardenteam0000000000ab"
SERVER_VERSION = "10.11.0.0.fake.false"
MAX_MESSAGE_RUNES = 16383
"""Mattermost's `PostMessageMaxRunesV2`: a longer message is refused with 400."""
PENDING_POST_TTL = 30.0
"""Seconds the server remembers a `pending_post_id` (`PendingPostIDsCacheTTL`)."""
SINCE_LIMIT = 1000
"""The most posts a `GET /channels/{id}/posts?since=` answer holds (the server's `LIMIT 1000`)."""
_ID_ALPHABET = "ybndrfg8ejkmcpqxot1uwisza345h769"
_ID = re.compile(r"^[a-z0-9]{26}$")


def new_id() -> str:
    """A 26-character id in Mattermost's alphabet, like `model.NewId()`."""
    return "".join(secrets.choice(_ID_ALPHABET) for _ in range(26))


@dataclass(frozen=True, slots=True)
class FakeUser:
    """A Mattermost account: a person or a bot; a `token` lets it call the API."""

    id: str
    username: str
    is_bot: bool = False
    token: str | None = None

    def to_json(self) -> Json:
        """The user object the API answers (sanitised like the server's for another user)."""
        user: Json = {
            "id": self.id,
            "create_at": 1_700_000_000_000,
            "update_at": 1_700_000_000_000,
            "delete_at": 0,
            "username": self.username,
            "auth_data": "",
            "auth_service": "",
            "email": "" if self.is_bot else f"{self.username}@loopwarden.test",
            "nickname": "",
            "first_name": "",
            "last_name": "",
            "position": "",
            "roles": "system_user",
            "locale": "en",
            "timezone": {
                "automaticTimezone": "",
                "manualTimezone": "",
                "useAutomaticTimezone": "true",
            },
            "disable_welcome_email": False,
            "is_bot": self.is_bot,
        }
        if self.is_bot:
            user["bot_description"] = ""
        return user


@dataclass(slots=True)
class FakeChannel:
    """A channel: open (`O`), private (`P`), direct (`D`) or group (`G`), with its members."""

    id: str
    name: str
    display_name: str
    type: str
    members: set[str]
    team_id: str = TEAM_ID
    last_post_at: int = 0

    def to_json(self) -> Json:
        """The channel object the API answers."""
        return {
            "id": self.id,
            "create_at": 1_700_000_000_000,
            "update_at": 1_700_000_000_000,
            "delete_at": 0,
            "team_id": "" if self.type in ("D", "G") else self.team_id,
            "type": self.type,
            "display_name": self.display_name,
            "name": self.name,
            "header": "",
            "purpose": "",
            "last_post_at": self.last_post_at,
            "total_msg_count": 0,
            "extra_update_at": 0,
            "creator_id": "",
        }


@dataclass(slots=True)
class _Conn:
    """One websocket: its user once authenticated, its event counter and its writer's queue."""

    ws: web.WebSocketResponse
    transport: asyncio.Transport | None
    outbox: asyncio.Queue[str | None] = field(default_factory=asyncio.Queue)
    user_id: str | None = None
    seq: int = 0
    connection_id: str = field(default_factory=new_id)


@dataclass(slots=True)
class _Bucket:
    """A token bucket of one API token: `tokens` left at clock time `at`."""

    tokens: float
    at: float


class _ApiError(Exception):
    """An AppError answer: HTTP status, the error id and its message."""

    def __init__(self, status: int, error_id: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.error_id = error_id
        self.message = message


_SESSION_EXPIRED = (
    401,
    "api.context.session_expired.app_error",
    "Invalid or expired session, please login again.",
)
_NO_PERMISSION = (
    403,
    "api.context.permissions.app_error",
    "You do not have the appropriate permissions.",
)
_WS_ERRORS = {
    "api.web_socket_router.no_action.app_error": "No websocket action.",
    "api.web_socket_router.bad_seq.app_error": "Invalid sequence for websocket message.",
    "api.web_socket_router.not_authenticated.app_error": "No websocket session.",
    "api.web_socket_router.bad_action.app_error": "Unknown websocket action.",
}


class MattermostFake:
    """The fake Mattermost server: users, channels, posts, REST, websockets and rate limits."""

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.users: dict[str, FakeUser] = {}
        self.channels: dict[str, FakeChannel] = {}
        self.posts: list[Json] = []
        self.edits: list[Json] = []
        self.calls: list[tuple[str, str, str | None]] = []
        self._posts: dict[str, Json] = {}
        self._conns: list[_Conn] = []
        self._writers: set[asyncio.Task[None]] = set()
        self._connected = asyncio.Condition()
        self._limit: tuple[int, float] | None = None
        self._buckets: dict[str, _Bucket] = {}
        self._retry_after_header = True
        self._broken: dict[str, tuple[int, str]] = {}
        self._pending: dict[str, tuple[float, str]] = {}
        self.refuse_websockets = False
        app = web.Application(middlewares=[self._rate_limit_middleware])
        app.router.add_get(f"{API}/users/me", self._me)
        app.router.add_get(f"{API}/users/{{user_id}}", self._get_user)
        app.router.add_get(f"{API}/users/{{user_id}}/channels", self._user_channels)
        app.router.add_get(f"{API}/channels/{{channel_id}}", self._get_channel)
        app.router.add_get(f"{API}/channels/{{channel_id}}/posts", self._channel_posts)
        app.router.add_post(f"{API}/posts", self._create_post)
        app.router.add_put(f"{API}/posts/{{post_id}}/patch", self._patch_post)
        app.router.add_get(f"{API}/websocket", self._websocket)
        self._runner = web.AppRunner(app, handle_signals=False)
        self.port = 0

    async def __aenter__(self) -> MattermostFake:
        self.port = await serve_loopback(self._runner)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.drop_connections(abrupt=True)
        await self._runner.cleanup()
        for writer in self._writers:
            writer.cancel()
        await asyncio.gather(*self._writers, return_exceptions=True)

    @property
    def url(self) -> str:
        """The server URL a bot is configured with (the API is under `/api/v4`)."""
        return f"http://{LOOPBACK_HOST}:{self.port}"

    @property
    def websocket_url(self) -> str:
        """The event stream's URL."""
        return f"ws://{LOOPBACK_HOST}:{self.port}{API}/websocket"

    # ------------------------------------------------------------------ set-up

    def add_user(
        self, username: str, *, is_bot: bool = False, token: str | None = None
    ) -> FakeUser:
        """A person or a bot; with a `token` (every bot gets one) it can use the API."""
        if is_bot and token is None:
            token = secrets.token_hex(13)
        user = FakeUser(new_id(), username, is_bot, token)
        self.users[user.id] = user
        return user

    def add_channel(
        self,
        name: str,
        members: Iterable[FakeUser],
        *,
        channel_type: str = "O",
        display_name: str | None = None,
    ) -> FakeChannel:
        """A channel of `channel_type` (`O`, `P`, `D`, `G`) whose members are `members`."""
        channel = FakeChannel(
            new_id(), name, display_name or name, channel_type, {m.id for m in members}
        )
        self.channels[channel.id] = channel
        return channel

    # ------------------------------------------------------------------ injection

    def post_as(
        self,
        user: FakeUser,
        channel_id: str,
        message: str,
        *,
        root_id: str = "",
        props: Mapping[str, Any] | None = None,
        webhook: bool = False,
        override_username: str | None = None,
    ) -> Json:
        """A post by `user` (a bot's gets `from_bot`), or an incoming webhook's; sent as `posted`.

        A webhook post carries `props.from_webhook = "true"` and, with `override_username`,
        the name it shows (then also the event's `sender_name`).
        """
        extra = dict(props or {})
        if webhook:
            extra["from_webhook"] = "true"
            if override_username is not None:
                extra["override_username"] = override_username
        channel = self.channels[channel_id]
        return self._create(user, channel, message, root_id=root_id, props=extra)

    def edit_as(self, post_id: str, message: str) -> Json:
        """Change a post's message (as its author would) and send `post_edited`."""
        post = self._posts[post_id]
        self._edit(post, message=message, props=None)
        return dict(post)

    def delete_as(self, post_id: str) -> None:
        """Delete a post (as its author would): `delete_at` is set and `post_deleted` sent."""
        post = self._posts[post_id]
        post["delete_at"] = post["update_at"] = self._millis()
        channel = self.channels[str(post["channel_id"])]
        self._send_to_channel(channel, "post_deleted", {"post": json.dumps(post)})

    def send_event(
        self, user: FakeUser, event: str, data: Mapping[str, Any], *, channel_id: str = ""
    ) -> None:
        """Any event to every authenticated connection of `user`."""
        broadcast = _broadcast(channel_id=channel_id, user_id="" if channel_id else user.id)
        for conn in self._conns_of(user.id):
            self._enqueue_event(conn, event, dict(data), broadcast)

    async def drop_connections(self, user: FakeUser | None = None, *, abrupt: bool = False) -> None:
        """Close the websockets (of one user, or all) with a close frame, or cut them without."""
        for conn in list(self._conns):
            if user is not None and conn.user_id != user.id:
                continue
            if abrupt and conn.transport is not None:
                conn.transport.abort()
            else:
                await conn.ws.close(code=WSCloseCode.GOING_AWAY, message=b"dropped by the fake")

    async def wait_connected(self, user: FakeUser, count: int = 1) -> None:
        """Return once `user` has `count` authenticated websockets."""
        async with self._connected:
            await self._connected.wait_for(lambda: len(self._conns_of(user.id)) >= count)

    def connections(self, user: FakeUser) -> int:
        """How many authenticated websockets `user` has now."""
        return len(self._conns_of(user.id))

    def set_rate_limit(self, limit: int, *, per_second: float, retry_after: bool = True) -> None:
        """Each API token may make `limit` requests at once, refilled at `per_second`; then 429.

        `retry_after=False` leaves `Retry-After` out of a 429: only `X-RateLimit-Reset` says
        when to come back (as a proxy that drops the header would).
        """
        if limit < 1 or not per_second > 0:
            raise ValueError(
                f"set_rate_limit needs limit >= 1 and per_second > 0, not {limit}, {per_second}"
            )
        self._limit = (limit, per_second)
        self._retry_after_header = retry_after
        self._buckets.clear()

    def break_route(self, path: str, body: str, *, status: int = 200) -> None:
        """Answer every request for `path` (under `/api/v4`) with `body` as JSON, until mended."""
        self._broken[f"{API}{path}"] = (status, body)

    def mend_routes(self) -> None:
        """Answer every route as the server does again."""
        self._broken.clear()

    def clear_rate_limit(self) -> None:
        """No rate limit (the default)."""
        self._limit = None
        self._buckets.clear()

    # ------------------------------------------------------------------ queries

    def posts_by(self, user: FakeUser) -> list[Json]:
        """The posts `user` made, in order, as they are now."""
        return [dict(self._posts[p["id"]]) for p in self.posts if p["user_id"] == user.id]

    def texts(self, user: FakeUser | None = None, *, channel_id: str | None = None) -> list[str]:
        """The messages posted (by one user, in one channel, when given), as they are now."""
        return [
            str(self._posts[p["id"]]["message"])
            for p in self.posts
            if (user is None or p["user_id"] == user.id)
            and (channel_id is None or p["channel_id"] == channel_id)
        ]

    def post(self, post_id: str) -> Json:
        """One post as it is now, edits included."""
        return dict(self._posts[post_id])

    # ------------------------------------------------------------------ posts

    def _create(
        self,
        user: FakeUser,
        channel: FakeChannel,
        message: str,
        *,
        root_id: str,
        props: Json,
        pending_post_id: str = "",
    ) -> Json:
        if user.is_bot:
            props["from_bot"] = "true"
        now = self._millis()
        post: Json = {
            "id": new_id(),
            "create_at": now,
            "update_at": now,
            "edit_at": 0,
            "delete_at": 0,
            "is_pinned": False,
            "user_id": user.id,
            "channel_id": channel.id,
            "root_id": root_id,
            "original_id": "",
            "message": message,
            "type": "",
            "props": props,
            "hashtags": "",
            "pending_post_id": pending_post_id,
            "reply_count": 0,
            "last_reply_at": 0,
            "participants": None,
            "metadata": {},
        }
        if root_id:
            root = self._posts[root_id]
            root["reply_count"] = int(root["reply_count"]) + 1
            root["last_reply_at"] = now
        self._posts[post["id"]] = post
        self.posts.append(dict(post))
        channel.last_post_at = max(channel.last_post_at, now)
        self._send_posted(user, channel, post)
        return dict(post)

    def _send_posted(self, user: FakeUser, channel: FakeChannel, post: Json) -> None:
        props = post["props"]
        sender = f"@{user.username}"
        if props.get("from_webhook") == "true" and props.get("override_username"):
            sender = str(props["override_username"])
        data: Json = {
            "channel_display_name": channel.display_name,
            "channel_name": channel.name,
            "channel_type": channel.type,
            "post": json.dumps(post),
            "sender_name": sender,
            "set_online": not (user.is_bot or props.get("from_webhook") == "true"),
            "team_id": "" if channel.type in ("D", "G") else channel.team_id,
        }
        mentioned = self._mentions(user, channel, str(post["message"]), props)
        if mentioned:
            data["mentions"] = json.dumps(mentioned)
        self._send_to_channel(channel, "posted", data)

    def _mentions(
        self, author: FakeUser, channel: FakeChannel, message: str, props: Json
    ) -> list[str]:
        """Members named by `@username` (the author too only for a webhook post)."""
        found = []
        for member_id in sorted(channel.members):
            member = self.users[member_id]
            if member.id == author.id and props.get("from_webhook") != "true":
                continue
            if re.search(rf"(?<![\w.-])@{re.escape(member.username)}(?![\w-])", message, re.I):
                found.append(member.id)
        return found

    def _edit(self, post: Json, *, message: str | None, props: Json | None) -> None:
        now = self._millis()
        if message is not None:
            post["message"] = message
        if props is not None:
            post["props"] = props
        post["edit_at"] = post["update_at"] = now
        channel = self.channels[str(post["channel_id"])]
        self._send_to_channel(channel, "post_edited", {"post": json.dumps(post)})

    def _millis(self) -> int:
        return int(self.clock() * 1000)

    # ------------------------------------------------------------------ REST

    def _token_user(self, token: object) -> FakeUser | None:
        if not isinstance(token, str) or not token:
            return None
        return next((u for u in self.users.values() if u.token == token), None)

    def _header_user(self, request: web.Request) -> FakeUser | None:
        """The user of an `Authorization: Bearer|Token <token>` header, if any."""
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() not in ("bearer", "token"):
            return None
        return self._token_user(token.strip())

    def _user_of(self, request: web.Request) -> FakeUser:
        """The caller of an API request (recorded in `calls`), or 401."""
        user = self._header_user(request)
        self.calls.append((request.method, request.path, user.id if user else None))
        if user is None:
            raise _ApiError(*_SESSION_EXPIRED)
        return user

    def _channel_for(self, user: FakeUser, channel_id: str) -> FakeChannel:
        if not _ID.match(channel_id):
            raise _ApiError(
                400,
                "api.context.invalid_url_param.app_error",
                "Invalid or missing channel_id parameter in request URL.",
            )
        channel = self.channels.get(channel_id)
        if channel is None:
            raise _ApiError(
                404, "app.channel.get.existing.app_error", "Unable to find the existing channel."
            )
        if channel.type != "O" and user.id not in channel.members:
            raise _ApiError(*_NO_PERMISSION)
        return channel

    async def _me(self, request: web.Request) -> web.Response:
        return _answer(lambda: self._user_of(request).to_json())

    async def _get_user(self, request: web.Request) -> web.Response:
        def user() -> Json:
            me = self._user_of(request)
            user_id = request.match_info["user_id"]
            if user_id == "me":
                return me.to_json()
            if not _ID.match(user_id):
                raise _ApiError(
                    400,
                    "api.context.invalid_url_param.app_error",
                    "Invalid or missing user_id parameter in request URL.",
                )
            found = self.users.get(user_id)
            if found is None:
                raise _ApiError(404, "app.user.missing_account.const", "Unable to find the user.")
            return found.to_json()

        return _answer(user)

    async def _get_channel(self, request: web.Request) -> web.Response:
        def channel() -> Json:
            user = self._user_of(request)
            return self._channel_for(user, request.match_info["channel_id"]).to_json()

        return _answer(channel)

    async def _user_channels(self, request: web.Request) -> web.Response:
        """`GET /users/{id}/channels`: every channel of every team the user is a member of."""

        def channels() -> list[Json]:
            user = self._user_of(request)
            if request.match_info["user_id"] not in ("me", user.id):
                raise _ApiError(*_NO_PERMISSION)
            return [c.to_json() for c in self.channels.values() if user.id in c.members]

        return _answer(channels)

    async def _channel_posts(self, request: web.Request) -> web.Response:
        """`GET /channels/{id}/posts`: a page of posts, or with `since` those changed after it.

        With `since` (milliseconds), as the server's `GetPostsSince`: the posts created,
        edited or deleted after it (`update_at > since`, deleted ones included) and the root
        posts of the threads among them, newest first, at most `SINCE_LIMIT`. Without it,
        page `page` (from 0) of `per_page` (default 60, at most 200) live posts, newest first.
        """

        def posts() -> Json:
            user = self._user_of(request)
            channel = self._channel_for(user, request.match_info["channel_id"])
            here = [self._posts[p["id"]] for p in self.posts if p["channel_id"] == channel.id]
            newest_first = sorted(here, key=lambda p: int(p["create_at"]), reverse=True)
            since = request.query.get("since")
            if since is None:
                page = _query_int(request, "page", 0, 10**6)
                per_page = min(_query_int(request, "per_page", 60, 10**6), 200)
                live = [p for p in newest_first if not p["delete_at"]]
                return _post_list(live[page * per_page : (page + 1) * per_page])
            after = _query_int(request, "since", 0, 2**63 - 1)
            changed = [p for p in newest_first if int(p["update_at"]) > after][:SINCE_LIMIT]
            roots = {str(p["root_id"]) for p in changed if p["root_id"]}
            roots -= {str(p["id"]) for p in changed}
            return _post_list(changed + [self._posts[r] for r in sorted(roots)])

        return _answer(posts)

    async def _create_post(self, request: web.Request) -> web.Response:
        body = await _json_body(request)

        def create() -> Json:
            user = self._user_of(request)
            channel_id = body.get("channel_id")
            if not isinstance(channel_id, str):
                raise _ApiError(
                    400,
                    "api.context.invalid_body_param.app_error",
                    "Invalid or missing channel_id in request body.",
                )
            channel = self._channel_for(user, channel_id)
            if user.id not in channel.members:
                raise _ApiError(*_NO_PERMISSION)
            message = body.get("message", "")
            props = body.get("props") or {}
            if not isinstance(message, str) or not isinstance(props, dict):
                raise _ApiError(400, "api.post.create_post.invalid.app_error", "Invalid post.")
            if not message and not body.get("file_ids"):
                raise _ApiError(
                    400,
                    "model.post.is_valid.message_length.app_error",
                    "Post Message property is required.",
                )
            if len(message) > MAX_MESSAGE_RUNES:
                raise _ApiError(400, "model.post.is_valid.msg.app_error", "Invalid Message.")
            root_id = str(body.get("root_id") or "")
            root = self._posts.get(root_id) if root_id else None
            if root_id and (root is None or root["channel_id"] != channel.id or root["root_id"]):
                raise _ApiError(
                    400, "api.post.create_post.root_id.app_error", "Invalid RootId parameter."
                )
            pending = body.get("pending_post_id")
            seen = self._pending.get(pending) if isinstance(pending, str) and pending else None
            if seen is not None and self.clock() - seen[0] < PENDING_POST_TTL:
                return dict(self._posts[seen[1]])
            created = self._create(
                user,
                channel,
                message,
                root_id=root_id,
                props=dict(props),
                pending_post_id=pending if isinstance(pending, str) else "",
            )
            if isinstance(pending, str) and pending:
                self._pending[pending] = (self.clock(), str(created["id"]))
            return created

        return _answer(create, status=201)

    async def _patch_post(self, request: web.Request) -> web.Response:
        body = await _json_body(request)

        def patch() -> Json:
            user = self._user_of(request)
            post = self._posts.get(request.match_info["post_id"])
            if post is None:
                raise _ApiError(404, "app.post.get.app_error", "Unable to get the post.")
            if post["user_id"] != user.id:
                raise _ApiError(*_NO_PERMISSION)
            message, props = body.get("message"), body.get("props")
            if (message is not None and not isinstance(message, str)) or (
                props is not None and not isinstance(props, dict)
            ):
                raise _ApiError(
                    400,
                    "api.context.invalid_body_param.app_error",
                    "Invalid or missing patch in request body.",
                )
            if message is not None and len(message) > MAX_MESSAGE_RUNES:
                raise _ApiError(400, "model.post.is_valid.msg.app_error", "Invalid Message.")
            self._edit(post, message=message, props=props)
            self.edits.append(dict(post))
            return dict(post)

        return _answer(patch)

    @web.middleware
    async def _rate_limit_middleware(
        self, request: web.Request, handler: Handler
    ) -> web.StreamResponse:
        """Mattermost's throttling: every API request of a token spends one from its bucket."""
        broken = self._broken.get(request.path)
        if broken is not None:
            self.calls.append((request.method, request.path, None))
            return web.Response(status=broken[0], text=broken[1], content_type="application/json")
        if self._limit is None or request.path == f"{API}/websocket":
            return await handler(request)
        limit, per_second = self._limit
        key = request.headers.get("Authorization", "")
        now = self.clock()
        bucket = self._buckets.setdefault(key, _Bucket(float(limit), now))
        bucket.tokens = min(float(limit), bucket.tokens + (now - bucket.at) * per_second)
        bucket.at = now
        limited = bucket.tokens < 1
        if not limited:
            bucket.tokens -= 1
        headers = {
            "X-RateLimit-Limit": str(limit),
            "X-RateLimit-Remaining": str(math.floor(bucket.tokens)),
            "X-RateLimit-Reset": str(math.ceil((limit - bucket.tokens) / per_second)),
        }
        if limited:
            self.calls.append((request.method, request.path, None))
            if self._retry_after_header:
                headers["Retry-After"] = str(math.ceil((1 - bucket.tokens) / per_second))
            return web.Response(status=429, text="limit exceeded\n", headers=headers)
        response = await handler(request)
        response.headers.update(headers)
        return response

    # ------------------------------------------------------------------ websocket

    def _conns_of(self, user_id: str) -> list[_Conn]:
        return [c for c in self._conns if c.user_id == user_id and not c.ws.closed]

    def _send_to_channel(self, channel: FakeChannel, event: str, data: Json) -> None:
        broadcast = _broadcast(channel_id=channel.id)
        for conn in self._conns:
            if conn.user_id in channel.members and not conn.ws.closed:
                self._enqueue_event(conn, event, data, broadcast)

    def _enqueue_event(self, conn: _Conn, event: str, data: Json, broadcast: Json) -> None:
        frame = {"event": event, "data": data, "broadcast": broadcast, "seq": conn.seq}
        conn.seq += 1
        conn.outbox.put_nowait(json.dumps(frame))

    async def _authenticated(self, conn: _Conn, user: FakeUser) -> None:
        conn.user_id = user.id
        hello = {"server_version": SERVER_VERSION, "connection_id": conn.connection_id}
        self._enqueue_event(conn, "hello", hello, _broadcast(user_id=user.id))
        async with self._connected:
            self._connected.notify_all()

    async def _websocket(self, request: web.Request) -> web.StreamResponse:
        if self.refuse_websockets:
            return web.Response(status=503, text="websockets refused by the test\n")
        ws = web.WebSocketResponse(autoping=True)
        await ws.prepare(request)
        conn = _Conn(ws, request.transport)
        self._conns.append(conn)
        writer = asyncio.create_task(_write(ws, conn.outbox))
        self._writers.add(writer)
        writer.add_done_callback(self._writers.discard)
        try:
            user = self._header_user(request)
            if user is not None:
                await self._authenticated(conn, user)
            async for frame in ws:
                if frame.type is WSMsgType.TEXT and not await self._on_action(conn, frame.data):
                    await ws.close()
        finally:
            self._conns.remove(conn)
            conn.outbox.put_nowait(None)
            with contextlib.suppress(asyncio.CancelledError):
                await writer
        return ws

    async def _on_action(self, conn: _Conn, text: str) -> bool:
        """Answer one client action; False when the socket is to be closed (a bad challenge)."""
        try:
            request = json.loads(text)
        except ValueError:
            return True
        if not isinstance(request, dict):
            return True
        action, seq, data = request.get("action"), request.get("seq"), request.get("data")
        if not action:
            _reply_error(conn, seq, 400, "api.web_socket_router.no_action.app_error")
        elif not isinstance(seq, int) or seq <= 0:
            _reply_error(conn, seq, 400, "api.web_socket_router.bad_seq.app_error")
        elif action == "authentication_challenge":
            if conn.user_id is None:
                token = data.get("token") if isinstance(data, dict) else None
                user = self._token_user(token)
                if user is None:
                    return False
                await self._authenticated(conn, user)
                _reply_ok(conn, seq)
        elif conn.user_id is None:
            _reply_error(conn, seq, 401, "api.web_socket_router.not_authenticated.app_error")
        elif action == "ping":
            _reply_ok(
                conn,
                seq,
                {"text": "pong", "version": SERVER_VERSION, "server_time": self._millis()},
            )
        else:
            _reply_error(conn, seq, 500, "api.web_socket_router.bad_action.app_error")
        return True


def _broadcast(*, channel_id: str = "", user_id: str = "") -> Json:
    return {
        "omit_users": None,
        "user_id": user_id,
        "channel_id": channel_id,
        "team_id": "",
        "connection_id": "",
        "omit_connection_id": "",
    }


def _reply_ok(conn: _Conn, seq: int, data: Json | None = None) -> None:
    """An OK answer to a client action (`data` only when there is some, as on the server)."""
    reply: Json = {"status": "OK", "seq_reply": seq}
    if data is not None:
        reply["data"] = data
    conn.outbox.put_nowait(json.dumps(reply))


def _reply_error(conn: _Conn, seq: object, status: int, error_id: str) -> None:
    """A FAIL answer to a client action, as the server's websocket router sends it."""
    error = {
        "id": error_id,
        "message": _WS_ERRORS[error_id],
        "detailed_error": "",
        "request_id": "",
        "status_code": status,
    }
    conn.outbox.put_nowait(json.dumps({"status": "FAIL", "seq_reply": seq, "error": error}))


async def _write(ws: web.WebSocketResponse, outbox: asyncio.Queue[str | None]) -> None:
    """Send a connection's queued frames in order until its handler ends."""
    while (text := await outbox.get()) is not None:
        if ws.closed:
            return
        try:
            await ws.send_str(text)
        except ConnectionError:
            return


def _post_list(posts: list[Json]) -> Json:
    """A `PostList` answer of `posts`, in their order."""
    return {
        "order": [p["id"] for p in posts],
        "posts": {p["id"]: dict(p) for p in posts},
        "next_post_id": "",
        "prev_post_id": "",
        "has_next": False,
    }


def _query_int(request: web.Request, name: str, default: int, largest: int) -> int:
    """A whole-number query parameter between 0 and `largest`, else 400 naming it."""
    text = request.query.get(name)
    if text is None:
        return default
    if not (text.isascii() and text.isdigit()) or len(text) > 19 or int(text) > largest:
        raise _ApiError(
            400,
            "api.context.invalid_url_param.app_error",
            f"Invalid or missing {name} parameter in request URL.",
        )
    return int(text)


def _answer(build: Callable[[], Json | list[Json]], *, status: int = 200) -> web.Response:
    try:
        return web.json_response(build(), status=status)
    except _ApiError as exc:
        body = {
            "id": exc.error_id,
            "message": exc.message,
            "detailed_error": "",
            "request_id": new_id(),
            "status_code": exc.status,
        }
        return web.json_response(body, status=exc.status)


async def _json_body(request: web.Request) -> Json:
    try:
        body = await request.json()
    except ValueError:
        body = None
    return body if isinstance(body, dict) else {}
