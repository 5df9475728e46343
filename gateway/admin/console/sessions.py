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
- A one-time code is the demo's (`issue_code`, in this process) or the command line's
  (`loopwarden console-link`, through the folder of `gateway.admin.console.links`); `redeem`
  takes either.
- At most `MAX_SESSIONS` sessions and `MAX_CODES` unredeemed codes are kept; a new one
  evicts the oldest, so no client can grow them without bound.
- A session lasts `hours` from sign-in (not from its last use): the cookie's Max-Age says
  the same, so browser and server agree on when it ends.
- The limiter counts sign-in attempts per client address (`gateway.admin.console.clients`)
  as they arrive, before their token is read, so attempts sent at once are held to the
  limit like attempts sent one by one; an attempt that signs in is taken back. Ten in a
  minute block every further attempt from that address until the minute that began
  with the first of the ten is over; a blocked attempt is not counted. At most
  `MAX_ADDRESSES` addresses are tracked, the oldest forgotten first.
"""

from __future__ import annotations

import math
import secrets
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass

from gateway.admin.console.links import ConsoleLinks

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


@dataclass(frozen=True, slots=True)
class Admission:
    """The limiter's answer to one attempt: counted (`wait` None), or refused for `wait` s.

    `at` is when a counted attempt was counted (to take it back with `forgive`);
    `attempts` how many count against the address now, this one included; `lockout` is
    True for the first refusal of a lockout only, so it is reported once.
    """

    at: float
    attempts: int
    wait: int | None = None
    lockout: bool = False


@dataclass(slots=True)
class _Window:
    """One address's counted attempts (oldest first) and the lockout already reported."""

    stamps: deque[float]
    reported: float | None = None


class SignInLimiter:
    """Counts sign-in attempts per address as they arrive; too many within a minute block it."""

    def __init__(
        self,
        *,
        attempts: int = SIGN_IN_ATTEMPTS,
        window: float = SIGN_IN_WINDOW,
        clock: Callable[[], float] = time.monotonic,
        max_addresses: int = MAX_ADDRESSES,
    ) -> None:
        self.attempts = attempts
        self._window = window
        self._clock = clock
        self._max = max_addresses
        self._windows: OrderedDict[str, _Window] = OrderedDict()

    def admit(self, address: str) -> Admission:
        """Count one attempt from `address` now, or refuse it (uncounted) while it is blocked."""
        now = self._clock()
        held = self._windows.pop(address, None) or _Window(deque())
        stamps = held.stamps
        while stamps and stamps[0] + self._window <= now:
            stamps.popleft()
        self._windows[address] = held
        if len(stamps) >= self.attempts:
            lockout = held.reported != stamps[0]
            held.reported = stamps[0]
            wait = max(1, math.ceil(stamps[0] + self._window - now))
            return Admission(now, len(stamps), wait=wait, lockout=lockout)
        stamps.append(now)
        while len(self._windows) > self._max:
            self._windows.popitem(last=False)
        return Admission(now, len(stamps))

    def forgive(self, address: str, admission: Admission) -> None:
        """Take back a counted attempt that signed in."""
        held = self._windows.get(address)
        if held is not None and admission.at in held.stamps:
            held.stamps.remove(admission.at)


class ConsoleSessions:
    """The console's sessions and sign-in codes, ending after `hours`, with the limiter."""

    def __init__(
        self,
        *,
        hours: float,
        clock: Callable[[], float] = time.monotonic,
        links: ConsoleLinks | None = None,
    ) -> None:
        self._seconds = hours * 3_600
        self._clock = clock
        self._sessions: OrderedDict[str, ConsoleSession] = OrderedDict()
        self._codes: OrderedDict[str, float] = OrderedDict()
        self.limiter = SignInLimiter(clock=clock)
        self.links = links

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
        """A new session for a valid, unused, unexpired code (used up); else None.

        The code is this process's (`issue_code`) or the command line's (`links`).
        """
        expires = self._codes.pop(code, None)
        if expires is not None:
            return self.start() if self._clock() < expires else None
        if self.links is not None and self.links.redeem(code):
            return self.start()
        return None
