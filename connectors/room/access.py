"""Who may reach the room: a loopback or configured Host, same-origin browsers, fair names.

Decisions where DESIGN.md is silent:
- Every room route answers only a request whose `Host` names loopback (`localhost`,
  127.0.0.0/8, `[::1]`) or the configured `http.host`, unless that is a wildcard (0.0.0.0,
  ::), which configures no name. DNS rebinding points a hostile name at 127.0.0.1, and
  the browser then sends `Host: evil.example`: refused. The port is not compared: a
  rebound page reaches the port it was given, so the name is what tells it apart.
- There is no allowed-hosts list: the room has no config section of its own, and a room
  served beyond loopback has no login anyway (bind `http.host` to the name you use).
- A browser (it sends `Origin`) must also come from the origin it asked for: a page of
  another site, or of another port on loopback, cannot open the websocket or read the
  transcript. Clients without an Origin header (curl, scripts, tests) are let in.
- Names are compared as they read (`name_key`): look-alike letters, zero-width
  characters, case and whitespace are folded away (guards.lookalike.fold).
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit

from aiohttp import hdrs, web

from guards.lookalike import fold

WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::"})
HOST_REFUSED = "the room answers only on loopback or the configured http.host"
ORIGIN_REFUSED = "cross-origin request refused"

# A Host header: a bracketed IPv6 address or a name without brackets, colons or userinfo,
# then an optional port.
_HOST = re.compile(r"(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<name>[^\[\]:@/\s]+))(?::[0-9]{1,5})?")


def _normal(host: str) -> str:
    """One spelling per host: an address in its compressed form, a name case-folded."""
    try:
        return ipaddress.ip_address(host).compressed
    except ValueError:
        return host.casefold()


def _host_name(header: str) -> str | None:
    """The host part of a Host header, normalised; None when it is not a host[:port]."""
    match = _HOST.fullmatch(header)
    if match is None:
        return None
    return _normal(match["v6"] or match["name"])


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class RoomAccess:
    """Decides whether a request may reach the room, from its Host and Origin headers."""

    def __init__(self, http_host: str) -> None:
        host = http_host.strip("[]")
        self._configured = None if host in WILDCARD_HOSTS else _normal(host)

    def refusal(self, request: web.Request) -> str | None:
        """Why the request is refused (for a 403), or None when it may come in."""
        host = request.headers.get(hdrs.HOST, "")
        name = _host_name(host)
        if name is None or not (_is_loopback(name) or name == self._configured):
            return HOST_REFUSED
        origin = request.headers.get(hdrs.ORIGIN)
        if origin is not None and _origin_netloc(origin) != host.casefold():
            return ORIGIN_REFUSED
        return None


def _origin_netloc(origin: str) -> str | None:
    """The host[:port] an Origin header names; None when it is not a URL (`null`, garbage)."""
    try:
        return urlsplit(origin).netloc.casefold() or None
    except ValueError:
        return None


def name_key(name: str) -> str:
    """A name as it reads: two names with one key pass for each other in the room."""
    return "".join(fold(name).split())
