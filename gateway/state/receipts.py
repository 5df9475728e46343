"""Dedupe receipts: a delivery is marked in flight, then confirmed once it was answered.

A receipt that is only claimed before the turn runs loses the message when the process
dies mid-turn: the platform redelivers it after the restart and the receipt refuses it.
So a receipt has two states. `receive` marks it in flight under the store instance's
owner id (a fresh random id per store instance, that is per process run) and
`confirm` marks it answered once the reply was delivered or the turn decided not to
answer. A delivery is let through when no live receipt exists, or when its receipt is
still in flight under an owner that is gone: a previous run of this gateway, killed
before it could confirm. It is refused (a duplicate) when the receipt is confirmed, or in
flight under this owner or another live one, so concurrent duplicates are answered once.

Which other owners are alive is the backend's to say: memory has one owner only; sqlite
is one gateway process, so another owner is always a previous run; redis is shared by
replicas, so another owner is alive while its liveness key is (see gateway/state/redis.py).
This module holds the one decision; memory and sqlite call it, the redis Lua script is
its second version, held to it by the conformance suite.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Receipt:
    """One delivery's receipt: who took it, whether it was answered, when it is forgotten."""

    owner: str
    confirmed: bool
    expires_at: float


def new_owner() -> str:
    """A fresh owner id for one store instance (one process run)."""
    return uuid.uuid4().hex


def receive(
    held: Receipt | None, *, owner: str, owner_alive: bool, now: float, ttl: float
) -> Receipt | None:
    """The receipt to store for a delivery `owner` takes, or None when it is a duplicate.

    `owner_alive` tells whether the owner of `held` (when it is another one) still runs.
    """
    if (
        held is not None
        and held.expires_at > now
        and (held.confirmed or held.owner == owner or owner_alive)
    ):
        return None
    return Receipt(owner, confirmed=False, expires_at=now + ttl)
