"""The `http:` section: the gateway's own server (health, metrics, webhooks, admin, console).

Decisions where DESIGN.md is silent:
- `http.admin_token` is at least 16 characters (`gateway.config.limits`).
- `http.console_session_hours` (default 12) is more than 0 and at most 366 days of hours;
  it is the proxy's console's too. `http.public_url` (and `proxy.public_url`) is where
  browsers reach the server (`gateway.config.urls`); https there makes the console's
  cookie Secure.
- `http.trusted_proxies` (the gateway's and the proxy's) lists the reverse proxies whose
  `X-Forwarded-For` names the client the console's sign-in limiter counts
  (`gateway.admin.console.clients`).
"""

from __future__ import annotations

from pydantic import Field

from gateway.config.base import ChosenSecret, Frozen
from gateway.config.limits import DEFAULT_SESSION_HOURS
from gateway.config.urls import PublicUrl, TrustedProxies

MAX_SESSION_HOURS = 366 * 24
"""The longest console session: the bound every other duration has (`gateway.config.limits`)."""


class HttpConfig(Frozen):
    """The gateway's own aiohttp server: health, metrics, webhooks, admin API, console, room."""

    host: str = "127.0.0.1"
    port: int = Field(default=8787, ge=0, le=65535)
    admin_token: ChosenSecret = None
    console_session_hours: float = Field(default=DEFAULT_SESSION_HOURS, gt=0, le=MAX_SESSION_HOURS)
    public_url: PublicUrl = None
    trusted_proxies: TrustedProxies = ()
