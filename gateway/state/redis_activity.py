"""The redis backend's Activity feed: one script call per batch, shared by every replica.

Keys, under the store's prefix and the hash tag `{act}` (one cluster slot):
- `{act}:id`: the last event id given (INCR); `{act}:log`: a list of `<id> <record>` (the
  record `gateway.state.activity.encode`d), oldest first, trimmed to `EVENTS_KEEP`. Ids in
  the list are consecutive (each INCR pushes one entry, in the same script), so the entry
  after a cursor is found by its place, not by a scan.
- `{act}:seen:<message key>`: a message in already appended (expires after `SEEN_SECONDS`).
- `{act}:n:<m|h>:<bucket start>:<room>`: a hash of one bucket's counters (`in`, `out`,
  `r:<stage>`), room `*` for all rooms; minute hashes expire after `MINUTE_KEEP_SECONDS`,
  hour hashes after `HOUR_KEEP_SECONDS`.
- `{act}:rooms`: a sorted set of rooms by when last seen, trimmed to `ROOMS_KEEP`.

Decisions where DESIGN.md is silent:
- The script counting a batch is the second version of `activity.counters` (every event in
  its minute and hour, for its room and all rooms), held to it by the conformance suite.
- A read of one room scans the list in the script (at most `EVENTS_KEEP` entries, on an
  admin path); a room's record starts `[<at>,<room as JSON>,`, so the script compares that
  part of it exactly and never decodes JSON.
- While Redis is down a batch is lost (`activity_append` raises StateError; the feed logs
  and drops it) and reads answer nothing: the feed is for looking, not for deciding.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Sequence
from typing import cast

from gateway.app.errors import StateError
from gateway.state import activity
from gateway.state.activity import (
    EVENTS_KEEP,
    HOUR_KEEP_SECONDS,
    MINUTE_KEEP_SECONDS,
    ROOMS_KEEP,
    SEEN_SECONDS,
    TOTAL,
    ActivityBucket,
    ActivityEvent,
    Span,
)
from gateway.state.redis_link import RedisLink

# KEYS: the log, the id counter, the rooms (the other keys, named from the base, share
# their tag: one slot). ARGV: the keys' base, keep, seen ms, minute ms, hour ms, rooms
# keep, then per event: dedupe key ('' none), room, record, at, counter field ('' none),
# minute start, hour start.
_APPEND = """
local p = ARGV[1]
local keep, rooms_keep = tonumber(ARGV[2]), tonumber(ARGV[6])
local ttl = {m = tonumber(ARGV[4]), h = tonumber(ARGV[5])}
local log = KEYS[1]
local counts, order, rooms = {}, {}, {}
local function count(key, field)
  local held = counts[key]
  if not held then
    held = {}
    counts[key] = held
    order[#order + 1] = key
  end
  held[field] = (held[field] or 0) + 1
end
for i = 7, #ARGV, 7 do
  local seen, room, record, at, field = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4]
  if seen == '' or redis.call('SET', p .. 'seen:' .. seen, '1', 'NX', 'PX', ARGV[3]) then
    local id = redis.call('INCR', KEYS[2])
    redis.call('RPUSH', log, id .. ' ' .. record)
    if field ~= '' then
      for _, bucket in ipairs({'m:' .. ARGV[i + 5], 'h:' .. ARGV[i + 6]}) do
        count(bucket .. ':' .. room, field)
        count(bucket .. ':*', field)
      end
    end
    rooms[room] = at
  end
end
for _, key in ipairs(order) do
  local hash = p .. 'n:' .. key
  for field, n in pairs(counts[key]) do redis.call('HINCRBY', hash, field, n) end
  redis.call('PEXPIRE', hash, ttl[string.sub(key, 1, 1)])
end
for room, at in pairs(rooms) do redis.call('ZADD', KEYS[3], at, room) end
redis.call('ZREMRANGEBYRANK', KEYS[3], 0, -rooms_keep - 1)
redis.call('LTRIM', log, -keep, -1)
return 1
"""

# KEYS: log. ARGV: cursor ('' none), limit, room part ('' every room: `,<room as JSON>,`).
# Returns {next cursor or '', entry...}, entries oldest first (see `activity_since`).
_SINCE = """
local len = redis.call('LLEN', KEYS[1])
if len == 0 then return {''} end
local newest = tonumber(string.match(redis.call('LINDEX', KEYS[1], -1), '^%d+'))
local first = newest - len + 1
local limit, part = tonumber(ARGV[2]), ARGV[3]
local cursor = tonumber(ARGV[1])
if cursor and cursor > newest then cursor = nil end
local function ours(entry)
  if part == '' then return true end
  local comma = string.find(entry, ',', 1, true)
  return comma ~= nil and string.sub(entry, comma, comma + #part - 1) == part
end
local picked = {}
local chunk = 500
if cursor then
  local start = math.max(cursor + 1 - first, 0)
  while start < len and #picked < limit do
    for _, entry in ipairs(redis.call('LRANGE', KEYS[1], start, start + chunk - 1)) do
      if ours(entry) then
        picked[#picked + 1] = entry
        if #picked == limit then break end
      end
    end
    start = start + chunk
  end
  local following = tostring(newest)
  if #picked == limit then following = string.match(picked[#picked], '^%d+') end
  table.insert(picked, 1, following)
  return picked
end
local stop = len - 1
while stop >= 0 and #picked < limit do
  local batch = redis.call('LRANGE', KEYS[1], math.max(stop - chunk + 1, 0), stop)
  for i = #batch, 1, -1 do
    if ours(batch[i]) then
      picked[#picked + 1] = batch[i]
      if #picked == limit then break end
    end
  end
  stop = stop - chunk
end
local found = {tostring(newest)}
for i = #picked, 1, -1 do found[#found + 1] = picked[i] end
return found
"""


class RedisActivity:
    """The Activity feed's calls, over the store's link and key prefix."""

    def __init__(self, link: RedisLink, prefix: str) -> None:
        self._link = link
        self._base = f"{prefix}{{act}}:"
        self._append = link.script(_APPEND)
        self._since = link.script(_SINCE)

    async def append(self, events: Sequence[ActivityEvent]) -> None:
        """Append and count the batch in one script call (raises StateError while down)."""
        if not events:
            return
        keys = [f"{self._base}log", f"{self._base}id", f"{self._base}rooms"]
        args: list[str | int] = [
            self._base,
            EVENTS_KEEP,
            int(SEEN_SECONDS * 1000),
            MINUTE_KEEP_SECONDS * 1000,
            HOUR_KEEP_SECONDS * 1000,
            ROOMS_KEEP,
        ]
        for event in events:
            minute, hour = activity.starts(event.at)
            args += (
                activity.dedupe_key(event) or "",
                event.room,
                activity.encode(event),
                repr(event.at),
                activity.counter_field(event) or "",
                minute,
                hour,
            )
        await self._link.guarded(lambda: self._append(keys=keys, args=args))

    async def since(
        self, cursor: int | None, limit: int, room: str | None
    ) -> tuple[list[ActivityEvent], int | None]:
        """Events after `cursor` (None: the newest), oldest first; nothing while Redis is down."""
        part = "" if room is None else f",{json.dumps(room)},"
        args = ("" if cursor is None else str(cursor), limit, part)
        try:
            following, *entries = await self._link.guarded(
                lambda: self._since(keys=[f"{self._base}log"], args=args)
            )
        except StateError:
            return [], cursor
        found: list[ActivityEvent] = []
        for entry in entries:
            head, _, record = str(entry).partition(" ")
            event = activity.decode(int(head), record) if head.isdigit() else None
            if event is not None:
                found.append(event)
        return found, int(following) if following != "" else None

    async def series(self, span: Span, now: float, room: str | None) -> list[ActivityBucket]:
        """The chart's buckets (one pipeline of HGETALL); empty buckets while Redis is down."""
        resolution, starts = activity.span_buckets(span, now)
        name = TOTAL if room is None else room
        client = self._link.client

        async def read() -> list[dict[str, str]]:
            async with client.pipeline(transaction=False) as pipe:
                for t in starts:
                    pipe.hgetall(f"{self._base}n:{resolution}:{t}:{name}")
                return cast(list[dict[str, str]], await pipe.execute())

        try:
            held = await self._link.guarded(read)
        except StateError:
            held = [{} for _ in starts]
        return [
            activity.bucket(t, {field: int(n) for field, n in counts.items()})
            for t, counts in zip(starts, held, strict=True)
        ]

    async def rooms(self) -> list[tuple[str, float]]:
        """Rooms seen, newest first; none while Redis is down."""
        key = f"{self._base}rooms"
        try:
            held = await self._link.guarded(
                lambda: cast(
                    Awaitable[list[tuple[str, float]]],
                    self._link.client.zrevrange(key, 0, ROOMS_KEEP - 1, withscores=True),
                )
            )
        except StateError:
            return []
        return [(str(room), float(at)) for room, at in held]
