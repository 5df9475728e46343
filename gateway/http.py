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
- A signed-in console (`gateway.console`) calls the same API with its session cookie
  (`lw_console`) instead of the token. A request it sends that is not GET or HEAD must
  also carry the page's `X-CSRF-Token` and, when the browser sends `Origin`, come from
  this server's own origin or `public_url`'s; else 403 `{"error": "csrf"}` and nothing
  changes. Every admin route of an app shares the app's one `AdminAccess`
  (`app[ADMIN_ACCESS]`), whether it was built with it or with the bare token.
- GET calls take `?room=`; POST bodies are JSON objects of at most `MAX_ADMIN_BODY_BYTES`
  (64 KiB; larger is 413), read by `gateway.jsonbody.parse_json` (anything it refuses, such
  as deep nesting or a 5,000-digit number, is 400 with its reason). Both are validated like
  the config (unknown fields refused; 400 naming the field). Answers are JSON
  `{"ok": true, "result": <the text the chat command acknowledges with>, ...}`, with the
  structured fields of `AdminAck.data` beside `result` where a route has them; a `set` the
  policy refuses (validated exactly as the chat command, guard policies included) is 422
  `{"ok": false, "error": <why>}` and changes nothing. `pause` takes `seconds` up to 366
  days (`gateway.limits`); more, inf or a negative is 400 naming `seconds`. Rooms are room
  keys, `platform:channel` (e.g. `discord:1100123`), validated as `RoomKey` on every
  route that takes one (at most 256 characters, all printable): else 400 naming `room`.
- Every admin call, allowed or not, is logged on the `loopwarden.audit` logger with its
  method, path, room, peer address and status. Authorised calls also go into the state
  store's audit log like chat commands (platform `http`, user `admin-api`; from the
  console: platform `console`, user `console`, the peer address as the name, and only
  its state-changing calls, as its pages poll the reads); refused ones do not, so an
  unauthenticated client cannot flood it, except a console request refused for its CSRF
  token: the session shows who sent it, and it is stored refused (outcome `csrf`) in the
  audit trail's `others` log (gateway/state/audit.py), which never pushes out an admin's
  entry. `GET /admin/audit` reads the `admin` log; `?kind=others` the others, `all` both.
- No per-request access log (probes would flood it); admin calls are audit-logged instead.
- `GET /admin/circuits` lists the paused LLM-call circuits and rule groups;
  `POST /admin/circuits/reopen {"circuit": …}` lifts one pause (the proxy serves these two
  routes too, behind `proxy.admin_token`).
- A route may answer a file instead of JSON (`AdminDownload`: the request log's CSV),
  streamed as it is read, with `Content-Disposition: attachment`.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import time
from collections.abc import AsyncIterable, Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Literal, TypeVar

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
from gateway.adminviews import audit_json, audit_line
from gateway.console.sessions import DEFAULT_SESSION_HOURS, ConsoleSession, ConsoleSessions
from gateway.console.urls import origin
from gateway.errors import LoopwardenError
from gateway.jsonbody import JsonBodyError, parse_json
from gateway.limits import Duration
from gateway.metrics import Metrics
from gateway.state.base import GLOBAL_SCOPE, AuditEntry, AuditKind, StateStore

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


MAX_ROOM_CHARS = 256


def room_key_problem(value: str) -> str | None:
    """Why `value` is not a room key the admin API acts on, or None when it is one.

    At most `MAX_ROOM_CHARS` characters, every one printable (no control character, line
    break, bidi control, zero-width or non-ASCII space), `platform:channel`.
    """
    if len(value) > MAX_ROOM_CHARS:
        return f"must be at most {MAX_ROOM_CHARS} characters, got {len(value):,}"
    if not value.isprintable():
        return "must not hold control, line-break or invisible characters"
    platform, _, channel = value.partition(":")
    if not platform or not channel:
        return "must be a room key, platform:channel (e.g. discord:1100123)"
    return None


def _room_key(value: str) -> str:
    problem = room_key_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


RoomKey = Annotated[str, AfterValidator(_room_key)]
"""A room of an admin route's query or body: every route validates it as this."""


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
    """Read the newest audit entries of one log (`kind`, or `all`), of one room or of all."""

    room: RoomKey | None = None
    limit: int = Field(default=20, ge=1, le=1000)
    kind: AuditKind | Literal["all"] = "admin"


class NoBody(_Body):
    """A request that takes no fields (`GET /admin/circuits`)."""


class CircuitBody(_Body):
    """A request about one LLM-call circuit or rule group (`reopen`)."""

    circuit: str = Field(min_length=1)


_B = TypeVar("_B", bound=_Body)


class AdminBadRequest(LoopwardenError):
    """The request is malformed; the reason is safe to return to the caller with `status`."""

    def __init__(self, reason: str, status: int = 400) -> None:
        super().__init__(reason)
        self.status = status


SESSION_COOKIE = "lw_console"
"""The console's session cookie: the id of a server-side `ConsoleSession`, nothing more."""

CSRF_HEADER = "X-CSRF-Token"


@dataclass(frozen=True, slots=True)
class AdminCaller:
    """Who an admin request comes from, as the state store's audit log records it."""

    platform: str
    user_id: str
    session: ConsoleSession | None = None


BEARER_CALLER = AdminCaller("http", "admin-api")


@dataclass(frozen=True, slots=True)
class AdminRefusal:
    """The answer refusing an admin request, and who sent it when that is known."""

    response: web.Response
    caller: AdminCaller | None = None


class AdminAccess:
    """Who may call the admin API: the `admin_token`, or a console session with its CSRF token.

    With no token configured, nobody. `public_url` is where browsers reach this server, an
    `Origin` accepted beside the request's own.
    """

    def __init__(
        self,
        token: SecretStr | None,
        sessions: ConsoleSessions | None = None,
        *,
        public_url: str | None = None,
    ) -> None:
        self._token = token.get_secret_value().encode() if token is not None else None
        # Without the console's own (a bare app in a test), one nobody signs in to.
        self.sessions = sessions or ConsoleSessions(hours=DEFAULT_SESSION_HOURS)
        self.public_url = public_url

    @property
    def enabled(self) -> bool:
        """True when an admin token is configured (the API and the console are on)."""
        return self._token is not None

    def token_matches(self, presented: str) -> bool:
        """True when `presented` is the admin token (compared in constant time)."""
        return self._token is not None and hmac.compare_digest(_utf8(presented), self._token)

    def session(self, request: web.Request) -> ConsoleSession | None:
        """The live console session whose cookie the request carries, if any."""
        if self._token is None:
            return None
        return self.sessions.get(request.cookies.get(SESSION_COOKIE))

    def verdict(self, request: web.Request) -> AdminCaller | AdminRefusal:
        """Who the request is authorised as, or its refusal (403 disabled or csrf, 401)."""
        if self._token is None:
            return AdminRefusal(web.json_response({"error": "admin API disabled"}, status=403))
        scheme, _, presented = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() == "bearer" and self.token_matches(presented.strip()):
            return BEARER_CALLER
        session = self.session(request)
        if session is None:
            return AdminRefusal(
                web.json_response(
                    {"error": "unauthorized"}, status=401, headers={"WWW-Authenticate": "Bearer"}
                )
            )
        caller = AdminCaller("console", "console", session)
        if request.method in ("GET", "HEAD") or self.csrf_ok(
            request, session, request.headers.get(CSRF_HEADER, "")
        ):
            return caller
        return AdminRefusal(web.json_response({"error": "csrf"}, status=403), caller)

    def denied(self, request: web.Request) -> web.Response | None:
        """None when the request may call the admin API; else the 403/401 answer to give."""
        verdict = self.verdict(request)
        return verdict.response if isinstance(verdict, AdminRefusal) else None

    def csrf_ok(
        self, request: web.Request, session: ConsoleSession, presented: str, *, form: bool = False
    ) -> bool:
        """The session's CSRF token, and (when the browser says) a request from our origin.

        `form`: a plain form of the console's own page, which under the console's
        `Referrer-Policy: no-referrer` a browser posts with `Origin: null`.
        """
        if not hmac.compare_digest(_utf8(presented), session.csrf.encode()):
            return False
        return self.origin_ok(request, form=form)

    def origin_ok(self, request: web.Request, *, form: bool = False) -> bool:
        """True unless the browser says (`Origin`) the request comes from another origin.

        `form`: `Origin: null` is accepted too (see `csrf_ok`).
        """
        sent = request.headers.get("Origin")
        if sent is None or (form and sent == "null"):
            return True
        return sent.lower() in self._origins(request)

    def _origins(self, request: web.Request) -> set[str]:
        """This server's origin as the request reached it, and `public_url`'s."""
        origins = {origin(self.public_url)} if self.public_url else set()
        with contextlib.suppress(ValueError):  # a Host header that is no host[:port]
            origins.add(origin(f"{request.scheme}://{request.host}"))
        return origins


ADMIN_ACCESS: web.AppKey[AdminAccess] = web.AppKey("loopwarden_admin_access")
"""The app's one AdminAccess, shared by every admin route and the console."""


def _utf8(text: str) -> bytes:
    # A header may hold what no token holds (lone surrogates): such text never matches.
    return text.encode("utf-8", "replace")


class _AdminApi:
    """The admin routes: authorisation, audit, and a thin mapping onto AdminService."""

    def __init__(
        self, admin: AdminService, state: StateStore, access: SecretStr | AdminAccess | None
    ) -> None:
        self._admin = admin
        self._state = state
        self._access = access if isinstance(access, AdminAccess) else AdminAccess(access)

    def routes(self) -> list[web.RouteDef]:
        """The admin API's routes, each wrapped in authorisation and audit."""
        admin = self._admin
        return [
            self._route("GET", "/admin/status", RoomBody, lambda b: admin.status_ack(b.room)),
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
            self._route("GET", "/admin/circuits", NoBody, lambda b: admin.circuits()),
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
            # The app's AdminAccess decides (it knows the console's sessions); a route on an
            # app without one (a test's bare app) has its own.
            verdict = request.app.get(ADMIN_ACCESS, self._access).verdict(request)
            if isinstance(verdict, AdminRefusal):
                response = verdict.response
                if verdict.caller is not None:
                    await self._refused(request, verdict.caller)
            else:
                try:
                    body = await parse_admin_request(request, model)
                except AdminBadRequest as exc:
                    response = web.json_response(
                        {"ok": False, "error": str(exc)}, status=exc.status
                    )
                else:
                    room = getattr(body, "room", None) or GLOBAL_SCOPE
                    ack = await action(body)
                    response = _answer(ack)
                    # A console's pages poll their reads: only its changes are stored.
                    if verdict.session is None or request.method not in ("GET", "HEAD"):
                        await self._audit(request, room, body, ack, verdict)
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
        kind = None if body.kind == "all" else body.kind
        entries = await self._state.recent_audit(body.limit, body.room, kind)
        return AdminAck(
            "\n".join(audit_line(e) for e in entries) or "no audit entries",
            data={"entries": [audit_json(e) for e in entries]},
        )

    async def _audit(
        self, request: web.Request, room: str, body: _Body, ack: AdminAck, caller: AdminCaller
    ) -> None:
        """The same audit trail as chat commands, in the state store (shared by replicas)."""
        command = f"{request.method} {request.path} {body.model_dump_json(exclude_defaults=True)}"
        outcome = "done" if ack.ok else "rejected"
        await self._record(request, caller, room, command, allowed=True, outcome=outcome)

    async def _refused(self, request: web.Request, caller: AdminCaller) -> None:
        """A known caller's refused attempt: a console request without its CSRF token."""
        command = f"{request.method} {request.path}"
        await self._record(request, caller, GLOBAL_SCOPE, command, allowed=False, outcome="csrf")

    async def _record(
        self,
        request: web.Request,
        caller: AdminCaller,
        room: str,
        command: str,
        *,
        allowed: bool,
        outcome: str,
    ) -> None:
        """One audit entry for an admin-API caller: who, from where, and the command, cut short."""
        await self._state.audit(
            AuditEntry(
                at=time.time(),
                platform=caller.platform,
                room=room,
                user_id=caller.user_id,
                user_name=str(request.remote),
                command=command[:_AUDITED_COMMAND_CHARS],
                allowed=allowed,
                outcome=outcome,
            )
        )


async def _ack(text: Awaitable[str]) -> AdminAck:
    return AdminAck(await text)


@dataclass(frozen=True, slots=True, kw_only=True)
class AdminDownload(AdminAck):
    """An admin answer that is a file (the request log's CSV), streamed as it is read."""

    chunks: AsyncIterable[bytes]
    filename: str
    content_type: str


def _answer(ack: AdminAck) -> web.Response:
    if isinstance(ack, AdminDownload):
        headers = {
            "Content-Type": ack.content_type,
            "Content-Disposition": f"attachment; filename={ack.filename}",
        }
        return web.Response(body=ack.chunks, headers=headers)
    extra = dict(ack.data or {})
    if ack.ok:
        return web.json_response({"ok": True, "result": ack.text, **extra})
    return web.json_response({"ok": False, "error": ack.text, **extra}, status=422)


async def parse_admin_request(request: web.Request, model: type[_B]) -> _B:
    """Validate the query (GET) or JSON body (POST) against `model`; problems are a 400."""
    if request.method == "GET":
        data: object = dict(request.query)
    else:
        body = await read_body(request, MAX_ADMIN_BODY_BYTES)
        if body is None:
            raise AdminBadRequest(f"the body is larger than {MAX_ADMIN_BODY_BYTES} bytes", 413)
        try:
            data = parse_json(body)
        except JsonBodyError as exc:
            raise AdminBadRequest(f"the body must be a JSON object: {exc}") from None
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        error = exc.errors(include_url=False, include_input=False)[0]
        where = ".".join(str(part) for part in error["loc"])
        reason = "required" if error["type"] == "missing" else str(error["msg"])
        reason = reason.removeprefix("Value error, ")
        raise AdminBadRequest(f"{where}: {reason}" if where else reason) from None


async def read_body(request: web.Request, max_bytes: int) -> bytes | None:
    """The request body, or None as soon as it is longer than `max_bytes` (a 413 to answer)."""
    try:
        # A clone reads the same stream under its own limit: the application has one limit
        # for all routes, and the admin API takes far less than a webhook.
        return await request.clone(client_max_size=max_bytes).read()
    except web.HTTPRequestEntityTooLarge:
        return None


def circuit_admin_routes(
    admin: AdminService, state: StateStore, access: SecretStr | AdminAccess | None
) -> list[web.RouteDef]:
    """`GET /admin/circuits` and `POST /admin/circuits/reopen`, with auth and audit."""
    return _AdminApi(admin, state, access).circuit_routes()


def audit_admin_routes(
    admin: AdminService, state: StateStore, access: SecretStr | AdminAccess | None
) -> list[web.RouteDef]:
    """`GET /admin/audit`, for the proxy's console (the gateway's API has it already)."""
    api = _AdminApi(admin, state, access)
    return [api._route("GET", "/admin/audit", AuditBody, api._read_audit)]


class AdminBody(_Body):
    """The body of an admin route another module adds (the proxy's spend routes)."""


_A = TypeVar("_A", bound=AdminBody)


def admin_route(
    admin: AdminService,
    state: StateStore,
    access: SecretStr | AdminAccess | None,
    route: tuple[str, str, type[_A], Callable[[_A], Awaitable[AdminAck]]],
) -> web.RouteDef:
    """One more admin route (method, path, body, action), with the API's auth and audit.

    On an app with an `ADMIN_ACCESS` (the gateway's, the proxy's), that one authorises the
    route whatever `access` says; the token form is kept for callers that have no other.
    """
    method, path, model, action = route
    return _AdminApi(admin, state, access)._route(method, path, model, action)


def create_app(
    *,
    readiness: Callable[[], Readiness],
    metrics: Metrics,
    admin: AdminService,
    state: StateStore,
    admin_token: SecretStr | AdminAccess | None,
) -> web.Application:
    """The gateway's aiohttp application, before connectors add their webhook routes."""
    access = admin_token if isinstance(admin_token, AdminAccess) else AdminAccess(admin_token)

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
    app[ADMIN_ACCESS] = access
    app.add_routes(
        [web.get("/healthz", healthz), web.get("/readyz", readyz), web.get("/metrics", prometheus)]
    )
    app.add_routes(_AdminApi(admin, state, access).routes())
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
