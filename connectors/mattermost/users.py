"""Which Mattermost senders are bot accounts, and their names: asked once per user, remembered.

A post carries `props.from_bot` when a bot account wrote it, but the pair guard must not
depend on a flag alone (OpenClaw's Mattermost plugin exposes no bot identity at all, and
its guard does nothing there), so the connector also asks the server about each sender
(`GET /api/v4/users/{id}`, `is_bot`). The same answer gives the user's `username`, the
name a post caught up over REST lacks (the websocket's event carries it as `sender_name`).
`BotDirectory` holds the answers: a user is looked up once (concurrent askers share the
one request), at most `MAX_USERS` answers are kept (the least recently asked go first),
and an answer the server could not give is not kept and counts as a bot: a connector that
cannot tell treats the sender as a bot (fail closed).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

MAX_USERS = 10_000


@dataclass(frozen=True, slots=True)
class Account:
    """What the server says of a user: a bot account or not, and its username ("" unknown)."""

    is_bot: bool
    username: str = ""


Lookup = Callable[[str], Awaitable[Account | None]]
"""Asks the server about a user id; None when it could not say."""


class BotDirectory:
    """The bot flag of each sender, looked up once and kept (bounded, least recent first out)."""

    def __init__(self, lookup: Lookup, *, max_users: int = MAX_USERS) -> None:
        self._lookup = lookup
        self._max_users = max_users
        self._known: OrderedDict[str, Account] = OrderedDict()
        self._asking: dict[str, asyncio.Future[Account | None]] = {}

    async def is_bot(self, user_id: str) -> bool:
        """True when `user_id` is a bot account, or when the server could not say."""
        account = await self.account(user_id)
        return True if account is None else account.is_bot

    async def account(self, user_id: str) -> Account | None:
        """What the server said of `user_id` (asked now if not known); None when it could not."""
        known = self._known.get(user_id)
        if known is not None:
            self._known.move_to_end(user_id)
            return known
        asking = self._asking.get(user_id)
        if asking is None:
            asking = asyncio.ensure_future(self._ask(user_id))
            self._asking[user_id] = asking
        return await asyncio.shield(asking)

    def __len__(self) -> int:
        """How many users' answers are kept."""
        return len(self._known)

    async def _ask(self, user_id: str) -> Account | None:
        try:
            answer = await self._lookup(user_id)
        finally:
            del self._asking[user_id]
        if answer is not None:
            self._known[user_id] = answer
            while len(self._known) > self._max_users:
                self._known.popitem(last=False)
        return answer
