"""The address browsers reach the console at (`http.public_url`, `proxy.public_url`).

Kept apart from the console's app so that the config can validate it without importing
the HTTP server; `http_url` is the check every http(s) URL of the config passes (an
`http` agent's `url` too).

Decisions where DESIGN.md is silent:
- A public URL is an absolute `http://` or `https://` URL with a host, a valid port, no
  credentials, query or fragment, and no spaces or control characters. Its path is
  ignored: the console is always at `/console` of that origin.
- It serves two things: `https://` adds `Secure` to the session cookie, and its origin is
  accepted as the `Origin` of a state-changing console request beside the request's own
  (a TLS-terminating reverse proxy in front sees `http://` and maybe another Host).
"""

from __future__ import annotations

import ipaddress
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import AfterValidator, Field


def http_url(value: str) -> str:
    """`value` when it is an absolute http(s) URL with a host and a usable port, else ValueError."""
    if any(char.isspace() or not char.isprintable() for char in value):
        raise ValueError("must not contain spaces or control characters")
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("must be an http:// or https:// URL with a host")
    try:
        port_ok = parts.port is None or parts.port > 0
    except ValueError:  # not a number, or beyond 65535
        port_ok = False
    if not port_ok:
        raise ValueError("must have a port from 1 to 65535")
    return value


def _public_url(value: str | None) -> str | None:
    if value is None:
        return None
    parts = urlsplit(http_url(value))
    if parts.username is not None or parts.password is not None:
        raise ValueError("must not carry credentials")
    if parts.query or parts.fragment:
        raise ValueError("must not have a query or fragment")
    return value


PublicUrl = Annotated[str | None, AfterValidator(_public_url)]
"""Where browsers reach this server, e.g. `https://loopwarden.example.com` (None: unknown)."""


def origin(url: str) -> str:
    """The origin of an http(s) URL as a browser's `Origin` header writes it."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    default = {"http": 80, "https": 443}.get(parts.scheme)
    port = "" if parts.port in (None, default) else f":{parts.port}"
    return f"{parts.scheme}://{host}{port}"


def browser_host(host: str) -> str:
    """A host for a URL a browser can open (a wildcard bind is reached on loopback)."""
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


MAX_TRUSTED_PROXIES = 1_000


MAX_ENTRY_CHARS = 64  # the longest IPv6 network, written out in full, is 43


def trusted_network(value: str) -> str:
    """`value` in normal form when it is an IP address or network, else ValueError."""
    if len(value) > MAX_ENTRY_CHARS:
        raise ValueError(f"must be an IP address or network, at most {MAX_ENTRY_CHARS} characters")
    if any(char.isspace() or not char.isprintable() for char in value):
        raise ValueError("must not contain spaces or control characters")
    try:
        return str(ipaddress.ip_network(value))
    except ValueError as exc:
        reason = "has host bits set" if "host bits set" in str(exc) else "is not one"
        raise ValueError(
            f"must be an IP address or network such as 10.0.0.0/8, 192.0.2.7 or ::1 ({reason})"
        ) from None


TrustedProxies = Annotated[
    tuple[Annotated[str, AfterValidator(trusted_network)], ...],
    Field(max_length=MAX_TRUSTED_PROXIES),
]
"""The reverse proxies whose forwarding headers name the client (empty: none is trusted)."""
