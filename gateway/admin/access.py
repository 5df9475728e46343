"""Who may call the admin API: the bearer token, or a console session with its CSRF token.

`AdminAccess` decides every admin request of an app (the gateway's, the proxy's) the same
way; `parse_admin_request` and `read_body` read a request's query or JSON body within its
byte limit, validated like the config (unknown fields refused, 400 naming the field).
"""

from __future__ import annotations

import contextlib
import hmac
from dataclasses import dataclass
from typing import Annotated, TypeVar

from aiohttp import web
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    SecretStr,
    ValidationError,
)

from gateway.admin.console.sessions import ConsoleSession, ConsoleSessions
from gateway.app.errors import LoopwardenError
from gateway.app.jsonbody import JsonBodyError, parse_json, read_body
from gateway.config.limits import DEFAULT_SESSION_HOURS
from gateway.config.urls import origin

MAX_ADMIN_BODY_BYTES = 64 * 1024


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


class AdminBody(_Body):
    """The body of an admin route another module adds (the proxy's spend routes)."""


_A = TypeVar("_A", bound=AdminBody)
