"""Loopback-only connections for the test suite (PTB's tests/auxil/networking.py idea).

`tests/conftest.py` installs `guarded_connect` and `guarded_connect_ex` on
`socket.socket` for every test.
"""

from __future__ import annotations

import ipaddress
import socket


class NetworkForbidden(RuntimeError):
    """A test tried to connect beyond loopback."""


_LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


def _is_loopback(address: object) -> bool:
    """Whether a socket address is a Unix socket path or a loopback host."""
    if not isinstance(address, tuple):
        return True  # AF_UNIX paths (str or bytes)
    host = address[0]
    if isinstance(host, bytes):
        host = host.decode("ascii", "replace")
    if not isinstance(host, str):
        return False
    if host.casefold() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


_real_connect = socket.socket.connect
_real_connect_ex = socket.socket.connect_ex


def guarded_connect(sock: socket.socket, address: object) -> None:
    if not _is_loopback(address):
        raise NetworkForbidden(f"tests may only connect to loopback, not {address!r}")
    _real_connect(sock, address)  # type: ignore[arg-type]


def guarded_connect_ex(sock: socket.socket, address: object) -> int:
    if not _is_loopback(address):
        raise NetworkForbidden(f"tests may only connect to loopback, not {address!r}")
    return _real_connect_ex(sock, address)  # type: ignore[arg-type]
