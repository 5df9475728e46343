"""Which Mattermost senders are bot accounts: asked of the server once per user, remembered.

A post carries `props.from_bot` when a bot account wrote it, but the pair guard must not
depend on a flag alone (OpenClaw's Mattermost plugin exposes no bot identity at all, and
its guard does nothing there), so the connector also asks the server about each sender
(`GET /api/v4/users/{id}`, `is_bot`). `BotDirectory` holds the answers: a user is looked
up once (concurrent askers share the one request), at most `MAX_USERS` answers are kept
(the least recently asked go first), and an answer the server could not give is not kept
and counts as a bot: a connector that cannot tell treats the sender as a bot (fail closed).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable

MAX_USERS = 10_000

Lookup = Callable[[str], Awaitable[bool | None]]
"""Asks the server whether a user id is a bot account; None when it could not say."""


class BotDirectory:
    """The bot flag of each sender, looked up once and kept (bounded, least recent first out)."""

    def __init__(self, lookup: Lookup, *, max_users: int = MAX_USERS) -> None:
        self._lookup = lookup
        self._max_users = max_users
        self._known: OrderedDict[str, bool] = OrderedDict()
        self._asking: dict[str, asyncio.Future[bool | None]] = {}

    async def is_bot(self, user_id: str) -> bool:
        """True when `user_id` is a bot account, or when the server could not say."""
        known = self._known.get(user_id)
        if known is not None:
            self._known.move_to_end(user_id)
            return known
        asking = self._asking.get(user_id)
        if asking is None:
            asking = asyncio.ensure_future(self._ask(user_id))
            self._asking[user_id] = asking
        answer = await asyncio.shield(asking)
        return True if answer is None else answer

    def __len__(self) -> int:
        """How many users' answers are kept."""
        return len(self._known)

    async def _ask(self, user_id: str) -> bool | None:
        try:
            answer = await self._lookup(user_id)
        finally:
            del self._asking[user_id]
        if answer is not None:
            self._known[user_id] = answer
            while len(self._known) > self._max_users:
                self._known.popitem(last=False)
        return answer
