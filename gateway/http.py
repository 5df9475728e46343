"""The gateway's own HTTP server: health, readiness, metrics and the admin API.

Connectors add their webhook routes (Slack Events API, Telegram webhook) and the demo room
its page to the same application before it starts; this module owns the rest. A route
that takes a body reads it with `read_body`, under the route's own byte limit, and parses
it with `gateway.jsonbody.parse_json`.

Decisions where DESIGN.md is silent:
- `/readyz` answers JSON either way: `{"ready": true}` or, with 503,
  `{"ready": false, "stopping": …, "not_connected": [bot ids]}`; with no bots configured
  the gateway is ready as soon as it is up. While stopping it is never ready, so a load
  balancer drains it.
- The admin API lives under `/admin/` and takes `Authorization: Bearer <http.admin_token>`.
  With no admin_token configured it is switched off: every call gets 403
  `{"error": "admin API disabled"}` (an open admin API would let anyone reset budgets).
  A missing or wrong token gets 401 with `WWW-Authenticate: Bearer`. Tokens are compared
  with `hmac.compare_digest`, and never logged.
- GET calls take `?room=`; POST bodies are JSON objects of at most `MAX_ADMIN_BODY_BYTES`
  (64 KiB; larger is 413), read by `gateway.jsonbody.parse_json` (anything it refuses, such
  as deep nesting or a 5,000-digit number, is 400 with its reason). Both are validated like
  the config (unknown fields refused; 400 naming the field). Answers are JSON
  `{"ok": true, "result": <the text the chat command acknowledges with>, ...}`, with the
  structured fields of `AdminAck.data` beside `result` where a route has them; a `set` the
  policy refuses (validated exactly as the chat command, guard policies included) is 422
  `{"ok": false, "error": <why>}` and changes nothing. `pause` takes `seconds` up to 366
  days (`gateway.limits`); more, inf or a negative is 400 naming `seconds`. Rooms are room
  keys, `platform:channel` (e.g. `discord:1100123`).
- Every admin call, allowed or not, is logged on the `loopwarden.audit` logger with its
  method, path, room, peer address and status. Authorised calls also go into the state
  store's audit log like chat commands (platform `http`, user `admin-api`); refused ones
  do not, so an unauthenticated client cannot flood it.
- No per-request access log (probes would flood it); admin calls are audit-logged instead.
- `GET /admin/circuits` lists the paused LLM-call circuits and rule groups;
  `POST /admin/circuits/reopen {"circuit": …}` lifts one pause (the proxy serves these two
  routes too, behind `proxy.admin_token`).
"""

from __future__ import annotations

import hmac
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, TypeVar

from aiohttp import web
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    model_validator,
)

from gateway.admin import AdminAck, AdminService
from gateway.errors import LoopwardenError
from gateway.jsonbody import JsonBodyError, parse_json
from gateway.limits import Duration
from gateway.metrics import Metrics
from gateway.state.base import GLOBAL_SCOPE, AuditEntry, StateStore

audit_log = logging.getLogger("loopwarden.audit")

MAX_ADMIN_BODY_BYTES = 64 * 1024
_AUDITED_COMMAND_CHARS = 200


@dataclass(frozen=True, slots=True)
class Readiness:
    """Whether the gateway takes traffic: up, not stopping, and every bot connected."""

    stopping: bool
    not_connected: tuple[str, ...]

    @property
    def ready(self) -> bool:
        """True when traffic may be routed here."""
        return not self.stopping and not self.not_connected


def _room_key(value: str) -> str:
    platform, _, channel = value.partition(":")
    if not platform or not channel:
        raise ValueError("must be a room key, platform:channel (e.g. discord:1100123)")
    return value


RoomKey = Annotated[str, AfterValidator(_room_key)]


class _Body(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class RoomBody(_Body):
    """A request about one room (`status`, `policy`, `resume`)."""

    room: RoomKey


class ResetBody(_Body):
    """Reset one room's pairs, every pair (`all`), or one bot's pairs."""

    room: RoomKey | None = None
    all: bool = False
    bot: str | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> ResetBody:
        chosen = sum((self.room is not None, self.all, self.bot is not None))
        if chosen != 1:
            raise ValueError("give exactly one of room, all: true, or bot")
        return self


class PauseBody(RoomBody):
    """Pause a room, for `seconds` (at most 366 days) or, without it, until resumed."""

    seconds: Duration | None = Field(default=None, gt=0)


class SetBody(RoomBody):
    """Set one runtime policy field of a room (`bot_loop.max_events_per_window`)."""

    field: str
    value: str | int | float | bool


class AuditBody(_Body):
    """Read the newest audit entries, of one room or of all."""

    room: RoomKey | None = None
    limit: int = Field(default=20, ge=1, le=1000)


class NoBody(_Body):
    """A request that takes no fields (`GET /admin/circuits`)."""


class CircuitBody(_Body):
    """A request about one LLM-call circuit or rule group (`reopen`)."""

    circuit: str = Field(min_length=1)


_B = TypeVar("_B", bound=_Body)


class _BadRequest(LoopwardenError):
    """The request is malformed; the reason is safe to return to the caller with `status`."""

    def __init__(self, reason: str, status: int = 400) -> None:
        super().__init__(reason)
        self.status = status


class AdminAccess:
    """Who may call the admin API: the bearer `admin_token`; with none configured, nobody."""

    def __init__(self, token: SecretStr | None) -> None:
        self._token = token.get_secret_value().encode() if token is not None else None

    def denied(self, request: web.Request) -> web.Response | None:
        """None when the bearer token matches; else the 403/401 answer to give."""
        if self._token is None:
            return web.json_response({"error": "admin API disabled"}, status=403)
        scheme, _, presented = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(
            presented.strip().encode(), self._token
        ):
            return None
        return web.json_response(
            {"error": "unauthorized"}, status=401, headers={"WWW-Authenticate": "Bearer"}
        )


class _AdminApi:
    """The admin routes: authorisation, audit, and a thin mapping onto AdminService."""

    def __init__(self, admin: AdminService, state: StateStore, token: SecretStr | None) -> None:
        self._admin = admin
        self._state = state
        self._access = AdminAccess(token)

    def routes(self) -> list[web.RouteDef]:
        """The admin API's routes, each wrapped in authorisation and audit."""
        admin = self._admin
        return [
            self._route("GET", "/admin/status", RoomBody, lambda b: _ack(admin.status(b.room))),
            self._route("GET", "/admin/policy", RoomBody, lambda b: _ack(admin.policy(b.room))),
            self._route("POST", "/admin/reset", ResetBody, self._reset),
            self._route(
                "POST", "/admin/pause", PauseBody, lambda b: _ack(admin.pause(b.room, b.seconds))
            ),
            self._route("POST", "/admin/resume", RoomBody, lambda b: _ack(admin.resume(b.room))),
            self._route("POST", "/admin/set", SetBody, self._set),
            self._route("GET", "/admin/audit", AuditBody, self._read_audit),
            *self.circuit_routes(),
        ]

    def circuit_routes(self) -> list[web.RouteDef]:
        """The LLM-call circuit routes (also all the proxy's admin API serves)."""
        admin = self._admin
        return [
            self._route("GET", "/admin/circuits", NoBody, lambda b: _ack(admin.circuits())),
            self._route(
                "POST",
                "/admin/circuits/reopen",
                CircuitBody,
                lambda b: admin.reopen_circuit(b.circuit),
            ),
        ]

    def _route(
        self,
        method: str,
        path: str,
        model: type[_B],
        action: Callable[[_B], Awaitable[AdminAck]],
    ) -> web.RouteDef:
        async def handle(request: web.Request) -> web.Response:
            room = GLOBAL_SCOPE
            response = self._access.denied(request)
            if response is None:
                try:
                    body = await _parse(request, model)
                except _BadRequest as exc:
                    response = web.json_response(
                        {"ok": False, "error": str(exc)}, status=exc.status
                    )
                else:
                    room = getattr(body, "room", None) or GLOBAL_SCOPE
                    ack = await action(body)
                    response = _answer(ack)
                    await self._audit(request, room, body, ack)
            audit_log.info(
                "admin api %s %s room=%s peer=%s status=%d",
                request.method,
                request.path,
                room,
                request.remote,
                response.status,
            )
            return response

        return web.route(method, path, handle)

    async def _reset(self, body: ResetBody) -> AdminAck:
        if body.all:
            return AdminAck(await self._admin.reset_all())
        if body.bot is not None:
            return AdminAck(await self._admin.reset_bot(body.bot))
        return AdminAck(await self._admin.reset(str(body.room)))

    async def _set(self, body: SetBody) -> AdminAck:
        # `run` (not `set`) keeps the verdict: a refused value is a 422, not a 200.
        value = body.value if isinstance(body.value, str) else json.dumps(body.value)
        return await self._admin.run(body.room, ["set", body.field, value])

    async def _read_audit(self, body: AuditBody) -> AdminAck:
        """The newest audit entries, one line each, newest first."""
        entries = await self._state.recent_audit(body.limit, body.room)
        return AdminAck("\n".join(_audit_line(e) for e in entries) or "no audit entries")

    async def _audit(self, request: web.Request, room: str, body: _Body, ack: AdminAck) -> None:
        """The same audit trail as chat commands, in the state store (shared by replicas)."""
        command = f"{request.method} {request.path} {body.model_dump_json(exclude_defaults=True)}"
        await self._state.audit(
            AuditEntry(
                at=time.time(),
                platform="http",
                room=room,
                user_id="admin-api",
                user_name=str(request.remote),
                command=command[:_AUDITED_COMMAND_CHARS],
                allowed=True,
                outcome="done" if ack.ok else "rejected",
            )
        )


def _audit_line(entry: AuditEntry) -> str:
    """`2026-11-30T10:00:00Z discord:1100 1234 (alice) allowed done: /loop reset`."""
    at = datetime.fromtimestamp(entry.at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    verdict = "allowed" if entry.allowed else "refused"
    who = f"{entry.user_id} ({entry.user_name})" if entry.user_name else entry.user_id
    return f"{at} {entry.room} {who} {verdict} {entry.outcome}: {entry.command}"


async def _ack(text: Awaitable[str]) -> AdminAck:
    return AdminAck(await text)


def _answer(ack: AdminAck) -> web.Response:
    extra = dict(ack.data or {})
    if ack.ok:
        return web.json_response({"ok": True, "result": ack.text, **extra})
    return web.json_response({"ok": False, "error": ack.text, **extra}, status=422)


async def _parse(request: web.Request, model: type[_B]) -> _B:
    """Validate the query (GET) or JSON body (POST) against `model`; problems are a 400."""
    if request.method == "GET":
        data: object = dict(request.query)
    else:
        body = await read_body(request, MAX_ADMIN_BODY_BYTES)
        if body is None:
            raise _BadRequest(f"the body is larger than {MAX_ADMIN_BODY_BYTES} bytes", 413)
        try:
            data = parse_json(body)
        except JsonBodyError as exc:
            raise _BadRequest(f"the body must be a JSON object: {exc}") from None
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        error = exc.errors(include_url=False, include_input=False)[0]
        where = ".".join(str(part) for part in error["loc"])
        reason = "required" if error["type"] == "missing" else str(error["msg"])
        reason = reason.removeprefix("Value error, ")
        raise _BadRequest(f"{where}: {reason}" if where else reason) from None


async def read_body(request: web.Request, max_bytes: int) -> bytes | None:
    """The request body, or None as soon as it is longer than `max_bytes` (a 413 to answer)."""
    try:
        # A clone reads the same stream under its own limit: the application has one limit
        # for all routes, and the admin API takes far less than a webhook.
        return await request.clone(client_max_size=max_bytes).read()
    except web.HTTPRequestEntityTooLarge:
        return None


def circuit_admin_routes(
    admin: AdminService, state: StateStore, token: SecretStr | None
) -> list[web.RouteDef]:
    """`GET /admin/circuits` and `POST /admin/circuits/reopen`, with auth and audit."""
    return _AdminApi(admin, state, token).circuit_routes()


class AdminBody(_Body):
    """The body of an admin route another module adds (the proxy's spend routes)."""


_A = TypeVar("_A", bound=AdminBody)


def admin_route(
    admin: AdminService,
    state: StateStore,
    token: SecretStr | None,
    route: tuple[str, str, type[_A], Callable[[_A], Awaitable[AdminAck]]],
) -> web.RouteDef:
    """One more admin route (method, path, body, action), with the API's auth and audit."""
    method, path, model, action = route
    return _AdminApi(admin, state, token)._route(method, path, model, action)


def create_app(
    *,
    readiness: Callable[[], Readiness],
    metrics: Metrics,
    admin: AdminService,
    state: StateStore,
    admin_token: SecretStr | None,
) -> web.Application:
    """The gateway's aiohttp application, before connectors add their webhook routes."""

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def readyz(request: web.Request) -> web.Response:
        state = readiness()
        if state.ready:
            return web.json_response({"ready": True})
        body = {
            "ready": False,
            "stopping": state.stopping,
            "not_connected": list(state.not_connected),
        }
        return web.json_response(body, status=503)

    async def prometheus(request: web.Request) -> web.Response:
        return web.Response(body=metrics.render(), headers={"Content-Type": metrics.content_type})

    app = web.Application()
    app.add_routes(
        [web.get("/healthz", healthz), web.get("/readyz", readyz), web.get("/metrics", prometheus)]
    )
    app.add_routes(_AdminApi(admin, state, admin_token).routes())
    return app


class HttpServer:
    """Runs an application on host:port; port 0 picks a free port, exposed as `port`."""

    def __init__(
        self, app: web.Application, host: str, port: int, *, shutdown_timeout: float = 2.0
    ) -> None:
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=shutdown_timeout)
        self._host = host
        self._port = port

    @property
    def port(self) -> int:
        """The bound port (the configured one until started)."""
        return self._port

    async def start(self) -> None:
        """Bind and serve; the application's router is frozen from here on."""
        await self._runner.setup()
        await web.TCPSite(self._runner, self._host, self._port).start()
        address = self._runner.addresses[0]
        self._port = int(address[1])

    async def aclose(self) -> None:
        """Stop serving and release the socket."""
        await self._runner.cleanup()
