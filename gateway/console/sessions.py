"""Who is signed in to the console: server-side sessions, one-time sign-in codes, a limiter.

A session is an id the browser holds in the `lw_console` cookie and a CSRF token the page
holds in its `<meta name="csrf-token">`; both are `secrets.token_urlsafe(32)`. Nothing
about a session is in the cookie itself, so logging out ends it for good: the server
forgets the id, and replaying the old cookie is refused.

Decisions where DESIGN.md is silent:
- Sessions, codes and the limiter live in this process's memory. With several replicas
  behind a load balancer, route a browser to one replica (sticky sessions) or sign in to
  each; a restart signs everyone out. What the pages show still comes from the shared
  state backend, so every replica shows the same.
- At most `MAX_SESSIONS` sessions and `MAX_CODES` unredeemed codes are kept; a new one
  evicts the oldest, so no client can grow them without bound.
- A session lasts `hours` from sign-in (not from its last use): the cookie's Max-Age says
  the same, so browser and server agree on when it ends.
- The limiter counts wrong tokens and wrong codes per peer address (`request.remote`; a
  forwarded-for header is not trusted, a client could write any address there). Ten in a
  minute block every attempt from that address until the minute that began with the
  first of the ten is over. At most `MAX_ADDRESSES` addresses are tracked, the oldest
  forgotten first.
"""

from __future__ import annotations

import math
import secrets
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass

DEFAULT_SESSION_HOURS = 12.0
MAX_SESSIONS = 1_000
MAX_CODES = 100
MAX_ADDRESSES = 10_000
SIGN_IN_ATTEMPTS = 10
SIGN_IN_WINDOW = 60.0
CODE_TTL = 300.0


@dataclass(frozen=True, slots=True)
class ConsoleSession:
    """One signed-in browser: its cookie id, its CSRF token, and when it ends."""

    id: str
    csrf: str
    expires: float


class SignInLimiter:
    """Refuses sign-in attempts from an address after too many wrong ones within a minute."""

    def __init__(
        self,
        *,
        attempts: int = SIGN_IN_ATTEMPTS,
        window: float = SIGN_IN_WINDOW,
        clock: Callable[[], float] = time.monotonic,
        max_addresses: int = MAX_ADDRESSES,
    ) -> None:
        self._attempts = attempts
        self._window = window
        self._clock = clock
        self._max = max_addresses
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()

    def retry_after(self, address: str) -> int | None:
        """Whole seconds until `address` may try again, or None when it may try now."""
        failures = self._failures.get(address)
        if failures is None or len(failures) < self._attempts:
            return None
        left = failures[0] + self._window - self._clock()
        if left <= 0:
            del self._failures[address]
            return None
        return max(1, math.ceil(left))

    def failed(self, address: str) -> None:
        """Count one wrong token or code from `address`."""
        now = self._clock()
        failures = self._failures.pop(address, None) or deque(maxlen=self._attempts)
        while failures and failures[0] + self._window <= now:
            failures.popleft()
        failures.append(now)
        self._failures[address] = failures
        while len(self._failures) > self._max:
            self._failures.popitem(last=False)


class ConsoleSessions:
    """The console's sessions and sign-in codes, ending after `hours`, with the limiter."""

    def __init__(self, *, hours: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._seconds = hours * 3_600
        self._clock = clock
        self._sessions: OrderedDict[str, ConsoleSession] = OrderedDict()
        self._codes: OrderedDict[str, float] = OrderedDict()
        self.limiter = SignInLimiter(clock=clock)

    @property
    def max_age(self) -> int:
        """The cookie's Max-Age: the session's lifetime in whole seconds."""
        return int(self._seconds)

    def start(self) -> ConsoleSession:
        """A new session (the oldest one is evicted when there are too many)."""
        session = ConsoleSession(
            id=secrets.token_urlsafe(32),
            csrf=secrets.token_urlsafe(32),
            expires=self._clock() + self._seconds,
        )
        self._sessions[session.id] = session
        while len(self._sessions) > MAX_SESSIONS:
            self._sessions.popitem(last=False)
        return session

    def get(self, session_id: str | None) -> ConsoleSession | None:
        """The live session with this id; None when unknown, ended or expired."""
        if not session_id:
            return None
        session = self._sessions.get(session_id)
        if session is None:
            return None
        if self._clock() >= session.expires:
            del self._sessions[session_id]
            return None
        return session

    def end(self, session_id: str) -> None:
        """End a session server-side (logout): its cookie is refused from now on."""
        self._sessions.pop(session_id, None)

    def issue_code(self, ttl: float = CODE_TTL) -> str:
        """A one-time sign-in code, valid once and for `ttl` seconds (the demo's link)."""
        code = secrets.token_urlsafe(32)
        self._codes[code] = self._clock() + ttl
        while len(self._codes) > MAX_CODES:
            self._codes.popitem(last=False)
        return code

    def redeem(self, code: str) -> ConsoleSession | None:
        """A new session for a valid, unused, unexpired code (used up); else None."""
        expires = self._codes.pop(code, None)
        if expires is None or self._clock() >= expires:
            return None
        return self.start()
