"""The console's routes on the gateway's or the proxy's aiohttp app: sign-in, pages, files.

`add_console(app, access=..., product=...)` adds `GET /console` (and
`/console/`: the first page, or the sign-in form), `GET|POST /console/login`,
`POST /console/logout`, `GET /console/<page>` for each page whose script ships
(`gateway.admin.console.pages`) and `GET /console/static/<file>`. The pages are frames: each
page's script reads the JSON admin API (`/admin/...`) with the session cookie and the
page's CSRF token (`gateway.app.http.AdminAccess`), and builds its DOM with `textContent`
only (`static/console.js`), so a room name holding `<script>` is shown as text.

Decisions where DESIGN.md is silent:
- Sign-in: `POST /console/login` takes the form field `token` (at most
  `MAX_LOGIN_BODY_BYTES`, else 413; not UTF-8 or not one `token` field, 400), compared in
  constant time. Success is a 303 to `/console/` with the cookie `lw_console` (HttpOnly,
  SameSite=Strict, Path=/, Max-Age = the session's hours; Secure when `public_url` is
  https). A wrong token is a 401 with the form again, its field empty. Before its body is
  read, a form another site sent is refused (403, uncounted) and the attempt is counted
  by the per-address limiter (`ConsoleSessions.limiter`), whose refusal is a 429 with
  Retry-After; so at most its limit of attempts sent at once are read and compared
  (`gateway.admin.console.signin`).
- `GET /console/login?code=…` redeems a one-time code (the demo's, or `loopwarden
  console-link`'s) the same way and 303s to `/console/`, so the code leaves the address
  bar; `Referrer-Policy: no-referrer` keeps it out of any Referer. A right code signs in
  even while its address is locked out: that is the way back in. Wrong codes count with
  wrong tokens in the limiter.
- A page asked for without a live session 303s to `/console/`, which shows the form.
- Any other `GET /console/...` (a page this product does not list, a mistyped address)
  answers 404 in the console's own frame, with its bar of pages and a line saying there
  is no such page; without a session it 303s to the form like a page. Static files that
  do not exist stay a bare 404: they are not pages.
- `POST /console/logout` is a plain form (no script needed) carrying the CSRF token as
  the field `csrf`; it ends the session server-side, clears the cookie and 303s to
  `/console/`. Without the session or the token it is a 403 and nothing ends. Its
  `Origin` may be `null` (what a browser sends for a form under no-referrer); any other
  origin than ours is refused.
- Without an admin token every `/console` URL answers 403 with a page naming the setting
  that turns it on (`http.admin_token`, `proxy.admin_token`).
- Static files are served from a table built at start from the files in the package
  (`gateway/admin/console/static`, and uPlot from `gateway/static`): a path that is not a key
  of that table, or that arrives percent-encoded at all, is a 404, so no `../`,
  `%2e%2e`, encoded slash, backslash, NUL or absolute path reaches the file system.
- Every `/console` and `/admin` response carries the security headers below; pages and
  JSON are `Cache-Control: no-store`, static files `no-cache`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from urllib.parse import parse_qs

import aiohttp_jinja2
import jinja2
from aiohttp import web

from gateway.admin.access import SESSION_COOKIE, AdminAccess
from gateway.admin.console import messages
from gateway.admin.console.clients import ClientAddresses
from gateway.admin.console.links import LinkFolderError
from gateway.admin.console.pages import (
    NOT_FOUND,
    PAGES,
    ConsolePage,
    Product,
    shipped,
    static_files,
)
from gateway.admin.console.sessions import Admission, ConsoleSession
from gateway.admin.console.signin import FORM, LINK, SignInGate
from gateway.app.jsonbody import read_body
from gateway.state.base import AuditStore

log = logging.getLogger("loopwarden.console")

MAX_LOGIN_BODY_BYTES = 16 * 1024

SECURITY_HEADERS: Mapping[str, str] = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_TEMPLATES: web.AppKey[jinja2.Environment] = web.AppKey("loopwarden_console_templates")
_CONTENT_TYPES = {
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".txt": "text/plain; charset=utf-8",
}
_PRODUCT_NAMES: Mapping[Product, str] = {"gateway": "gateway", "proxy": "LLM-call proxy"}
# The setting that turns each product's console on, as the disabled page names it.
_TOKEN_SETTINGS: Mapping[Product, str] = {
    "gateway": "http.admin_token",
    "proxy": "proxy.admin_token",
}


@dataclass(frozen=True, slots=True)
class _File:
    body: bytes
    content_type: str


def add_console(
    app: web.Application,
    *,
    access: AdminAccess,
    product: Product,
    state: AuditStore,
    trusted_proxies: Sequence[str] = (),
) -> None:
    """Add the console's routes to `app` (call before it starts).

    `access` is the app's AdminAccess with the console's sessions; the product's `PAGES`
    whose script ships are listed. Sign-in attempts go into `state`'s audit log, counted
    per client address, which `trusted_proxies` (`http.trusted_proxies`) may name.
    """
    env = aiohttp_jinja2.setup(
        app,
        app_key=_TEMPLATES,
        loader=jinja2.PackageLoader("gateway.admin.console", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        default_helpers=False,
    )
    env.globals["product"] = _PRODUCT_NAMES[product]
    app.on_response_prepare.append(_security_headers)
    if not access.enabled:
        app.router.add_route("*", "/console{tail:.*}", _disabled(_TOKEN_SETTINGS[product]))
        return
    gate = SignInGate(access, state, ClientAddresses.trusting(trusted_proxies))
    console = _Console(access, shipped(PAGES[product]), gate)
    links = access.sessions.links
    if links is not None:
        app.on_startup.append(lambda _: _prepare(links.prepare))
    app.router.add_get("/console", console.index)
    app.router.add_get("/console/", console.index)
    app.router.add_get("/console/login", console.login_page)
    app.router.add_post("/console/login", console.login)
    app.router.add_post("/console/logout", console.logout)
    app.router.add_get("/console/static/{path:.*}", _static(_static_table()))
    for page in console.pages:
        app.router.add_get(f"/console/{page.slug}", console.page_handler(page))
    app.router.add_get("/console/{tail:.*}", console.not_found)


class _Console:
    """The sign-in, sign-out and page handlers of one app's console."""

    def __init__(
        self, access: AdminAccess, pages: tuple[ConsolePage, ...], gate: SignInGate
    ) -> None:
        self._access = access
        self._sessions = access.sessions
        self._gate = gate
        self.pages = pages
        self._secure = (access.public_url or "").startswith("https://")

    async def index(self, request: web.Request) -> web.StreamResponse:
        """The first page when signed in, else the sign-in form."""
        session = self._access.session(request)
        if session is None:
            return _login_form(request)
        return _frame(request, self.pages, self.pages[0], session)

    def page_handler(self, page: ConsolePage) -> Handler:
        """The handler of one page's frame."""

        async def handle(request: web.Request) -> web.StreamResponse:
            session = self._access.session(request)
            if session is None:
                return _see_other()
            return _frame(request, self.pages, page, session)

        return handle

    async def not_found(self, request: web.Request) -> web.StreamResponse:
        """A 404 in the console's frame for an address that is not one of its pages."""
        session = self._access.session(request)
        if session is None:
            return _see_other()
        context = {
            "pages": self.pages,
            "page": NOT_FOUND,
            "csrf": session.csrf,
            "path": request.path,
        }
        return aiohttp_jinja2.render_template(
            "notfound.html", request, context, app_key=_TEMPLATES, status=404
        )

    async def login_page(self, request: web.Request) -> web.StreamResponse:
        """The form; with `?code=` the one-time code's redemption."""
        code = request.query.get("code")
        if code is None:
            if self._access.session(request) is not None:
                return _see_other()
            return _login_form(request)
        gate = self._gate
        address = gate.client(request)
        # Redeemed before the limiter is asked: a right code is the way past a lockout.
        session = self._sessions.redeem(code)
        if session is not None:
            await gate.signed_in(address, LINK)
            return self._signed_in(session)
        if gate.another_site(request, navigation=True):
            await gate.cross_site(address, LINK)
            return _login_form(request, messages.BAD_CODE, status=401)
        admission = self._sessions.limiter.admit(address)
        if admission.wait is not None:
            return await self._too_many(request, address, LINK, admission)
        await gate.failed(address, LINK, "bad_code", admission.attempts)
        return _login_form(request, messages.BAD_CODE, status=401)

    async def login(self, request: web.Request) -> web.StreamResponse:
        """Check the typed admin token; a session on success, the empty form again if not.

        Another site's form is refused and every other attempt counted before the body
        is read, so attempts sent at once cannot all be compared.
        """
        gate = self._gate
        address = gate.client(request)
        if gate.another_site(request):
            await gate.cross_site(address, FORM)
            return _login_form(request, messages.CROSS_SITE, status=403)
        admission = self._sessions.limiter.admit(address)
        if admission.wait is not None:
            return await self._too_many(request, address, FORM, admission)
        body = await read_body(request, MAX_LOGIN_BODY_BYTES)
        token = None if body is None else _form_field(body, "token")
        if body is None:
            outcome, status = "too_large", 413
            error = messages.TOO_LARGE.format(limit=MAX_LOGIN_BODY_BYTES)
        elif token is None:
            outcome, status, error = "unreadable", 400, messages.UNREADABLE
        elif not self._access.token_matches(token):
            outcome, status, error = "wrong_token", 401, messages.WRONG_TOKEN
        else:
            self._sessions.limiter.forgive(address, admission)
            await gate.signed_in(address, FORM)
            return self._signed_in(self._sessions.start())
        await gate.failed(address, FORM, outcome, admission.attempts)
        return _login_form(request, error, status=status)

    async def _too_many(
        self, request: web.Request, address: str, command: str, admission: Admission
    ) -> web.Response:
        """The 429 of a locked-out address (the lockout reported at its first refusal)."""
        seconds = admission.wait or 1
        if admission.lockout:
            await self._gate.locked_out(address, command, seconds)
        response = _login_form(request, messages.TOO_MANY.format(seconds=seconds), status=429)
        response.headers["Retry-After"] = str(seconds)
        return response

    async def logout(self, request: web.Request) -> web.StreamResponse:
        """End the session server-side (CSRF token required) and clear the cookie."""
        session = self._access.session(request)
        body = await read_body(request, MAX_LOGIN_BODY_BYTES)
        csrf = _form_field(body, "csrf") if body is not None else None
        if (
            session is None
            or csrf is None
            or not self._access.csrf_ok(request, session, csrf, form=True)
        ):
            return web.json_response({"error": "csrf"}, status=403)
        self._sessions.end(session.id)
        response = _see_other()
        response.del_cookie(SESSION_COOKIE, path="/")
        return response

    def _signed_in(self, session: ConsoleSession) -> web.StreamResponse:
        response = _see_other()
        response.set_cookie(
            SESSION_COOKIE,
            session.id,
            max_age=self._sessions.max_age,
            path="/",
            secure=self._secure,
            httponly=True,
            samesite="Strict",
        )
        return response


def _see_other() -> web.Response:
    """A 303 to the console's first page (after sign-in, sign-out, or without a session)."""
    return web.Response(status=303, headers={"Location": "/console/"})


def _frame(
    request: web.Request,
    pages: tuple[ConsolePage, ...],
    page: ConsolePage,
    session: ConsoleSession,
) -> web.Response:
    context = {"pages": pages, "page": page, "csrf": session.csrf}
    return aiohttp_jinja2.render_template("base.html", request, context, app_key=_TEMPLATES)


def _login_form(
    request: web.Request, error: str | None = None, *, status: int = 200
) -> web.Response:
    return aiohttp_jinja2.render_template(
        "login.html", request, {"error": error}, app_key=_TEMPLATES, status=status
    )


async def _prepare(make_folder: Callable[[], None]) -> None:
    """Make the folder of `loopwarden console-link`'s links at start, off the event loop.

    A folder that cannot be made or trusted costs only those links, not the server.
    """
    try:
        await asyncio.to_thread(make_folder)
    except (LinkFolderError, OSError) as exc:
        log.warning("console: loopwarden console-link will not work here: %s", exc)


def _form_field(body: bytes, name: str) -> str | None:
    """The one value of `name` in a URL-encoded form; None when the form is not readable."""
    try:
        fields = parse_qs(
            body.decode("utf-8"), keep_blank_values=True, strict_parsing=False, max_num_fields=8
        )
    except (UnicodeDecodeError, ValueError):
        return None
    values = fields.get(name, [])
    return values[0] if len(values) == 1 else None


def _disabled(token_setting: str) -> Handler:
    async def handle(request: web.Request) -> web.StreamResponse:
        return aiohttp_jinja2.render_template(
            "disabled.html",
            request,
            {"setting": token_setting},
            app_key=_TEMPLATES,
            status=403,
        )

    return handle


def _static_table() -> dict[str, _File]:
    """Every file the console serves, by its path under /console/static/."""
    shared = resources.files("gateway") / "static"
    table: dict[str, _File] = {}
    for root in (static_files(), shared):
        for path, file in _walk(root, ""):
            content_type = _CONTENT_TYPES.get(path[path.rfind(".") :])
            if content_type is not None:
                table[path] = _File(file.read_bytes(), content_type)
    return table


def _walk(folder: Traversable, prefix: str) -> Iterator[tuple[str, Traversable]]:
    for entry in folder.iterdir():
        if entry.is_dir():
            yield from _walk(entry, f"{prefix}{entry.name}/")
        elif entry.is_file():
            yield f"{prefix}{entry.name}", entry


def _static(table: Mapping[str, _File]) -> Handler:
    async def handle(request: web.Request) -> web.StreamResponse:
        # Shipped names need no escaping: anything percent-encoded is not one of them.
        found = None if "%" in request.rel_url.raw_path else table.get(request.match_info["path"])
        if found is None:
            raise web.HTTPNotFound
        return web.Response(
            body=found.body,
            headers={"Content-Type": found.content_type, "Cache-Control": "no-cache"},
        )

    return handle


async def _security_headers(request: web.Request, response: web.StreamResponse) -> None:
    """The console's headers on every /console and /admin answer (errors included)."""
    if not request.path.startswith(("/console", "/admin/")):
        return
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)
    response.headers.setdefault("Cache-Control", "no-store")
