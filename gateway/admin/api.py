"""The admin API: `/admin/…` routes behind the bearer token or a console session.

A route that takes a body reads it with `gateway.admin.access.read_body`, under the route's
own byte limit, and parses it with `gateway.app.jsonbody.parse_json`; every route builder
here and in the other admin modules takes the app's one `AdminAccess` and authorises with it.

Decisions where DESIGN.md is silent:
- The admin API lives under `/admin/` and takes `Authorization: Bearer <http.admin_token>`.
  With no admin_token configured it is switched off: every call gets 403
  `{"error": "admin API disabled"}` (an open admin API would let anyone reset budgets).
  A missing or wrong token gets 401 with `WWW-Authenticate: Bearer`. Tokens are compared
  with `hmac.compare_digest`, and never logged.
- A signed-in console (`gateway.admin.console`) calls the same API with its session cookie
  (`lw_console`) instead of the token. A request it sends that is not GET or HEAD must
  also carry the page's `X-CSRF-Token` and, when the browser sends `Origin`, come from
  this server's own origin or `public_url`'s; else 403 `{"error": "csrf"}` and nothing
  changes. Every admin route of an app shares the app's one `AdminAccess`.
- GET calls take `?room=`; POST bodies are JSON objects of at most `MAX_ADMIN_BODY_BYTES`
  (64 KiB; larger is 413), read by `gateway.app.jsonbody.parse_json` (anything it refuses, such
  as deep nesting or a 5,000-digit number, is 400 with its reason). Both are validated like
  the config (unknown fields refused; 400 naming the field). Answers are JSON
  `{"ok": true, "result": <the text the chat command acknowledges with>, ...}`, with the
  structured fields of `AdminAck.data` beside `result` where a route has them; a `set` the
  policy refuses (validated exactly as the chat command, guard policies included) is 422
  `{"ok": false, "error": <why>}` and changes nothing. `pause` takes `seconds` up to 366
  days (`gateway.config.limits`); more, inf or a negative is 400 naming `seconds`. Rooms are room
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
- `GET /admin/circuits` lists the paused LLM-call circuits and rule groups;
  `POST /admin/circuits/reopen {"circuit": …}` lifts one pause (the proxy serves these two
  routes too, behind `proxy.admin_token`).
- A route whose state backend does not answer (Redis down) is 503
  `{"ok": false, "error": "state_unavailable: …"}` with `Retry-After: 10` (the backend is
  tried again within 10 s); nothing is changed or audited, and the next call is served.
- A route may answer a file instead of JSON (`AdminDownload`: the request log's CSV),
  streamed as it is read, with `Content-Disposition: attachment`.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterable, Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

from aiohttp import web
from pydantic import (
    Field,
    model_validator,
)

from gateway.admin.access import (
    _A,
    _B,
    AdminAccess,
    AdminBadRequest,
    AdminCaller,
    AdminRefusal,
    RoomKey,
    _Body,
    parse_admin_request,
)
from gateway.admin.service import AdminAck, AdminService
from gateway.admin.views import audit_json, audit_line
from gateway.app.errors import StateError
from gateway.config.limits import Duration
from gateway.state.base import GLOBAL_SCOPE, AuditEntry, AuditKind, AuditStore

audit_log = logging.getLogger("loopwarden.audit")

STATE_RETRY_AFTER_SECONDS = 10
"""`Retry-After` of a 503 for unreachable state: the backend is tried again within 10 s."""


_AUDITED_COMMAND_CHARS = 200


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


class _AdminApi:
    """The admin routes: authorisation, audit, and a thin mapping onto AdminService."""

    def __init__(self, admin: AdminService, state: AuditStore, access: AdminAccess) -> None:
        self._admin = admin
        self._state = state
        self._access = access

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
            verdict = self._access.verdict(request)
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
                    try:
                        ack = await action(body)
                    except StateError:
                        response = _state_unavailable()
                    else:
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


def _state_unavailable() -> web.Response:
    """503 for a route whose state backend did not answer: nothing changed, ask again later."""
    return web.json_response(
        {"ok": False, "error": "state_unavailable: the state backend is unreachable"},
        status=503,
        headers={"Retry-After": str(STATE_RETRY_AFTER_SECONDS)},
    )


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


def circuit_admin_routes(
    admin: AdminService, state: AuditStore, access: AdminAccess
) -> list[web.RouteDef]:
    """`GET /admin/circuits` and `POST /admin/circuits/reopen`, with auth and audit."""
    return _AdminApi(admin, state, access).circuit_routes()


def audit_admin_routes(
    admin: AdminService, state: AuditStore, access: AdminAccess
) -> list[web.RouteDef]:
    """`GET /admin/audit`, for the proxy's console (the gateway's API has it already)."""
    api = _AdminApi(admin, state, access)
    return [api._route("GET", "/admin/audit", AuditBody, api._read_audit)]


def admin_route(
    admin: AdminService,
    state: AuditStore,
    access: AdminAccess,
    route: tuple[str, str, type[_A], Callable[[_A], Awaitable[AdminAck]]],
) -> web.RouteDef:
    """One more admin route (method, path, body, action), with the API's auth and audit."""
    method, path, model, action = route
    return _AdminApi(admin, state, access)._route(method, path, model, action)


def admin_api_routes(
    admin: AdminService, state: AuditStore, access: AdminAccess
) -> list[web.RouteDef]:
    """The admin API's own routes (status, policy, reset, pause, resume, set, audit…)."""
    return _AdminApi(admin, state, access).routes()
