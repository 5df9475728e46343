"""Where one hosted Mattermost bot has read each channel up to, kept in the state backend.

The catch-up after a reconnect or a restart (`connectors.mattermost.catchup`) asks the
server for the posts after each channel's `Position`; this class holds the positions. They
live in memory and are written to the state backend's `CursorStore` (the one Matrix keeps
its sync token in), so a restart with a sqlite or redis state catches up too; with no
store they last as long as the process.

- Keys: `mattermost:<bot id>:<channel id>` holds a channel's position;
  `mattermost:<bot id>` the floor (`{"floor_ms": …}`): the time from which a channel the
  bot has no position for is read. The first start ever sets it to "now", so nothing
  posted before the connector first ran is ever answered (as on Matrix). After a
  complete catch-up it moves to the time that catch-up's websocket opened: every
  post after that reaches the bot live and moves a position, and a channel that has none
  yet had no post since the floor. A channel the catch-up found posts in gets its position
  (`hold`) before the floor moves, so a crash before those posts are handled still reads
  them from where they began.
- `advance` moves a position in memory at once; the writes follow in the background, one
  at a time, each of the channel's newest position (a burst costs a few writes, not one
  each). A write that fails is logged and the position is written again with the next
  post; a write lost to a crash makes the restart catch up a little earlier than needed,
  and the pipeline's dedupe (by post id) answers each post once.
- At most `MAX_CHANNELS` positions are held in memory (the least recently moved go first;
  theirs stay saved in the store), so a flood of made-up channel ids cannot exhaust memory.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import OrderedDict

from connectors.mattermost.catchup import Position, millis, parse_position, saved_mapping
from gateway.state.base import CursorStore

log = logging.getLogger(__name__)

MAX_CHANNELS = 100_000
_PREFIX = "mattermost"


class ChannelCursors:
    """Each channel's `Position` and the floor, in memory and saved to a `CursorStore`."""

    def __init__(
        self, store: CursorStore | None, bot_id: str, *, max_channels: int = MAX_CHANNELS
    ) -> None:
        self._store = store
        self._bot_id = bot_id
        self._max_channels = max_channels
        self._positions: OrderedDict[str, Position] = OrderedDict()
        self._unsaved: dict[str, Position] = {}
        self._writing: asyncio.Task[None] | None = None
        self.floor = 0

    async def start(self, now_ms: int) -> None:
        """Read the floor; the first start ever sets it to `now_ms` and saves it."""
        saved = await self._get(f"{_PREFIX}:{self._bot_id}")
        floor = _parse_floor(saved)
        if floor is None:
            await self.set_floor(now_ms)
        else:
            self.floor = floor

    async def set_floor(self, floor_ms: int) -> None:
        """Read channels without a position from `floor_ms` on (saved at once, after every
        position not saved yet: a channel `hold` kept must not fall under the new floor)."""
        await self.flush()
        self.floor = floor_ms
        await self._set(f"{_PREFIX}:{self._bot_id}", json.dumps({"floor_ms": floor_ms}))

    async def position(self, channel_id: str) -> Position:
        """A channel's position: in memory, else saved, else the floor."""
        known = self._positions.get(channel_id)
        if known is not None:
            return known
        saved = parse_position(await self._get(self._key(channel_id)))
        return saved if saved is not None else Position(self.floor)

    def hold(self, channel_id: str, position: Position) -> None:
        """Keep `position` for a channel that has none in memory (saved in the background)."""
        if channel_id not in self._positions:
            self._remember(channel_id, position)

    def advance(self, channel_id: str, create_at: int, post_id: str) -> None:
        """Note a post of `channel_id` handled; the new position is saved in the background."""
        known = self._positions.get(channel_id)
        current = known if known is not None else Position(0)
        moved = current.after(create_at, post_id)
        if moved is not current:
            self._remember(channel_id, moved)

    async def flush(self) -> None:
        """Write the positions not saved yet (before a stop or a new floor)."""
        if self._writing is not None:
            await self._writing
        await self._write_unsaved()

    def __len__(self) -> int:
        """How many channels' positions are held in memory."""
        return len(self._positions)

    def _remember(self, channel_id: str, moved: Position) -> None:
        self._positions[channel_id] = moved
        self._positions.move_to_end(channel_id)
        while len(self._positions) > self._max_channels:
            self._positions.popitem(last=False)
        if self._store is None:
            return
        self._unsaved[channel_id] = moved
        if self._writing is None or self._writing.done():
            self._writing = asyncio.create_task(self._write_unsaved())

    async def _write_unsaved(self) -> None:
        while self._unsaved:
            channel_id = next(iter(self._unsaved))
            position = self._unsaved.pop(channel_id)
            await self._set(self._key(channel_id), position.dumps())

    def _key(self, channel_id: str) -> str:
        return f"{_PREFIX}:{self._bot_id}:{channel_id}"

    async def _get(self, key: str) -> str | None:
        if self._store is None:
            return None
        try:
            return await self._store.cursor_get(key)
        except Exception as exc:  # a missing position only makes the catch-up start earlier
            log.warning(
                "mattermost bot %s: could not read a position (%s)",
                self._bot_id,
                type(exc).__name__,
            )
            return None

    async def _set(self, key: str, value: str) -> None:
        if self._store is None:
            return
        try:
            await self._store.cursor_set(key, value)
        except Exception as exc:  # the next post writes it again; dedupe covers a restart
            log.warning(
                "mattermost bot %s: could not save a position (%s)",
                self._bot_id,
                type(exc).__name__,
            )


def _parse_floor(saved: str | None) -> int | None:
    """A saved floor in milliseconds, None when absent or unreadable."""
    value = saved_mapping(saved)
    return None if value is None else millis(value.get("floor_ms"))
