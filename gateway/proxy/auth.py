"""Who is calling: the proxy key a request presents, found by its hash, names the agent.

The key also binds its calls' agent (and the customer, user and feature it sets): the
budgets, rules and spend of those fields follow the key, never a header.

Each provider says where its SDK puts the key (`Provider.credential`); the key is looked
up by its blake2b hash, so the raw keys are not kept once the table is built. The root
of a client's circuits is its agent name; when several keys name the same agent, the
root is `agent~<6 hex digits of the key's hash>`, so each key keeps its own circuits and
no key ever appears in a message, a log line or the request log.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gateway.config.proxy import ProxyKey
from gateway.proxy.provider import Provider


@dataclass(frozen=True, slots=True)
class ProxyClient:
    """Who a proxy key belongs to: the agent, the root of its circuits, the fields it binds.

    `bound` holds the call fields the key sets beside the agent (any of customer, user
    and feature its config names); no header can change them, nor the agent.
    """

    agent: str
    root: str
    bound: tuple[tuple[str, str], ...] = ()


def key_digest(key: str) -> bytes:
    """The hash a key is looked up by (any string: a lone surrogate is hashed, not refused)."""
    encoded = key.encode("utf-8", "surrogatepass")
    return hashlib.blake2b(encoded, digest_size=32, person=b"lw-proxy-key").digest()


def client_table(keys: Sequence[ProxyKey]) -> dict[bytes, ProxyClient]:
    """The clients by the hash of their key (the raw keys are not kept in the table)."""
    agents = Counter(key.agent for key in keys)
    table: dict[bytes, ProxyClient] = {}
    for key in keys:
        digest = key_digest(key.key.get_secret_value())
        root = key.agent if agents[key.agent] == 1 else f"{key.agent}~{digest.hex()[:6]}"
        table[digest] = ProxyClient(agent=key.agent, root=root, bound=key.bound())
    return table


class Authenticator:
    """Finds the client a request's proxy key belongs to."""

    def __init__(self, keys: Sequence[ProxyKey]) -> None:
        self._clients = client_table(keys)

    def client(
        self, provider: Provider, headers: Mapping[str, str], query: Mapping[str, str]
    ) -> ProxyClient | None:
        """The client whose key the request presents as `provider`'s SDK does; None: unknown."""
        presented = provider.credential(headers, query)
        return self._clients.get(key_digest(presented)) if presented else None
