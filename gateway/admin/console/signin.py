"""What the console makes of a sign-in attempt: whose, whether another site sent it, its report.

The handlers (`gateway.admin.console.app`) ask `SignInGate` whose attempt a request is and
whether it came from another site before they count it, and tell it how each attempt
ended; it logs and audits.

Decisions where DESIGN.md is silent:
- Another site: `POST /console/login` is refused (403, the form again) when the browser
  says another site sent it: `Sec-Fetch-Site` other than `same-origin` or `none` (so
  `same-site` too: a sibling host is another application), or an `Origin` other than this
  server's own or `public_url`'s (`null` is accepted: it is what a browser sends for the
  console's own form under `Referrer-Policy: no-referrer`). It is decided from the headers,
  before the body is read, and not counted against the limiter, so no page can lock the
  operator out through their own browser. A wrong one-time code sent from another site is
  not counted either; a right one still signs in (a link clicked in a chat or a mail is a
  cross-site navigation).
- Every failed attempt (a wrong token or code, a form that is unreadable or too large) is
  logged on `loopwarden.console` at WARNING with the client's address and the attempts
  counted, and stored in the audit log: platform `console`, user `console`, the address as
  the name, the command `POST /console/login` or `GET /console/login?code`, refused, with
  the outcome `wrong_token`, `bad_code`, `unreadable` or `too_large`. A lockout is
  reported once, at the first attempt it refuses (`locked_out`, with the seconds left); a
  refusal for another site at most once a minute per address (`cross_site`); a sign-in at
  INFO, stored allowed (`signed_in`). No token or code text is in either.
- When the state backend cannot store an entry the attempt is answered all the same and
  the failure logged: the operator may be signing in to see to that backend.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from aiohttp import web

from gateway.admin.access import AdminAccess
from gateway.admin.console.clients import ClientAddresses
from gateway.admin.console.sessions import SignInLimiter
from gateway.app.errors import StateError
from gateway.state.base import GLOBAL_SCOPE, AuditEntry, AuditStore

log = logging.getLogger("loopwarden.console")

FORM = "POST /console/login"
LINK = "GET /console/login?code"
_SAME_SITE = frozenset({"same-origin", "none"})
_PLATFORM = "console"


class SignInGate:
    """Whose sign-in attempt a request is, whether another site sent it, and its reports."""

    def __init__(
        self,
        access: AdminAccess,
        state: AuditStore,
        clients: ClientAddresses,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._access = access
        self._state = state
        self._clients = clients
        self._clock = clock
        # One report a minute per address of refusals nobody counts (another site's).
        self._cross_site_reports = SignInLimiter(attempts=1)

    def client(self, request: web.Request) -> str:
        """The address the limiter counts the request under (`gateway.admin.console.clients`)."""
        headers = request.headers
        return self._clients.client(
            request.remote, headers.getall("X-Forwarded-For", []), headers.getall("Forwarded", [])
        )

    def another_site(self, request: web.Request, *, navigation: bool = False) -> bool:
        """True when the browser says another site sent the request.

        `navigation`: a GET the address bar or a link makes, which carries no `Origin`.
        """
        fetched_from = request.headers.get("Sec-Fetch-Site")
        if fetched_from is not None and fetched_from.lower() not in _SAME_SITE:
            return True
        return not navigation and not self._access.origin_ok(request, form=True)

    async def failed(self, address: str, command: str, outcome: str, attempts: int) -> None:
        """A counted attempt that did not sign in."""
        log.warning(
            "console sign-in refused (%s) from %s: attempt %d of %d this minute",
            outcome,
            address,
            attempts,
            self._limit,
        )
        await self._audit(address, command, allowed=False, outcome=outcome)

    async def locked_out(self, address: str, command: str, wait: int) -> None:
        """The first attempt a lockout refuses."""
        log.warning(
            "console sign-in locked for %s: %d attempts within a minute, %d s left",
            address,
            self._limit,
            wait,
        )
        await self._audit(address, command, allowed=False, outcome="locked_out")

    async def cross_site(self, address: str, command: str) -> None:
        """An attempt another site sent (reported at most once a minute per address)."""
        if self._cross_site_reports.admit(address).wait is not None:
            return
        log.warning("console sign-in from another site refused for %s (not counted)", address)
        await self._audit(address, command, allowed=False, outcome="cross_site")

    async def signed_in(self, address: str, command: str) -> None:
        """A sign-in, by the token or a one-time link."""
        log.info("console sign-in from %s (%s)", address, command)
        await self._audit(address, command, allowed=True, outcome="signed_in")

    @property
    def _limit(self) -> int:
        return self._access.sessions.limiter.attempts

    async def _audit(self, address: str, command: str, *, allowed: bool, outcome: str) -> None:
        entry = AuditEntry(
            at=self._clock(),
            platform=_PLATFORM,
            room=GLOBAL_SCOPE,
            user_id=_PLATFORM,
            user_name=address,
            command=command,
            allowed=allowed,
            outcome=outcome,
        )
        try:
            await self._state.audit(entry)
        except StateError as exc:
            log.warning("console sign-in not in the audit log: %s", exc)
