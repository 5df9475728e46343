"""Redis state: budgets, cooldowns, receipts and pauses shared by every gateway replica.

Each decision is one server-side Lua script call (EVALSHA, reloaded after NOSCRIPT; the
connection and its outage handling are gateway/state/redis_link.py), so replicas never
race on a read-modify-write. Time is the Redis server's `TIME`, read inside the
script, so replicas whose clocks disagree still agree on windows and cooldowns; tests may
inject a clock whose value is passed to the scripts instead. Every key expires by itself
(PEXPIRE to the window, cooldown or TTL it serves), so an idle pair or room costs nothing.
Needs Redis 5 or later (scripts call TIME before writing, which needs effects
replication, the default since 5 and the only mode since 7). On a Redis Cluster (or
Valkey's) each script's keys are declared and share one hash tag, so each call runs on
one slot; cross-key reads (the pairs and rooms held, the transcripts) SCAN every master.

Keys, under `key_prefix` (default `lw:`):
- `budget:{room␟a␟b}`: the pair's `PairRecord` (guards/bot_loop.py) as one string of
  space-separated numbers, `idle_at cooldown_until window times…` (`-` for no cooldown
  opened in the window; the admitted events' times oldest first), one GET and one SET a
  decision; it expires at `idle_at` (␟ is U+001F; in the room and the ids, `%` is
  written `%25` and ␟ `%1F`, so any name reads back as it was).
- `roombudget:{room}`: the room budget's `RoomRecord` (guards/room_budget.py) as JSON,
  one GET and one SET a decision, expiring at its `idle_at`.
- `turns:{room}`: consecutive bot turns; `turns:{room}:seen:<message key>`: the count a
  message produced, so every hosted bot (and replica) that sees it gets the same one.
- `claim:<key>`: once-only claims (admin commands, cooldown notices).
- `receipt:<key>`: a dedupe receipt, a hash of owner, confirmed (0 while in flight) and
  until; `owner:<id>`: a replica's liveness key, refreshed every few seconds while its
  store runs and deleted by `aclose` (gateway/state/receipts.py says how they decide).
- `cursor:<key>`: where a connector resumes reading its platform (a Matrix sync token).
- `ovr:<room>`: a hash of runtime overrides (JSON values); `pause:<room>`; `audit`: the
  audit trail's admin log, a list of JSON entries, newest first, capped at AUDIT_KEEP;
  `audit:others` and `audit:senders:{<prefix>audit:others}`: its `others` log
  (gateway/state/audit.py) and each sender's count in it, bounded overall and per sender
  by one script call (the hash's tag puts it in the log's slot).
- `transcript:{scope}`: a transcript (DESIGN.md §3), a list of JSON entries oldest first
  (`gateway.state.transcripts`), capped at `max_messages` as it is appended to;
  `transcript:{scope}:keys`, the set of message keys it holds (a redelivered message is
  appended once); `transcript:{scope}:until`, when it is forgotten. All three expire
  `ttl` after the last append; an append is one script call and a read one more.
- `{act}:…`: the Activity feed (gateway/state/redis_activity.py), one script call a batch.

Decisions where DESIGN.md is silent:
- Outage (connection refused, timeout, read-only replica, out of memory): decisions follow
  `on_error`. `allow`: `pair_decide`, `bot_turn`, `claim`, `receive` and `confirm` are
  decided by a `MemoryStateStore` of this process, so pair budgets, cooldowns, the
  bot-turn cap and dedupe still hold, per process, instead of not at all; when Redis is
  back its shared state decides again, as it was before the outage, and the local counts
  are dropped (a later outage starts fresh). `deny`: `pair_decide` refuses with reason
  `cooldown` (the guards' reasons are fixed; `cooldown` is the one refusal that posts no
  notice) and `retry_after` the probe interval, `claim` and `receive` are refused, so
  nothing is answered. `pair_snapshot` shows the local pairs with `allow`; other
  reads answer empty, a lost audit entry is dropped, and changes (`pause`, `set`, `reset`)
  raise `StateError`, so an admin is never told a change was made when it was not.
  The first failure logs one warning and the first success after it one info line;
  `unavailable_calls` counts the calls that could not reach Redis and `degraded` tells
  whether the store is in an outage. While degraded, one call per `probe_interval` (1 s)
  goes to Redis and the rest fail fast, so an unreachable host does not add a connect
  timeout to every message; the first probe that succeeds ends the outage.
- The pair script is the one sanctioned second version of `step_pair`, held to it event
  by event by the conformance suite: after `/loop set` the events already in the window
  count against the new budget and in the new window, and a running cooldown keeps its
  end. The keys of earlier versions (`pair:{…}`, a list of the instants events stop
  counting, and `pair:{…}:cd`) are not read: they expire by themselves within a window
  or cooldown, and a pair starts a fresh window after the upgrade.
- A dedupe receipt in flight under another replica is honoured while that replica's
  liveness key lives (`OWNER_SECONDS`, 10 s, after its last refresh; read by a second
  call, since that key is in another slot, and the take-over is a third that succeeds
  only if that replica still holds the receipt): concurrent duplicates at two replicas
  are answered once, and after a replica was killed mid-turn a redelivery of its message
  is answered once its key has lapsed. A redelivery that arrives sooner (a long-polling
  bot restarted within 10 s) is refused, as before.
- A script call whose answer is lost (the connection drops after Redis ran it) is sent
  again at once on a fresh connection by redis-py (once on one server or a Sentinel's
  master, gateway/state/redis_link.py; the cluster client may try a few times), so it
  may run again. What a second run does, per decision (issue 24): none lets more through
  than allowed, and none counts money twice.
  - the pair budget (`pair_decide`): the event is recorded again, so the pair reaches its
    budget (and its cooldown) an event sooner, and the message may be refused though
    recorded: stricter. The room budget and the bot-turn cap: the same without a
    message key; with one, the second run finds the message counted and does not count
    it again (an admitted one is admitted again, a count is the same).
  - `claim`: the second run finds its own claim and loses it, so a cooldown notice or a
    once-only admin command may be done by no one (at most once, maybe never).
  - `receive`: the second run finds the receipt in flight under this replica and calls
    the message a duplicate: it is not answered (at most once) until a redelivery after
    the receipt's TTL. `confirm`, the liveness key, pauses and transcript appends (by
    message key) give the same result again; an audit entry may be logged twice.
  - the proxy's call circuits and uniqueness rules (gateway/calls/redis_store.py)
    without budgets: the call is counted again, so a loop or a duplicate is refused a
    call sooner: stricter. `record_outcome` uncounts by the call's time: a second run
    finds nothing (two calls never share the server's microsecond, scripts running one
    at a time; only an injected clock can make them).
  - a budgeted call's decision and hold carries a reservation id, its charge or refund a
    charge id, a request-log batch its first entry's id: the second run changes nothing
    and a decision answers as the first did (gateway/calls/budgets_redis.py); the owner
    lease's beat gives a lapsed owner's holds back once.
- A room's consecutive-bot-turn count expires after a day without bot messages.
- The URL is never logged (it may hold a password); error texts are logged with the
  password masked.
- A transcript key of another type (not ours, or written by hand) is left alone: the
  append is dropped and a read counts it as one unreadable record, as it does a list
  value that is not an entry. While Redis is down appends are dropped and reads answer
  an empty transcript (the turn goes on without history); `transcript_forget` raises.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Literal, cast
from urllib.parse import unquote

from gateway.app.errors import StateError
from gateway.state import audit, receipts, transcripts
from gateway.state.activity import ActivityBucket, ActivityEvent, Span
from gateway.state.base import AuditEntry, AuditKind, Transcript, TranscriptEntry
from gateway.state.memory import MemoryStateStore
from gateway.state.redis_activity import RedisActivity
from gateway.state.redis_link import (
    LUA_CLOCK,
    ONE_SERVER,
    OnError,
    RedisLink,
    RedisLinked,
    RedisTopology,
    glob_escape,
)
from guards.bot_loop import (
    BotLoopPolicy,
    PairDecision,
    PairRecord,
    PairSnapshot,
    pair_key,
    pair_view,
    step_pair,
)
from guards.room_budget import RoomDecision, room_budget_on, room_cooldown, step_room

log = logging.getLogger(__name__)

AUDIT_KEEP = 10_000
_SEP = "\x1f"
_TURNS_SEEN_MS = 600_000
_TURNS_IDLE_MS = 86_400_000
_AUDIT_CHUNK = 200
# Seconds a replica's liveness key lasts without a refresh (refreshed every third of it):
# a receipt in flight under a replica whose key is gone is taken over by a redelivery.
OWNER_SECONDS = 10.0

_PRELUDE = (
    LUA_CLOCK
    + """
-- Milliseconds for PEXPIRE/PX, capped at about 300 years: Lua writes a number of 1e14 or
-- more with an exponent, which Redis refuses as an expiry.
local function ms(seconds) return math.min(1e13, math.max(1, math.ceil(seconds * 1000))) end
"""
)

# `step_pair` over the pair's record. KEYS: record. ARGV: now, budget, window, cooldown.
# Returns {code, retry_after, count}: code 0 ok, 1 budget exceeded, 2 cooldown; a refusal
# adds the cooldown's end as stored (`PairDecision.until`).
_PAIR_STEP = (
    _PRELUDE
    + """
local now = clock(ARGV[1])
local budget, window, cooldown = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
-- The record, expiring when idle: idle_at, cooldown_until ('-': none), window (as the
-- caller wrote it, exact), times.
local function save(idle_at, until_at, times, first)
  local record = num(idle_at) .. ' ' .. (until_at and num(until_at) or '-') .. ' '
    .. ARGV[3] .. ' ' .. table.concat(times, ' ', first)
  redis.call('SET', KEYS[1], record, 'PX', ms(idle_at - now))
end
local held = redis.call('GET', KEYS[1])
if held then
  local fields = {}
  for field in string.gmatch(held, '%S+') do fields[#fields + 1] = field end
  local idle_at = tonumber(fields[1])
  if now < idle_at then
    -- Skip the events that left the window, oldest first: an event at t counts in
    -- [t, t + window). The times start at the fourth field.
    local first = 4
    while fields[first] and tonumber(fields[first]) + window <= now do first = first + 1 end
    local count = #fields - first + 1
    local until_at = tonumber(fields[2])
    if until_at then
      -- A running cooldown: refused, not recorded, not extended.
      save(idle_at, until_at, fields, first)
      return {2, num(until_at - now), count, fields[2]}
    end
    if count < budget then
      fields[#fields + 1] = num(now)
      save(now + window, nil, fields, first)
      return {0, '0', count + 1}
    end
    save(now + cooldown, now + cooldown, fields, first)
    return {1, num(cooldown), count, num(now + cooldown)}
  end
end
-- No record, or an idle one: a fresh window.
save(now + window, nil, {num(now)}, 1)
return {0, '0', 1}
"""
)

# `step_room` (guards/room_budget.py) over the room's record. KEYS: record. ARGV: now,
# budget, window, cooldown, bot, message key ('' for none). The record is JSON: i idle_at,
# c cooldown_until ('-': none), w window (as the caller wrote it), t the admitted events'
# times, b their bots, k their message keys; numbers as '%.17g' strings, read back exactly.
# Returns {code, retry_after, count}: code 0 ok, 2 cooldown, 1 budget exceeded; a refusal
# adds the cooldown's end as stored and the bots of the window, first posted first.
_ROOM_STEP = (
    _PRELUDE
    + """
local now = clock(ARGV[1])
local budget, window, cooldown = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local bot, key = ARGV[5], ARGV[6]
local function save(record)
  redis.call('SET', KEYS[1], cjson.encode(record), 'PX', ms(tonumber(record.i) - now))
end
local function refused(code, retry_after, count, until_at, bots)
  local answer, seen = {code, retry_after, count, until_at}, {}
  for _, name in ipairs(bots) do
    if not seen[name] then seen[name] = true; answer[#answer + 1] = name end
  end
  if not seen[bot] then answer[#answer + 1] = bot end
  return answer
end
local held = redis.call('GET', KEYS[1])
if held then
  local record = cjson.decode(held)
  if now < tonumber(record.i) then
    -- Drop the events that left the window, oldest first: an event at t counts in
    -- [t, t + window).
    local times, bots, keys = {}, {}, {}
    local first = 1
    while record.t[first] and tonumber(record.t[first]) + window <= now do first = first + 1 end
    for i = first, #record.t do
      times[#times + 1] = record.t[i]
      bots[#bots + 1] = record.b[i]
      keys[#keys + 1] = record.k[i]
    end
    record.t, record.b, record.k, record.w = times, bots, keys, ARGV[3]
    local count = #times
    if key ~= '' then
      for _, held_key in ipairs(keys) do
        if held_key == key then
          save(record)
          return {0, '0', count}
        end
      end
    end
    if record.c ~= '-' then
      -- A running cooldown: refused, not recorded, not extended.
      save(record)
      return refused(2, num(tonumber(record.c) - now), count, record.c, bots)
    end
    if count < budget then
      times[count + 1], bots[count + 1], keys[count + 1] = num(now), bot, key
      record.i = num(now + window)
      save(record)
      return {0, '0', count + 1}
    end
    record.c = num(now + cooldown)
    record.i = record.c
    save(record)
    return refused(1, num(cooldown), count, record.c, bots)
  end
end
-- No record, or an idle one: a fresh window.
save({i = num(now + window), c = '-', w = ARGV[3], t = {num(now)}, b = {bot}, k = {key}})
return {0, '0', 1}
"""
)

# KEYS: claim. ARGV: now, ttl seconds. Returns 1 for the first claimant, else 0.
_CLAIM = (
    _PRELUDE
    + """
local now = clock(ARGV[1])
local held = redis.call('GET', KEYS[1])
if held and tonumber(held) > now then return 0 end
local ttl = tonumber(ARGV[2])
redis.call('SET', KEYS[1], num(now + ttl), 'PX', ms(ttl))
return 1
"""
)

# KEYS: receipt. ARGV: now, ttl seconds, owner, and the owner found dead ('' none).
# Returns 1 when the delivery is taken (gateway/state/receipts.py `receive`), 0 for a
# duplicate, or the owner holding it in flight, whose liveness the caller checks (its key
# is in another slot, so not in this script on a cluster) before asking again with that
# owner as the dead one: the receipt is taken over only if that owner still holds it.
_RECEIVE = (
    _PRELUDE
    + """
local now = clock(ARGV[1])
local held = redis.call('HMGET', KEYS[1], 'owner', 'confirmed', 'until')
if held[3] and tonumber(held[3]) > now then
  if held[2] == '1' or held[1] == ARGV[3] then return 0 end
  if held[1] ~= ARGV[4] then return held[1] end
end
local ttl = tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'owner', ARGV[3], 'confirmed', '0', 'until', num(now + ttl))
redis.call('PEXPIRE', KEYS[1], ms(ttl))
return 1
"""
)

# KEYS: liveness. ARGV: now. Returns 1 while the owner is alive, else 0.
_IS_ALIVE = (
    _PRELUDE
    + """
local alive = redis.call('GET', KEYS[1])
if alive and tonumber(alive) > clock(ARGV[1]) then return 1 end
return 0
"""
)

# KEYS: receipt. ARGV: now, ttl seconds, owner.
_CONFIRM = (
    _PRELUDE
    + """
local ttl = tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'owner', ARGV[3], 'confirmed', '1', 'until', num(clock(ARGV[1]) + ttl))
redis.call('PEXPIRE', KEYS[1], ms(ttl))
return 1
"""
)

# KEYS: liveness. ARGV: now, seconds. The owner is alive until now + seconds.
_ALIVE = (
    _PRELUDE
    + """
local seconds = tonumber(ARGV[2])
redis.call('SET', KEYS[1], num(clock(ARGV[1]) + seconds), 'PX', ms(seconds))
return 1
"""
)

# KEYS: counter[, seen]. ARGV: is_bot (1/0), seen ms, idle ms. Returns the count.
_BOT_TURN = """
if KEYS[2] then
  local seen = redis.call('GET', KEYS[2])
  if seen then return tonumber(seen) end
end
local count = 0
if ARGV[1] == '1' then
  count = redis.call('INCR', KEYS[1])
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
else
  redis.call('DEL', KEYS[1])
end
if KEYS[2] then redis.call('SET', KEYS[2], count, 'PX', ARGV[2]) end
return count
"""

# KEYS: pause. ARGV: now, seconds ('' = until resumed).
_PAUSE = (
    _PRELUDE
    + """
if ARGV[2] == '' then
  redis.call('SET', KEYS[1], 'inf')
  return 1
end
local seconds = tonumber(ARGV[2])
redis.call('SET', KEYS[1], num(clock(ARGV[1]) + seconds), 'PX', ms(seconds))
return 1
"""
)

# KEYS: pause. ARGV: now. Returns seconds left ('inf' when indefinite) or nil.
_PAUSE_REMAINING = (
    _PRELUDE
    + """
local paused = redis.call('GET', KEYS[1])
if not paused then return false end
if paused == 'inf' then return 'inf' end
local left = tonumber(paused) - clock(ARGV[1])
if left <= 0 then
  redis.call('DEL', KEYS[1])
  return false
end
return num(left)
"""
)

# The body of a Lua function `ours()`: 1 when each of KEYS list, keys set and until is
# absent or of its own type, else 0 (a key of another type is not ours to touch).
_TRANSCRIPT_TYPES = """
local expected = {'list', 'set', 'string'}
for i = 1, 3 do
  local kind = redis.call('TYPE', KEYS[i]).ok
  if kind ~= 'none' and kind ~= expected[i] then return 0 end
end
return 1
"""

# KEYS: list, keys set, until. ARGV: now, entry JSON, message key, max messages, ttl s.
# Returns 1 appended, 0 the key was there, -1 a key is not ours.
_TRANSCRIPT_APPEND = (
    _PRELUDE
    + "local function ours()\n"
    + _TRANSCRIPT_TYPES
    + """end
if ours() == 0 then return -1 end
local now = clock(ARGV[1])
local held = redis.call('GET', KEYS[3])
local until_at = held and tonumber(held)
if not until_at or until_at <= now then redis.call('DEL', KEYS[1], KEYS[2]) end
if redis.call('SADD', KEYS[2], ARGV[3]) == 0 then return 0 end
redis.call('RPUSH', KEYS[1], ARGV[2])
for _ = 1, redis.call('LLEN', KEYS[1]) - tonumber(ARGV[4]) do
  local ok, old = pcall(cjson.decode, redis.call('LPOP', KEYS[1]))
  if ok and type(old) == 'table' and type(old.k) == 'string' then
    redis.call('SREM', KEYS[2], old.k)
  end
end
local ttl = tonumber(ARGV[5])
redis.call('SET', KEYS[3], num(now + ttl), 'PX', ms(ttl))
redis.call('PEXPIRE', KEYS[1], ms(ttl))
redis.call('PEXPIRE', KEYS[2], ms(ttl))
return 1
"""
)

# KEYS: list, keys set, until. ARGV: now, limit. Returns the newest `limit` records,
# oldest first: their count and one string, a line each (one reply to parse, not one
# per record); nil
# when there is no live transcript, -1 when a key is not ours. A record with a byte that
# `transcripts.encode` never writes (outside ASCII, or a line break) is not ours: it is
# returned empty, so the client never decodes what is not UTF-8 nor miscounts lines.
_TRANSCRIPT_RECENT = (
    _PRELUDE
    + "local function ours()\n"
    + _TRANSCRIPT_TYPES
    + """end
if ours() == 0 then return -1 end
local held = redis.call('GET', KEYS[3])
local until_at = held and tonumber(held)
if not until_at or until_at <= clock(ARGV[1]) then return false end
local records = redis.call('LRANGE', KEYS[1], -tonumber(ARGV[2]), -1)
for i, record in ipairs(records) do
  if string.find(record, '[\\128-\\255\\n]') then records[i] = '' end
end
return {#records, table.concat(records, '\\n')}
"""
)

# KEYS: list, keys set, until. Returns the entries the list held (0 when not a list).
_TRANSCRIPT_FORGET = """
local held = 0
if redis.call('TYPE', KEYS[1]).ok == 'list' then held = redis.call('LLEN', KEYS[1]) end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
return held
"""


# The audit trail's `others` log (gateway/state/audit.py). KEYS: the log, a list newest
# first of `<sender>\n<entry JSON>`, and a hash of each sender's entries in it. ARGV:
# sender (JSON, so ASCII without a line break), the line, keep, per sender. A sender at
# its bound is counted afresh and loses its oldest line (LREM from the tail: a line equal
# to it is the same entry); past `keep` the log's oldest go, each off its sender's count.
_AUDIT_OTHER = """
local sender, line = ARGV[1], ARGV[2]
local keep, per = tonumber(ARGV[3]), tonumber(ARGV[4])
local held = tonumber(redis.call('HGET', KEYS[2], sender) or '0')
if held >= per then
  local head = sender .. '\\n'
  local lines = redis.call('LRANGE', KEYS[1], 0, -1)
  local oldest = nil
  held = 0
  for i = #lines, 1, -1 do
    if string.sub(lines[i], 1, #head) == head then
      held = held + 1
      oldest = oldest or lines[i]
    end
  end
  if held >= per then
    redis.call('LREM', KEYS[1], -1, oldest)
    held = held - 1
  end
end
redis.call('LPUSH', KEYS[1], line)
redis.call('HSET', KEYS[2], sender, held + 1)
while redis.call('LLEN', KEYS[1]) > keep do
  local who = string.match(redis.call('RPOP', KEYS[1]), '^[^\\n]*')
  if redis.call('HINCRBY', KEYS[2], who, -1) <= 0 then redis.call('HDEL', KEYS[2], who) end
end
return 1
"""


class RedisStateStore(RedisLinked):
    """A StateStore in Redis: one atomic script per decision, server time, self-expiring keys."""

    def __init__(
        self,
        url: str,
        *,
        on_error: OnError = "allow",
        key_prefix: str = "lw:",
        clock: Callable[[], float] | None = None,
        timeout: float = 2.0,
        probe_interval: float = 1.0,
        topology: RedisTopology = ONE_SERVER,
    ) -> None:
        self._link = RedisLink(
            url,
            topology=topology,
            name="redis state store",
            log=log,
            on_error=on_error,
            if_allowed="deciding on budgets local to this process",
            if_denied="refusing messages",
            clock=clock,
            timeout=timeout,
            probe_interval=probe_interval,
            on_recovered=self._forget_local,
        )
        self._prefix = key_prefix
        self._clock = clock
        self._owner = receipts.new_owner()
        self._owner_prefix = f"{key_prefix}owner:"
        self._local: MemoryStateStore | None = None
        self._keep_alive: asyncio.Task[None] | None = None
        script = self._link.script
        self._pair_step = script(_PAIR_STEP)
        self._room_step = script(_ROOM_STEP)
        self._claim = script(_CLAIM)
        self._bot_turn = script(_BOT_TURN)
        self._pause = script(_PAUSE)
        self._pause_remaining = script(_PAUSE_REMAINING)
        self._receive = script(_RECEIVE)
        self._is_alive = script(_IS_ALIVE)
        self._confirm = script(_CONFIRM)
        self._alive = script(_ALIVE)
        self._transcript_append = script(_TRANSCRIPT_APPEND)
        self._transcript_recent = script(_TRANSCRIPT_RECENT)
        self._transcript_forget = script(_TRANSCRIPT_FORGET)
        self._audit_other = script(_AUDIT_OTHER)
        # The senders' hash is tagged with the whole name of the log (which has no tag of
        # its own, as before clusters), so both are in one slot.
        others = f"{key_prefix}audit:others"
        self._others_keys = [others, f"{key_prefix}audit:senders:{{{others}}}"]
        self._activity = RedisActivity(self._link, key_prefix)

    def __repr__(self) -> str:
        # The URL may hold a password: never part of a repr that could end up in a log.
        return f"RedisStateStore(key_prefix={self._prefix!r}, on_error={self._link.on_error!r})"

    async def start(self) -> None:
        """Load the scripts and keep this owner's liveness key fresh while the store runs."""
        await self._link.start()
        await self._beat()
        self._keep_alive = asyncio.create_task(self._keep_beating(), name="lw-redis-owner")

    async def aclose(self) -> None:
        """Stop the liveness beat, drop the liveness key (best effort) and disconnect."""
        task, self._keep_alive = self._keep_alive, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            with contextlib.suppress(StateError):
                await self._link.guarded(
                    lambda: self._link.client.delete(self._owner_prefix + self._owner)
                )
        await self._link.aclose()

    async def _keep_beating(self) -> None:
        while True:
            await asyncio.sleep(OWNER_SECONDS / 3)
            await self._beat()

    async def _beat(self) -> None:
        """Refresh the liveness key; skipped during an outage (the probe finds the return)."""
        if self._link.degraded:
            return
        keys = [self._owner_prefix + self._owner]
        args = (self._link.now(), repr(OWNER_SECONDS))
        with contextlib.suppress(StateError):
            await self._link.guarded(lambda: self._alive(keys=keys, args=args))

    # The local fallback

    def _fallback(self) -> MemoryStateStore:
        """The per-process store that decides while Redis is down with `on_error: allow`."""
        if self._local is None:
            self._local = MemoryStateStore(clock=self._clock)
        return self._local

    def _forget_local(self) -> None:
        # Redis is back: its shared state decides again, from where it was before the
        # outage; what was counted locally is dropped, so a later outage starts fresh.
        self._local = None

    # Keys

    def _pair_key(self, scope: str, a: str, b: str) -> str:
        return f"{self._prefix}budget:{{{_SEP.join(map(_escape, (scope, a, b)))}}}"

    async def _pairs(self, scope: str | None, bot_id: str | None) -> list[tuple[str, str, str]]:
        """The pairs held, by SCAN (an admin-command path, never per message)."""
        head = f"{self._prefix}budget:{{"
        room_part = "" if scope is None else glob_escape(_escape(scope) + _SEP)
        found: set[tuple[str, str, str]] = set()
        async for key in self._link.scan(glob_escape(head) + room_part + "*}"):
            parts = key[len(head) : -1].split(_SEP)
            if len(parts) != 3:
                continue
            room, a, b = map(unquote, parts)
            if (scope is None or room == scope) and (bot_id is None or bot_id in (a, b)):
                found.add((room, a, b))
        return sorted(found)

    # Pairs

    async def pair_decide(
        self, *, scope: str, self_bot_id: str, sender_bot_id: str, policy: BotLoopPolicy
    ) -> PairDecision:
        """Step the pair's record with `step_pair`'s Lua version, in one script call."""
        if not policy.enabled:
            # Admitted and not recorded: `step_pair` needs no record, so no round trip.
            return step_pair(None, policy, 0.0)[1]
        a, b = pair_key(self_bot_id, sender_bot_id)
        keys = [self._pair_key(scope, a, b)]
        args = (
            self._link.now(),
            policy.max_events_per_window,
            repr(policy.window_seconds),
            repr(policy.cooldown_seconds),
        )
        try:
            answer = await self._link.guarded(lambda: self._pair_step(keys=keys, args=args))
        except StateError:
            if self._link.on_error == "allow":
                return await self._fallback().pair_decide(
                    scope=scope, self_bot_id=self_bot_id, sender_bot_id=sender_bot_id, policy=policy
                )
            return PairDecision(False, "cooldown", self._link.probe_interval, 0)
        code, retry_after, count = answer[:3]
        if code == 0:
            return PairDecision(True, "ok", 0.0, int(count))
        reason: Literal["budget_exceeded", "cooldown"] = (
            "budget_exceeded" if code == 1 else "cooldown"
        )
        return PairDecision(False, reason, float(retry_after), int(count), float(answer[3]))

    async def pair_reset(self, *, scope: str | None = None, bot_id: str | None = None) -> int:
        """Delete the pairs held (all, one room's, one bot's); returns how many were there."""

        async def reset() -> int:
            pairs = await self._pairs(scope, bot_id)
            if not pairs:
                return 0
            # One UNLINK of every key: a cluster client splits it by slot.
            return int(await self._link.client.unlink(*(self._pair_key(*p) for p in pairs)))

        return await self._link.guarded(reset)

    async def pair_snapshot(self, scope: str | None = None) -> list[PairSnapshot]:
        """Live pairs with counts and cooldown left, ordered by room and ids."""

        async def snapshot() -> list[PairSnapshot]:
            pairs = await self._pairs(scope, None)
            if not pairs:
                return []
            # A cluster client pipelines the GETs per node, but not TIME: that goes alone.
            async with self._link.client.pipeline(transaction=False) as pipe:
                for pair in pairs:
                    pipe.get(self._pair_key(*pair))
                held = await pipe.execute()
            # The scripts' clock: the injected one, or the server's TIME.
            now = (
                self._clock()
                if self._clock is not None
                else _seconds(await self._link.client.time())
            )
            found = []
            for (room, a, b), stored in zip(pairs, held, strict=True):
                record = None if stored is None else _record(stored)
                view = None if record is None else pair_view(record, now)
                if view is not None:
                    found.append(PairSnapshot(room, a, b, *view))
            return found

        try:
            return await self._link.guarded(snapshot)
        except StateError:
            if self._link.on_error == "allow":
                return await self._fallback().pair_snapshot(scope)
            return []

    # Room budgets

    async def room_decide(
        self, *, scope: str, bot: str, message_key: str | None, policy: BotLoopPolicy
    ) -> RoomDecision:
        """Step the room's record with `step_room`'s Lua version, in one script call."""
        if not room_budget_on(policy):
            return step_room(None, policy, 0.0, bot=bot, key="")[1]
        keys = [self._room_key(scope)]
        args = (
            self._link.now(),
            policy.room_max_events_per_window,
            repr(policy.room_window_seconds),
            repr(room_cooldown(policy)),
            bot,
            message_key or "",
        )
        try:
            answer = await self._link.guarded(lambda: self._room_step(keys=keys, args=args))
        except StateError:
            if self._link.on_error == "allow":
                return await self._fallback().room_decide(
                    scope=scope, bot=bot, message_key=message_key, policy=policy
                )
            return RoomDecision(False, "room_cooldown", self._link.probe_interval, 0)
        code, retry_after, count = answer[:3]
        if code == 0:
            return RoomDecision(True, "ok", 0.0, int(count))
        reason: Literal["room_budget_exceeded", "room_cooldown"] = (
            "room_budget_exceeded" if code == 1 else "room_cooldown"
        )
        return RoomDecision(
            False, reason, float(retry_after), int(count), tuple(answer[4:]), float(answer[3])
        )

    async def room_reset(self, scope: str | None = None) -> int:
        """Delete the room budget of one room (or, by SCAN, of every room); how many were held."""

        async def reset() -> int:
            if scope is not None:
                return int(await self._link.client.unlink(self._room_key(scope)))
            head = glob_escape(f"{self._prefix}roombudget:{{") + "*}"
            held = [key async for key in self._link.scan(head)]
            return int(await self._link.client.unlink(*held)) if held else 0

        return await self._link.guarded(reset)

    def _room_key(self, scope: str) -> str:
        return f"{self._prefix}roombudget:{{{_escape(scope)}}}"

    # Counters and claims

    async def bot_turn(self, scope: str, *, is_bot: bool, message_key: str | None = None) -> int:
        """Count consecutive bot turns (INCR, or reset by a human); a message counts once."""
        counter = self._turns_key(scope)
        keys = [counter] if message_key is None else [counter, f"{counter}:seen:{message_key}"]
        args = ("1" if is_bot else "0", _TURNS_SEEN_MS, _TURNS_IDLE_MS)
        try:
            count = await self._link.guarded(lambda: self._bot_turn(keys=keys, args=args))
        except StateError:
            if self._link.on_error == "allow":
                return await self._fallback().bot_turn(
                    scope, is_bot=is_bot, message_key=message_key
                )
            return 0
        return int(count)

    async def bot_turns_peek(self, scope: str) -> int:
        """The room's count (GET); the local count while Redis is down with `allow`, else 0."""
        counter = self._turns_key(scope)
        try:
            held = await self._link.guarded(
                lambda: cast(Awaitable[str | None], self._link.client.get(counter))
            )
        except StateError:
            if self._link.on_error == "allow":
                return await self._fallback().bot_turns_peek(scope)
            return 0
        return 0 if held is None else int(held)

    def _turns_key(self, scope: str) -> str:
        return f"{self._prefix}turns:{{{scope}}}"

    async def claim(self, key: str, ttl: float) -> bool:
        """First claimant wins until the TTL runs out (SET … PX in one script)."""
        args = (self._link.now(), repr(float(ttl)))
        try:
            won = await self._link.guarded(
                lambda: self._claim(keys=[f"{self._prefix}claim:{key}"], args=args)
            )
        except StateError:
            return self._link.on_error == "allow" and await self._fallback().claim(key, ttl)
        return bool(won)

    async def receive(self, key: str, ttl: float) -> bool:
        """Take the receipt in flight unless it is held by this or another live owner."""
        keys = [f"{self._prefix}receipt:{key}"]

        async def take() -> bool:
            now = self._link.now()
            args = (now, repr(float(ttl)), self._owner, "")
            holder = await self._receive(keys=keys, args=args)
            if not isinstance(holder, str):
                return bool(holder)
            liveness = [self._owner_prefix + holder]
            if await self._is_alive(keys=liveness, args=(now,)):
                return False
            return bool(await self._receive(keys=keys, args=(*args[:3], holder)))

        try:
            return await self._link.guarded(take)
        except StateError:
            return self._link.on_error == "allow" and await self._fallback().receive(key, ttl)

    async def confirm(self, key: str, ttl: float) -> None:
        """Mark the receipt answered for `ttl` seconds from now."""
        args = (self._link.now(), repr(float(ttl)), self._owner)
        try:
            await self._link.guarded(
                lambda: self._confirm(keys=[f"{self._prefix}receipt:{key}"], args=args)
            )
        except StateError:
            if self._link.on_error == "allow":
                await self._fallback().confirm(key, ttl)

    # Overrides and pauses

    async def get_overrides(self, scope: str) -> Mapping[str, object]:
        """The scope's overrides (HGETALL), decoded from JSON; empty while Redis is down."""
        try:
            raw = await self._link.guarded(
                lambda: cast(
                    Awaitable[dict[str, str]],
                    self._link.client.hgetall(f"{self._prefix}ovr:{scope}"),
                )
            )
        except StateError:
            return {}
        return {field: json.loads(value) for field, value in raw.items()}

    async def set_override(self, scope: str, field: str, value: object) -> None:
        """HSET one override as JSON."""
        encoded = json.dumps(value)
        await self._link.guarded(
            lambda: self._link.client.hset(f"{self._prefix}ovr:{scope}", field, encoded)
        )

    async def clear_overrides(self, scope: str) -> None:
        """Delete the scope's override hash."""
        await self._link.guarded(lambda: self._link.client.delete(f"{self._prefix}ovr:{scope}"))

    async def cursor_get(self, key: str) -> str | None:
        """The position saved under `key` (GET); None while Redis is down."""
        try:
            value = await self._link.guarded(
                lambda: cast(
                    Awaitable[str | None], self._link.client.get(f"{self._prefix}cursor:{key}")
                )
            )
        except StateError:
            return None
        return value

    async def cursor_set(self, key: str, value: str) -> None:
        """SET the position."""
        await self._link.guarded(
            lambda: self._link.client.set(f"{self._prefix}cursor:{key}", value)
        )

    async def pause(self, scope: str, seconds: float | None) -> None:
        """Pause the room: a key expiring with the pause, or without expiry until resumed."""
        args = (self._link.now(), "" if seconds is None else repr(float(seconds)))
        await self._link.guarded(
            lambda: self._pause(keys=[f"{self._prefix}pause:{scope}"], args=args)
        )

    async def resume(self, scope: str) -> None:
        """Delete the pause key."""
        await self._link.guarded(lambda: self._link.client.delete(f"{self._prefix}pause:{scope}"))

    async def pause_remaining(self, scope: str) -> float | None:
        """Seconds left, `inf` when indefinite, None when not paused or Redis is down."""
        args = (self._link.now(),)
        try:
            left = await self._link.guarded(
                lambda: self._pause_remaining(keys=[f"{self._prefix}pause:{scope}"], args=args)
            )
        except StateError:
            return None
        if left is None:
            return None
        return math.inf if left == "inf" else float(left)

    # Audit

    async def audit(self, entry: AuditEntry) -> None:
        """Append to the entry's log: `audit` trimmed to AUDIT_KEEP, `others` by its script.

        Dropped while Redis is down.
        """
        encoded = json.dumps(dataclasses.asdict(entry))
        if entry.kind == "admin":
            key = f"{self._prefix}audit"

            async def append() -> None:
                async with self._link.client.pipeline(transaction=True) as pipe:
                    pipe.lpush(key, encoded)
                    pipe.ltrim(key, 0, AUDIT_KEEP - 1)
                    await pipe.execute()

        else:
            sender = json.dumps(audit.sender(entry))
            args = (sender, f"{sender}\n{encoded}", audit.OTHERS_KEEP, audit.OTHERS_PER_SENDER)

            async def append() -> None:
                await self._audit_other(keys=self._others_keys, args=args)

        try:
            await self._link.guarded(append)
        except StateError:
            return

    async def recent_audit(
        self, limit: int = 20, scope: str | None = None, kind: AuditKind | None = None
    ) -> list[AuditEntry]:
        """Newest first, optionally for one room, of one log or both; empty while Redis is down."""

        async def newest(key: str, of: AuditKind) -> list[AuditEntry]:
            found: list[AuditEntry] = []
            start = 0
            chunk = max(limit, _AUDIT_CHUNK)
            while len(found) < limit:
                batch = await cast(
                    Awaitable[list[str]], self._link.client.lrange(key, start, start + chunk - 1)
                )
                for raw in batch:
                    entry = _decode_audit(raw.rpartition("\n")[2], of)
                    if scope is None or entry.room == scope:
                        found.append(entry)
                if len(batch) < chunk:
                    break
                start += chunk
            return found[:limit]

        async def recent() -> list[AuditEntry]:
            admin = await newest(f"{self._prefix}audit", "admin") if kind != "others" else []
            others = await newest(self._others_keys[0], "others") if kind != "admin" else []
            return audit.newest_first(admin, others, limit)

        try:
            return await self._link.guarded(recent)
        except StateError:
            return []

    # Transcripts

    def _transcript_keys(self, scope: str) -> list[str]:
        """The list, keys-set and until keys of one transcript."""
        head = f"{self._prefix}transcript:{{{scope}}}"
        return [head, f"{head}:keys", f"{head}:until"]

    async def transcript_append(
        self, scope: str, entry: TranscriptEntry, *, max_messages: int, ttl: float
    ) -> bool:
        """RPUSH once per key, trim, expire: one script call; dropped while Redis is down."""
        stored = transcripts.bounded(entry)
        keys = self._transcript_keys(scope)
        args = (
            self._link.now(),
            transcripts.encode(stored),
            stored.key,
            max_messages,
            repr(float(ttl)),
        )
        try:
            added = await self._link.guarded(lambda: self._transcript_append(keys=keys, args=args))
        except StateError:
            return False
        if added == -1:
            log.warning("transcript key %s is not a transcript: message not recorded", keys[0])
        return bool(added == 1)

    async def transcript_recent(self, scope: str, limit: int) -> Transcript:
        """The newest `limit` records (LRANGE in one script call); unreadable ones counted."""
        if limit <= 0:
            return Transcript()
        keys = self._transcript_keys(scope)
        args = (self._link.now(), limit)
        try:
            held = await self._link.guarded(lambda: self._transcript_recent(keys=keys, args=args))
        except StateError:
            return Transcript()
        if held is None:
            return Transcript()
        if held == -1:  # a key of another type
            return Transcript(skipped=1)
        count, lines = held
        return Transcript(*transcripts.decode_many(lines.split("\n") if count else []))

    async def transcript_forget(self, scope: str, *, threads: bool = False) -> int:
        """Delete the transcript (and, with `threads`, its threads', found by SCAN)."""

        async def forget() -> int:
            scopes = [scope]
            if threads:
                head = f"{self._prefix}transcript:{{"
                pattern = glob_escape(head + scope + transcripts.SEP) + "*}"
                scopes += [key[len(head) : -1] async for key in self._link.scan(pattern)]
            dropped = 0
            for each in scopes:
                dropped += int(await self._transcript_forget(keys=self._transcript_keys(each)))
            return dropped

        return await self._link.guarded(forget)

    # Activity

    async def activity_append(self, events: Sequence[ActivityEvent]) -> None:
        """Append and count the batch in one script call; raises StateError while down."""
        await self._activity.append(events)

    async def activity_since(
        self, cursor: int | None, limit: int, room: str | None = None
    ) -> tuple[list[ActivityEvent], int | None]:
        """Events after `cursor`, oldest first, and the next cursor; none while down."""
        return await self._activity.since(cursor, limit, room)

    async def activity_series(
        self, span: Span, now: float, room: str | None = None
    ) -> list[ActivityBucket]:
        """The chart's buckets, oldest first; empty ones while down."""
        return await self._activity.series(span, now, room)

    async def activity_rooms(self) -> list[tuple[str, float]]:
        """Rooms seen, newest first; none while down."""
        return await self._activity.rooms()


def _escape(name: str) -> str:
    """A room or bot id as a part of a pair's key: `%` and the separator written as %XX."""
    return name.replace("%", "%25").replace(_SEP, "%1F")


def _record(stored: str) -> PairRecord:
    """The `PairRecord` a pair's key holds (see the pair script for its layout)."""
    idle_at, cooldown_until, window, *times = stored.split()
    return PairRecord(
        [float(t) for t in times],
        None if cooldown_until == "-" else float(cooldown_until),
        float(window),
        float(idle_at),
    )


def _seconds(server_time: tuple[int, int]) -> float:
    """A TIME answer (seconds, microseconds) as the scripts' `clock` reads it."""
    seconds, micros = server_time
    return seconds + micros / 1_000_000


def _decode_audit(raw: str, kind: AuditKind) -> AuditEntry:
    """An AuditEntry of the log `kind` from its JSON form."""
    data = json.loads(raw)
    return AuditEntry(
        at=float(data["at"]),
        platform=str(data["platform"]),
        room=str(data["room"]),
        user_id=str(data["user_id"]),
        user_name=str(data["user_name"]),
        command=str(data["command"]),
        allowed=bool(data["allowed"]),
        outcome=str(data["outcome"]),
        kind=kind,
    )
