"""Forgetting reclaimed rooms: a room the hub reclaims leaves no memory in the gateway.

The hub reclaims rooms no one is in when it needs a new one (`hub.MAX_ROOMS`); the
gateway's transcript of such a room (DESIGN.md §3, in the state store) would otherwise
live on for its `ttl`: 1,500 room names with two 16 KB messages each held 50 MB. A
reclaimed room's transcript is emptied through `ForgetRoom`, which the runtime lends
(`ConnectorServices.forget_room`: the state store's forget, so every backend forgets it).

Decisions where DESIGN.md is silent:
- The forget waits until every seated bot has handled the messages it was handed before
  the reclaim (`RoomMember.after_handled`): a message still queued, or a turn still
  running, would otherwise record itself after the forget. Rooms reclaimed meanwhile
  wait for the next round, so one slow bot delays forgetting, never skips it.
- A room reclaimed and opened again before its forget ran loses what its new life had
  recorded by then: both lives share one transcript name, and the old one must go.
- A forget that fails (Redis down) is logged, naming the room; the transcript then
  expires by its `ttl` as any other.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

log = logging.getLogger("loopwarden.room")

ForgetRoom = Callable[[str], Awaitable[object]]
"""Empties the gateway's memory of one room, given the room's name in the hub."""


class Settling(Protocol):
    """A seated bot that can say when it has handled what it was handed so far."""

    def after_handled(self, done: Callable[[], None]) -> None: ...


@dataclass(slots=True)
class _Round:
    """Rooms to forget once `waiting` more bots (and the round's own start) have settled."""

    rooms: tuple[str, ...]
    waiting: int


class Reclaimed:
    """Forgets the rooms the hub reclaims, a round at a time, each once its bots settled."""

    def __init__(self, forget: ForgetRoom, members: Callable[[], Sequence[Settling]]) -> None:
        self._forget = forget
        self._members = members
        self._pending: dict[str, None] = {}
        self._round: _Round | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def idle(self) -> bool:
        """True when every room reclaimed so far has been forgotten (or failed to be)."""
        return not self._pending and self._round is None and not self._tasks

    def add(self, rooms: Iterable[str]) -> None:
        """Forget these rooms once every seated bot has handled what it holds now."""
        self._pending.update(dict.fromkeys(rooms))
        self._start_round()

    async def aclose(self) -> None:
        """Wait for the forgets already running (the rooms still settling are left)."""
        if self._tasks:
            await asyncio.wait(set(self._tasks))

    def _start_round(self) -> None:
        if self._round is not None or not self._pending:
            return
        members = self._members()
        # One more than the bots: the round settles only after every bot was asked, even
        # when some answer at once.
        this = self._round = _Round(tuple(self._pending), waiting=len(members) + 1)
        self._pending = {}
        for member in members:
            member.after_handled(lambda: self._settled(this))
        self._settled(this)

    def _settled(self, this: _Round) -> None:
        this.waiting -= 1
        if this.waiting:
            return
        task = asyncio.create_task(self._forget_rooms(this.rooms), name="room:forget")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        self._round = None
        self._start_round()

    async def _forget_rooms(self, rooms: tuple[str, ...]) -> None:
        for room in rooms:
            try:
                await self._forget(room)
            except Exception as exc:  # the state store's failure; the ttl still ends it
                log.warning(
                    "room %s was reclaimed but its memory could not be forgotten (%s)",
                    room,
                    type(exc).__name__,
                )
