"""A local fake Slack over real loopback HTTP: the Web API, Socket Mode, Events API delivery.

Web API: `POST /api/<method>` like slack.com/api/, token from `Authorization: Bearer …` (or
a `token` parameter), parameters from the query string, a form or a JSON body; answers
`{"ok": true, …}` or `{"ok": false, "error": …}` as JSON. Methods: `auth.test`,
`chat.postMessage`, `chat.postEphemeral`, `chat.update` (an app changes the text of its own
message; recorded in `updates`, no `message_changed` event is sent) and
`apps.connections.open`, which (for an app-level token) returns a one-time
`ws://127.0.0.1…` URL of the fake's own Socket Mode websocket.

Socket Mode: on connect the fake sends `hello`, then `events_api` / `slash_commands`
envelopes (`envelope_id`, `type`, `accepts_response_payload`, `retry_attempt`,
`retry_reason`, `payload`) and records the acks (`{"envelope_id": …}`) the app sends back.
An app without an app token gets its payloads over the Events API instead: POSTed to its
`events_url`, signed with its signing secret (`sign`), slash commands form-encoded.

Several apps share one fake, each with its own bot token, bot user id and bot id; a channel
lists its member apps. Like Slack, a message posted with chat.postMessage is delivered back as
a `message` event (with `bot_id`, `bot_profile` and the bot's `user`) to every member app of
the channel, the poster included, and a mention of an app's user also sends it `app_mention`;
so two apps can ping-pong. Payloads reach each app in order, one at a time.

Hooks: `message` injects a channel message from a person or an outside bot; `deliver_event`
and `deliver` inject any event or payload; `slash_command`; `redeliver` sends a payload again
with a retry count; `post_event` posts one signed request to an app's Events API URL and
returns the answer; `fail_next_posts(n, retry_after)` answers the next n posts with 429,
`Retry-After` and `ratelimited`, `fail_next_updates(n, retry_after)` the next n
chat.update calls, and `refuse_next_updates(n)` answers them `cant_update_message`;
`text_of(channel, ts)` is a message's text now; `drop_connections` closes (or aborts) an
app's websockets; `send_disconnect` sends Slack's `disconnect` message; `on_post` sees
every posted message.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import io
import itertools
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any
from urllib.parse import parse_qsl, urlencode

import aiohttp
from aiohttp import WSCloseCode, WSMsgType, web

from tests.fakes.loopback import serve_loopback

Json = dict[str, Any]
TEAM_ID = "T0FAKE"


def sign(secret: str, body: str | bytes, timestamp: int | None = None) -> dict[str, str]:
    """The `X-Slack-Request-Timestamp` and `X-Slack-Signature` headers Slack would send."""
    stamp = str(int(time.time()) if timestamp is None else timestamp)
    raw = body.encode() if isinstance(body, str) else body
    digest = hmac.new(secret.encode(), f"v0:{stamp}:".encode() + raw, hashlib.sha256).hexdigest()
    return {"X-Slack-Request-Timestamp": stamp, "X-Slack-Signature": f"v0={digest}"}


@dataclass(frozen=True, slots=True)
class FakeUser:
    """A person, or a bot the gateway does not host (then with a `bot_id`)."""

    id: str
    name: str
    bot_id: str | None = None


@dataclass(slots=True)
class FakeApp:
    """One Slack app on the fake: its tokens, identity, transport and delivery queue."""

    name: str
    bot_token: str
    user_id: str
    bot_id: str
    app_id: str
    app_token: str | None = None
    signing_secret: str | None = None
    events_url: str | None = None
    sockets: list[web.WebSocketResponse] = field(default_factory=list)
    connections: int = 0
    acks: list[str] = field(default_factory=list)
    envelopes: list[Json] = field(default_factory=list)
    http_answers: list[int] = field(default_factory=list)
    outbox: asyncio.Queue[_Delivery] = field(default_factory=asyncio.Queue)
    in_flight: int = 0
    socket_open: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def user(self) -> FakeUser:
        """The app's bot user, as other apps see it."""
        return FakeUser(self.user_id, self.name, self.bot_id)


@dataclass(frozen=True, slots=True)
class Posted:
    """One message an app posted (`ephemeral_to` set for chat.postEphemeral)."""

    app: str
    channel: str
    text: str
    ts: str
    thread_ts: str | None
    ephemeral_to: str | None
    at: float


@dataclass(frozen=True, slots=True)
class Updated:
    """One chat.update that changed a message."""

    app: str
    channel: str
    ts: str
    text: str


@dataclass(frozen=True, slots=True)
class _Delivery:
    """A payload on its way to an app: an Events API payload or a slash command."""

    payload: Json
    kind: str = "events_api"
    retry_attempt: int = 0
    retry_reason: str = ""


class _ApiError(Exception):
    def __init__(self, error: str, status: int = 200, headers: Mapping[str, str] | None = None):
        super().__init__(error)
        self.error = error
        self.status = status
        self.headers = dict(headers or {})


class SlackFake:
    """The fake Slack workspace: apps, channels, the Web API and both event transports."""

    def __init__(self) -> None:
        self.apps: dict[str, FakeApp] = {}
        self.channels: dict[str, tuple[str, list[str]]] = {}
        self.posted: list[Posted] = []
        self.post_attempts = 0
        self.updates: list[Updated] = []
        self.update_attempts = 0
        self.calls: list[tuple[str, str | None]] = []
        self.on_post: Callable[[Posted], None] | None = None
        self._fail_posts: list[float] = []
        self._fail_updates: list[float] = []
        self._refuse_updates = 0
        self._texts: dict[tuple[str, str], tuple[str, str]] = {}  # (channel, ts) → (app, text)
        self._tickets: dict[str, FakeApp] = {}
        self._authors: dict[tuple[str, str], str] = {}
        self._ts = itertools.count(1)
        self._ids = itertools.count(1)
        self._workers: list[asyncio.Task[None]] = []
        self._aborts: dict[int, asyncio.Transport] = {}
        app = web.Application()
        app.router.add_post("/api/{method}", self._api)
        app.router.add_get("/link/", self._socket)
        self._runner = web.AppRunner(app)
        self._client: aiohttp.ClientSession | None = None
        self.port = 0

    async def __aenter__(self) -> SlackFake:
        self.port = await serve_loopback(self._runner)
        self._client = aiohttp.ClientSession()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for worker in self._workers:
            worker.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        if self._client is not None:
            await self._client.close()
        await self._runner.cleanup()

    @property
    def base_url(self) -> str:
        """The Web API root to configure as `api_base_url`."""
        return f"http://127.0.0.1:{self.port}/api/"

    # ------------------------------------------------------------------ set-up

    def add_app(
        self,
        name: str,
        *,
        bot_token: str,
        user_id: str,
        bot_id: str,
        app_token: str | None = None,
        signing_secret: str | None = None,
    ) -> FakeApp:
        """Register an app: Socket Mode with an app token, else the Events API."""
        app = FakeApp(
            name=name,
            bot_token=bot_token,
            user_id=user_id,
            bot_id=bot_id,
            app_id=f"A{bot_id[1:]}",
            app_token=app_token,
            signing_secret=signing_secret,
        )
        self.apps[name] = app
        self._workers.append(asyncio.create_task(self._deliver_forever(app)))
        return app

    def add_channel(self, channel: str, *apps: str, channel_type: str = "channel") -> None:
        """A channel (`channel`, `group` or `im`) and the apps that are members of it."""
        self.channels[channel] = (channel_type, list(apps))

    # ------------------------------------------------------------------ injection

    def message(
        self,
        channel: str,
        sender: FakeUser,
        text: str,
        *,
        thread_ts: str | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> str:
        """A message in a channel from a person or an outside bot, delivered like Slack; its ts."""
        ts = self._next_ts()
        event = self._message_event(channel, sender, text, ts, thread_ts)
        event.update(extra or {})
        self._broadcast(channel, event, poster=None)
        return ts

    def deliver_event(self, app: str, event: Mapping[str, Any], *, retry_attempt: int = 0) -> Json:
        """Wrap an event in an event_callback for `app` and deliver it; the payload."""
        payload = self.event_callback(app, event)
        self.deliver(app, payload, retry_attempt=retry_attempt)
        return payload

    def event_callback(self, app: str, event: Mapping[str, Any]) -> Json:
        """The event_callback payload Slack sends `app` for `event`."""
        target = self.apps[app]
        return {
            "token": "verification-token-unused",
            "team_id": TEAM_ID,
            "api_app_id": target.app_id,
            "event": dict(event),
            "type": "event_callback",
            "event_id": f"Ev{next(self._ids):08d}",
            "event_time": int(time.time()),
            "authorizations": [
                {
                    "enterprise_id": None,
                    "team_id": TEAM_ID,
                    "user_id": target.user_id,
                    "is_bot": True,
                    "is_enterprise_install": False,
                }
            ],
            "is_ext_shared_channel": False,
        }

    def deliver(
        self,
        app: str,
        payload: Mapping[str, Any],
        *,
        kind: str = "events_api",
        retry_attempt: int = 0,
        retry_reason: str = "",
    ) -> None:
        """Queue any payload for `app` (an envelope of `kind` in Socket Mode)."""
        target = self.apps[app]
        target.in_flight += 1
        target.outbox.put_nowait(_Delivery(dict(payload), kind, retry_attempt, retry_reason))

    def redeliver(self, app: str, payload: Mapping[str, Any], *, attempt: int = 1) -> None:
        """Send a payload again, as Slack retries one that was not acknowledged in time."""
        self.deliver(app, payload, retry_attempt=attempt, retry_reason="timeout")

    def slash_command(self, app: str, channel: str, user: FakeUser, text: str) -> Json:
        """The `/loop` slash command typed by `user` in `channel`, delivered to `app`."""
        target = self.apps[app]
        payload = {
            "token": "verification-token-unused",
            "team_id": TEAM_ID,
            "team_domain": "fake",
            "channel_id": channel,
            "channel_name": "directmessage" if channel.startswith("D") else "general",
            "user_id": user.id,
            "user_name": user.name,
            "command": "/loop",
            "text": text,
            "api_app_id": target.app_id,
            "is_enterprise_install": "false",
            "response_url": f"http://127.0.0.1:{self.port}/respond",
            "trigger_id": f"{next(self._ids)}.{TEAM_ID}.trigger",
        }
        self.deliver(app, payload, kind="slash_commands")
        return payload

    async def post_event(
        self,
        app: str,
        body: str | bytes | Mapping[str, Any],
        *,
        secret: str | None = None,
        timestamp: int | None = None,
        retry_num: int | None = None,
        signed: bool = True,
        content_type: str = "application/json",
    ) -> tuple[int, str]:
        """POST one request to an Events API app right now (bytes as they are); (status, body)."""
        target = self.apps[app]
        assert target.events_url is not None, f"{app} has no events_url yet"
        assert self._client is not None
        text = body if isinstance(body, str | bytes) else json.dumps(body)
        raw = text.encode() if isinstance(text, str) else text
        headers = {"Content-Type": content_type}
        if signed:
            headers.update(sign(secret or target.signing_secret or "", raw, timestamp))
        if retry_num is not None:
            headers["X-Slack-Retry-Num"] = str(retry_num)
            headers["X-Slack-Retry-Reason"] = "http_timeout"
        # A stream, so a body over a megabyte does not make aiohttp warn about the event loop.
        async with self._client.post(
            target.events_url, data=io.BytesIO(raw), headers=headers
        ) as answer:
            return answer.status, await answer.text()

    def fail_next_posts(self, count: int, *, retry_after: float = 1) -> None:
        """Answer the next `count` posts with 429, `Retry-After` and `ratelimited`."""
        self._fail_posts.extend([retry_after] * count)

    def fail_next_updates(self, count: int, *, retry_after: float = 1) -> None:
        """Answer the next `count` chat.update calls with 429, `Retry-After` and `ratelimited`."""
        self._fail_updates.extend([retry_after] * count)

    def refuse_next_updates(self, count: int) -> None:
        """Answer the next `count` chat.update calls with `cant_update_message`."""
        self._refuse_updates += count

    def text_of(self, channel: str, ts: str) -> str:
        """The text of a posted message now, with its updates."""
        return self._texts[(channel, ts)][1]

    async def drop_connections(self, app: str, *, abrupt: bool = False) -> None:
        """Close the app's websockets (a close frame), or cut them without one."""
        for ws in list(self.apps[app].sockets):
            transport = self._aborts.get(id(ws))
            if abrupt and transport is not None:
                transport.abort()
            else:
                await ws.close(code=WSCloseCode.GOING_AWAY, message=b"dropped by the fake")

    async def send_disconnect(self, app: str, reason: str = "refresh_requested") -> None:
        """Slack's `disconnect` message: the app is to open a new connection."""
        for ws in list(self.apps[app].sockets):
            await ws.send_json(
                {"type": "disconnect", "reason": reason, "debug_info": {"host": "fake"}}
            )

    async def send_raw(self, app: str, text: str) -> None:
        """Any text frame on the app's open websockets (junk, unknown envelope types)."""
        for ws in list(self.apps[app].sockets):
            await ws.send_str(text)

    # ------------------------------------------------------------------ queries

    def pending(self, app: str) -> bool:
        """True while payloads for `app` are queued, in flight or (Socket Mode) unacked."""
        target = self.apps[app]
        unacked = len(target.envelopes) - len(target.acks) if target.app_token else 0
        return target.in_flight > 0 or unacked > 0

    def texts(self, app: str | None = None) -> list[str]:
        """The texts posted (by one app, when given), in order."""
        return [p.text for p in self.posted if app is None or p.app == app]

    # ------------------------------------------------------------------ delivery

    async def _deliver_forever(self, app: FakeApp) -> None:
        while True:
            delivery = await app.outbox.get()
            try:
                if app.app_token is not None:
                    await self._send_envelope(app, delivery)
                elif app.events_url is not None:
                    await self._post_delivery(app, delivery)
            finally:
                app.in_flight -= 1

    async def _send_envelope(self, app: FakeApp, delivery: _Delivery) -> None:
        envelope = {
            "envelope_id": f"env-{next(self._ids):08d}",
            "type": delivery.kind,
            "accepts_response_payload": delivery.kind != "events_api",
            "retry_attempt": delivery.retry_attempt,
            "retry_reason": delivery.retry_reason,
            "payload": delivery.payload,
        }
        while True:
            await app.socket_open.wait()
            ws = app.sockets[-1] if app.sockets else None
            if ws is None or ws.closed:
                await asyncio.sleep(0.01)
                continue
            try:
                await ws.send_json(envelope)
            except ConnectionError:
                await asyncio.sleep(0.01)
                continue
            app.envelopes.append(envelope)
            return

    async def _post_delivery(self, app: FakeApp, delivery: _Delivery) -> None:
        if delivery.kind == "slash_commands":
            body = urlencode(delivery.payload)
            content_type = "application/x-www-form-urlencoded"
        else:
            body, content_type = json.dumps(delivery.payload), "application/json"
        try:
            status, _ = await self.post_event(
                app.name,
                body,
                retry_num=delivery.retry_attempt or None,
                content_type=content_type,
            )
        except aiohttp.ClientError:
            status = 0
        app.http_answers.append(status)

    def _broadcast(self, channel: str, event: Json, *, poster: FakeApp | None) -> None:
        """Deliver a message event to every member app, plus app_mention to mentioned ones."""
        _, members = self.channels.get(channel, ("channel", []))
        for name in members:
            app = self.apps[name]
            self.deliver_event(name, event)
            if f"<@{app.user_id}>" in event.get("text", "") and app is not poster:
                mention = {k: v for k, v in event.items() if k != "channel_type"}
                mention["type"] = "app_mention"
                self.deliver_event(name, mention)

    def _message_event(
        self, channel: str, sender: FakeUser, text: str, ts: str, thread_ts: str | None
    ) -> Json:
        channel_type = self.channels.get(channel, ("channel", []))[0]
        event: Json = {
            "type": "message",
            "channel": channel,
            "user": sender.id,
            "text": text,
            "ts": ts,
            "event_ts": ts,
            "channel_type": channel_type,
        }
        if sender.bot_id is not None:
            event["bot_id"] = sender.bot_id
            event["app_id"] = f"A{sender.bot_id[1:]}"
            event["bot_profile"] = {
                "id": sender.bot_id,
                "name": sender.name,
                "app_id": f"A{sender.bot_id[1:]}",
                "team_id": TEAM_ID,
                "deleted": False,
            }
        else:
            event["client_msg_id"] = f"msg-{next(self._ids)}"
            event["team"] = TEAM_ID
        if thread_ts is not None:
            event["thread_ts"] = thread_ts
            parent = self._authors.get((channel, thread_ts))
            if parent is not None:
                event["parent_user_id"] = parent
        self._authors[(channel, ts)] = sender.id
        return event

    def _next_ts(self) -> str:
        n = next(self._ts)
        return f"{1_700_000_000 + n}.{n:06d}"

    # ------------------------------------------------------------------ Web API

    async def _api(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        params: Json = dict(request.query)
        if request.can_read_body:
            raw = await request.text()
            if request.content_type == "application/json":
                params.update(json.loads(raw or "{}"))
            else:
                params.update(parse_qsl(raw))
        token = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        token = token or str(params.get("token", ""))
        handlers = {
            "auth.test": self._auth_test,
            "apps.connections.open": self._connections_open,
            "chat.postMessage": self._post_message,
            "chat.postEphemeral": self._post_ephemeral,
            "chat.update": self._update,
        }
        handler = handlers.get(method, self._unknown_method)
        try:
            result = handler(token, params)
        except _ApiError as exc:
            return web.json_response(
                {"ok": False, "error": exc.error}, status=exc.status, headers=exc.headers
            )
        return web.json_response({"ok": True, **result})

    def _unknown_method(self, token: str, params: Json) -> Json:
        raise _ApiError("unknown_method", 404)

    def _app_by_bot_token(self, token: str, method: str) -> FakeApp:
        for app in self.apps.values():
            if token and token == app.bot_token:
                self.calls.append((method, app.name))
                return app
        self.calls.append((method, None))
        raise _ApiError("invalid_auth")

    def _auth_test(self, token: str, params: Json) -> Json:
        app = self._app_by_bot_token(token, "auth.test")
        return {
            "url": "https://fake.slack.com/",
            "team": "Fake",
            "user": app.name,
            "team_id": TEAM_ID,
            "user_id": app.user_id,
            "bot_id": app.bot_id,
            "is_enterprise_install": False,
        }

    def _connections_open(self, token: str, params: Json) -> Json:
        for app in self.apps.values():
            if token and token == app.app_token:
                self.calls.append(("apps.connections.open", app.name))
                ticket = f"ticket-{next(self._ids)}"
                self._tickets[ticket] = app
                return {"url": f"ws://127.0.0.1:{self.port}/link/?ticket={ticket}"}
        self.calls.append(("apps.connections.open", None))
        raise _ApiError("invalid_auth")

    def _check_post(self, app: FakeApp, channel: str, text: str) -> None:
        self.post_attempts += 1
        if self._fail_posts:
            retry_after = self._fail_posts.pop(0)
            raise _ApiError("ratelimited", 429, {"Retry-After": f"{retry_after:g}"})
        if channel not in self.channels:
            raise _ApiError("channel_not_found")
        if app.name not in self.channels[channel][1]:
            raise _ApiError("not_in_channel")
        if not text:
            raise _ApiError("no_text")

    def _post_message(self, token: str, params: Json) -> Json:
        app = self._app_by_bot_token(token, "chat.postMessage")
        channel, text = str(params.get("channel", "")), str(params.get("text") or "")
        self._check_post(app, channel, text)
        thread_ts = params.get("thread_ts") or None
        ts = self._next_ts()
        posted = Posted(app.name, channel, text, ts, thread_ts, None, time.monotonic())
        self.posted.append(posted)
        self._texts[(channel, ts)] = (app.name, text)
        event = self._message_event(channel, app.user, text, ts, thread_ts)
        self._broadcast(channel, event, poster=app)
        if self.on_post is not None:
            self.on_post(posted)
        message = {k: v for k, v in event.items() if k not in ("channel", "event_ts")}
        return {"channel": channel, "ts": ts, "message": message}

    def _update(self, token: str, params: Json) -> Json:
        app = self._app_by_bot_token(token, "chat.update")
        self.update_attempts += 1
        if self._fail_updates:
            retry_after = self._fail_updates.pop(0)
            raise _ApiError("ratelimited", 429, {"Retry-After": f"{retry_after:g}"})
        channel, ts = str(params.get("channel", "")), str(params.get("ts", ""))
        text = str(params.get("text") or "")
        author, _ = self._texts.get((channel, ts), ("", ""))
        if author != app.name:
            raise _ApiError("message_not_found")
        if self._refuse_updates:
            self._refuse_updates -= 1
            raise _ApiError("cant_update_message")
        if not text:
            raise _ApiError("no_text")
        self._texts[(channel, ts)] = (app.name, text)
        self.updates.append(Updated(app.name, channel, ts, text))
        return {"channel": channel, "ts": ts, "text": text}

    def _post_ephemeral(self, token: str, params: Json) -> Json:
        app = self._app_by_bot_token(token, "chat.postEphemeral")
        channel, text = str(params.get("channel", "")), str(params.get("text") or "")
        self._check_post(app, channel, text)
        user = str(params.get("user", ""))
        if not user:
            raise _ApiError("user_not_in_channel")
        ts = self._next_ts()
        posted = Posted(
            app.name, channel, text, ts, params.get("thread_ts") or None, user, time.monotonic()
        )
        self.posted.append(posted)
        if self.on_post is not None:
            self.on_post(posted)
        return {"message_ts": ts}

    # ------------------------------------------------------------------ Socket Mode

    async def _socket(self, request: web.Request) -> web.StreamResponse:
        app = self._tickets.pop(request.query.get("ticket", ""), None)
        if app is None:
            return web.Response(status=401, text="unknown or used ticket")
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        if request.transport is not None:
            self._aborts[id(ws)] = request.transport
        app.sockets.append(ws)
        app.connections += 1
        await ws.send_json(
            {
                "type": "hello",
                "num_connections": len(app.sockets),
                "debug_info": {"host": "fake-applink", "approximate_connection_time": 3600},
                "connection_info": {"app_id": app.app_id},
            }
        )
        app.socket_open.set()
        try:
            async for frame in ws:
                if frame.type != WSMsgType.TEXT:
                    continue
                data = json.loads(frame.data)
                if isinstance(data, dict) and "envelope_id" in data:
                    app.acks.append(str(data["envelope_id"]))
        finally:
            app.sockets.remove(ws)
            self._aborts.pop(id(ws), None)
            if not app.sockets:
                app.socket_open.clear()
        return ws
