"""Whose attempt a console sign-in is: the peer's, or the client a trusted reverse proxy names.

Kept apart from the console's app (no aiohttp here) so that the config validates
`http.trusted_proxies` with `trusted_network` without importing the HTTP server.

Decisions where DESIGN.md is silent:
- `http.trusted_proxies` lists IP addresses and networks (`10.0.0.0/8`, `192.0.2.7`,
  `::1`), at most `MAX_TRUSTED_PROXIES`. An entry `ipaddress` does not read, a network with
  host bits set (`10.0.0.1/8`), one longer than `MAX_ENTRY_CHARS` or holding a space or a
  control character is refused, naming the entry and not repeating it.
- Only when the direct peer is in that list are the forwarding headers read: the
  addresses of every `X-Forwarded-For` header (in order; a request without one: the
  `for=` of every `Forwarded` header) are walked from the right, passing over trusted
  proxies; the first address that is not one is the client, and when every one is, the
  left-most. An entry that is no address (`unknown`, an obfuscated `_node`, junk) stops the
  walk and the peer counts: a trusted proxy always writes the address it saw, so junk
  there means the header did not come from it. A proxy that writes only `Forwarded`
  must drop an `X-Forwarded-For` the client sent, or the client's header is read.
- Otherwise (no list, a peer not in it) the peer's address counts, whatever the headers
  say: a client can write any address there.
- Addresses are counted in `ipaddress`'s normal form (`::ffff:10.0.0.1` is `10.0.0.1`,
  IPv6 compressed and without a zone), so one client is one key however it is written; a
  peer that is no IP address (a Unix socket) is counted as it is named.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TypeAlias

Address: TypeAlias = ipaddress.IPv4Address | ipaddress.IPv6Address
Network: TypeAlias = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True, slots=True)
class ClientAddresses:
    """Names the client of a request from its peer and, behind trusted proxies, their headers."""

    networks: tuple[Network, ...] = ()

    @classmethod
    def trusting(cls, entries: Iterable[str]) -> ClientAddresses:
        """Trust the proxies of `entries` (validated by `trusted_network`)."""
        return cls(tuple(ipaddress.ip_network(entry) for entry in entries))

    def client(
        self, peer: str | None, forwarded_for: Sequence[str], forwarded: Sequence[str]
    ) -> str:
        """The client's address: the peer's, or the one the trusted proxies in front name.

        `forwarded_for` and `forwarded` are the request's `X-Forwarded-For` and `Forwarded`
        headers, each header once, in the order received.
        """
        if peer is None:
            return "unknown"
        direct = _address(peer)
        if direct is None:
            return peer
        if not self._trusted(direct):
            return str(direct)
        entries = _split(forwarded_for) if forwarded_for else _forwarded_for(forwarded)
        client = direct
        for entry in reversed(entries):
            named = _address(entry)
            if named is None:
                return str(direct)
            client = named
            if not self._trusted(named):
                break
        return str(client)

    def _trusted(self, address: Address) -> bool:
        return any(address in network for network in self.networks)


def _split(headers: Sequence[str]) -> list[str]:
    return [entry.strip() for header in headers for entry in header.split(",")]


def _forwarded_for(headers: Sequence[str]) -> list[str]:
    """The `for=` of each element of RFC 7239 `Forwarded` headers (an element without one: '')."""
    found = []
    for element in _split(headers):
        value = ""
        for pair in element.split(";"):
            name, _, text = pair.partition("=")
            if name.strip().lower() == "for":
                value = text.strip().strip('"')
        found.append(value)
    return found


def _address(text: str) -> Address | None:
    """The IP address `text` writes (`[v6]:port` and `v4:port` as proxies write them), or None."""
    host = text
    if host.startswith("["):
        host = host[1 : host.find("]")] if "]" in host else ""
    elif host.count(":") == 1:
        host = host.partition(":")[0]
    try:
        address = ipaddress.ip_address(host.partition("%")[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address
