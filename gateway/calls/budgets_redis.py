"""The spend step in Lua: the Redis call store's one second version of gateway.calls.budgets.

`SPEND_CHECK` and `SPEND_HOLD` run inside the call store's decide script, so the budgets,
the circuit and the uniqueness rules of a call are decided in one script call, one round
trip: the budgets are checked first (a refused call is counted by nothing), the estimate
is held where the decide script admits the call. `CHARGE` is `step_charge` (and, with no
usage, `step_release`), followed in the same script by the anomaly detector's step
(gateway.calls.anomaly_redis). Held to the Python step by
tests/gateway/calls/test_call_store_conformance.py.

Keys, under the call store's `{calls}:` base: `spend:<group key>`, a hash (su, st: spent
nano-dollars and tokens; hu, ht: held; al: the highest alert sent; ea: when the period
ends) and `spendlimit:<budget and period>`, an admin's limits (u, t; '' for none; ea).
Both expire a minute after their period ends. Holds have owners (`gateway.calls.owners`):
`owners`, a hash of each store instance's lease end, and `owned:<owner>`, a hash of what
it holds per group record (`u<key>`, `t<key>`); `BEAT` renews a lease and gives back
the holds of owners whose lease lapsed. `charged:<owner>`, a sorted set of the ids of
the owner's charges applied and not yet confirmed to it, makes a charge sent again
(gateway.calls.redis_pending) count once. `reserved:<owner>`, a sorted set of the
answers the decide script gave the owner's budgeted calls not yet confirmed to it (scored
by the call's reservation id), makes a decision sent again after its answer was lost
(redis-py sends it again at once on a fresh connection) get its first answer back and
take no second hold (`RESERVE`); the release of a decision never answered gives back
only what that decision held (`CHARGE`). Both sets keep only the ids at or above the
lowest one still unanswered, and expire a day after their last write.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from gateway.calls import anomaly_redis
from gateway.calls.budgets import (
    Amount,
    GroupSpend,
    Limits,
    SpendAlert,
    SpendEvent,
    SpendGroup,
    SpendHold,
)

CHARGED_TTL_MS = 86_400_000
"""How long an owner's set of applied charges outlives its last charge: a day, far beyond
an outage its pending charges (gateway.calls.redis_pending) are kept through."""

RESERVE = (
    """
local function reserve_kept()
  if rid == '' then return nil end
  local kept = redis.call('ZRANGEBYSCORE', reserved, rid, rid, 'LIMIT', 0, 1)
  if #kept == 0 then
    redis.call('ZREMRANGEBYSCORE', reserved, '-inf', '(' .. rfloor)
    return nil
  end
  local reply, skip = {}, 2
  for field in string.gmatch(kept[1], '%S+') do
    if skip > 0 then
      skip = skip - 1
    elseif string.sub(field, 1, 1) == 'n' then
      reply[#reply + 1] = tonumber(string.sub(field, 2))
    else
      reply[#reply + 1] = string.sub(field, 2)
    end
  end
  return reply
end
local function reserve_keep(reply)
  if rid == '' then return reply end
  local fields = {rid, held and 'h' or '-'}
  for i, value in ipairs(reply) do
    if type(value) == 'number' then fields[i + 2] = 'n' .. num(value)
    else fields[i + 2] = 's' .. value end
  end
  redis.call('ZADD', reserved, rid, table.concat(fields, ' '))
  redis.call('PEXPIRE', reserved, """
    + str(CHARGED_TTL_MS)
    + """)
  return reply
end
"""
)
"""Needs `reserved` (the owner's set of answers given), `rid` (the call's reservation id,
'' when it holds no budget), `rfloor` (the lowest id not yet answered) and `held` (set
once the decision held the estimate). `reserve_kept()` is the answer kept for `rid` (nil:
a first try, and the ids below `rfloor` leave the set); `reserve_keep(reply)` keeps a
first try's answer and returns it: a member `<id> <h: held, or -> <field>...` of numbers
(`n`) and strings without spaces (`s`, as `num` writes them)."""

SPEND_PRELUDE = """
local function spend_load(key, now)
  local g = redis.call('HMGET', key, 'su', 'st', 'hu', 'ht', 'al', 'ea')
  if not g[6] then return nil end
  if tonumber(g[6]) <= now then
    redis.call('DEL', key)
    return nil
  end
  return {su = tonumber(g[1]), st = tonumber(g[2]), hu = tonumber(g[3]), ht = tonumber(g[4]),
    al = tonumber(g[5]), ea = tonumber(g[6])}
end
local function spend_new(ea)
  return {su = 0, st = 0, hu = 0, ht = 0, al = 0, ea = ea}
end
local function spend_save(key, g, now)
  redis.call('HSET', key, 'su', g.su, 'st', g.st, 'hu', g.hu, 'ht', g.ht, 'al', g.al,
    'ea', num(g.ea))
  redis.call('PEXPIRE', key, ttl(g.ea - now))
end
-- The limits in force: an admin's for this period, else the config's ('' is none).
local function spend_limits(key, now, usd, tokens)
  local l = redis.call('HMGET', key, 'u', 't', 'ea')
  if l[3] and tonumber(l[3]) > now then return tonumber(l[1]), tonumber(l[2]) end
  return tonumber(usd), tonumber(tokens)
end
local function spend_share(spent, limit)
  if not limit then return 0 end
  if limit == 0 then return math.huge end
  return 100 * spent / limit
end
local function spend_crossed(g, lu, lt)
  local share = math.max(spend_share(g.su, lu), spend_share(g.st, lt))
  local found = 0
  for _, t in ipairs({50, 80, 100}) do
    if t > g.al and share >= t then found = t end
  end
  return found
end
"""

# Needs `now`, `KEYS` from index `skeys + 1` (per group: its record, its admin's limits)
# and ARGV from `sargs + 1` (the estimate's nano-dollars and tokens, then per group: the
# config's limits and the period's end). Refused: {4, retry_after, group index, alert
# threshold or 0, spent nano-dollars, spent tokens, limit nano-dollars, limit tokens}.
SPEND_CHECK = """
local eu, et = tonumber(ARGV[sargs + 1]), tonumber(ARGV[sargs + 2])
local spend = {}
for j = 1, ngroups do
  local key, a = KEYS[skeys + 2 * j - 1], sargs + 2 + 3 * (j - 1)
  local g = spend_load(key, now)
  local lu, lt = spend_limits(KEYS[skeys + 2 * j], now, ARGV[a + 1], ARGV[a + 2])
  local ea = tonumber(ARGV[a + 3])
  spend[j] = g or false
  local su, st, hu, ht = 0, 0, 0, 0
  if g then su, st, hu, ht = g.su, g.st, g.hu, g.ht end
  if (lu and su + hu + eu > lu) or (lt and st + ht + et > lt) then
    local alert = 0
    if not g or g.al < 100 then
      g = g or spend_new(ea)
      g.al = 100
      spend_save(key, g, now)
      alert = 100
    end
    return {4, num(math.max(0, ea - now)), j, alert, su, st, lu or -1, lt or -1}
  end
end
"""

# Needs `owned`, the name of this owner's hash of holds (its fields `u<group record key>`
# and `t<group record key>`: the nano-dollars and tokens it holds there).
SPEND_HOLD = """
for j = 1, ngroups do
  local key = KEYS[skeys + 2 * j - 1]
  local g = spend[j] or spend_new(tonumber(ARGV[sargs + 2 + 3 * (j - 1) + 3]))
  g.hu, g.ht = g.hu + eu, g.ht + et
  spend_save(key, g, now)
  redis.call('HINCRBY', owned, 'u' .. key, eu)
  redis.call('HINCRBY', owned, 't' .. key, et)
end
"""

# KEYS: per group its record and its admin's limits, then (with the anomaly detector)
# anomaly_redis.STEP's. ARGV: now, held nano-dollars and tokens, used (1) or released (0),
# used nano-dollars and tokens, the group count, the owner's hash of holds, the owner's
# set of charges applied, this charge's id and the lowest id still unconfirmed, the
# owner's set of reservation answers and a reservation id ('' none), then per group the
# config's limits and the period's end, then anomaly_redis.STEP's. Each group gets back
# at most what the owner still holds there (`budgets.owned`); with a reservation id,
# only if that reservation held (`RESERVE`; the release of a decision whose answer never
# came: it may not have run). A charge whose id is in the set was applied already (its
# first try's answer was lost): it changes nothing. The ids below the lowest unconfirmed
# one leave the set: their answers came.
# Returns {per group {threshold, spent nano-dollars, spent tokens, limit nano-dollars,
# limit tokens} when it crossed one, else false; the detector's `anomaly`}.
CHARGE = (
    """
local now = clock(ARGV[1])
local hu, ht, used = tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4] == '1'
local uu, ut = tonumber(ARGV[5]), tonumber(ARGV[6])
local ngroups, owned = tonumber(ARGV[7]), ARGV[8]
local charged, id = ARGV[9], ARGV[10]
local out = {}
if redis.call('ZSCORE', charged, id) then
  for j = 1, ngroups do out[j] = false end
  return {out, false}
end
redis.call('ZREMRANGEBYSCORE', charged, '-inf', '(' .. ARGV[11])
redis.call('ZADD', charged, id, id)
local reservation = ARGV[13]
if reservation ~= '' then
  local kept = redis.call('ZRANGEBYSCORE', ARGV[12], reservation, reservation, 'LIMIT', 0, 1)
  if #kept == 0 or string.sub(kept[1], #reservation + 2, #reservation + 2) ~= 'h' then
    hu, ht = 0, 0
  end
end
redis.call('PEXPIRE', charged, """
    + str(CHARGED_TTL_MS)
    + """)
local aargs = nil
if #ARGV > 13 + 3 * ngroups then aargs = 13 + 3 * ngroups end
for j = 1, ngroups do
  local key, a = KEYS[2 * j - 1], 13 + 3 * (j - 1)
  local o = redis.call('HMGET', owned, 'u' .. key, 't' .. key)
  local left_u, left_t = tonumber(o[1]) or 0, tonumber(o[2]) or 0
  local back_u, back_t = math.min(hu, left_u), math.min(ht, left_t)
  if left_u == back_u and left_t == back_t then
    redis.call('HDEL', owned, 'u' .. key, 't' .. key)
  else
    -- A zero amount stays out of HINCRBY: Lua writes -0 as "-0", which Redis refuses.
    if back_u ~= 0 then redis.call('HINCRBY', owned, 'u' .. key, -back_u) end
    if back_t ~= 0 then redis.call('HINCRBY', owned, 't' .. key, -back_t) end
  end
  local g = spend_load(key, now)
  out[j] = false
  if g or used then
    g = g or spend_new(tonumber(ARGV[a + 3]))
    g.hu, g.ht = math.max(0, g.hu - back_u), math.max(0, g.ht - back_t)
    if used then
      g.su, g.st = g.su + uu, g.st + ut
      local lu, lt = spend_limits(KEYS[2 * j], now, ARGV[a + 1], ARGV[a + 2])
      local t = spend_crossed(g, lu, lt)
      if t > 0 then
        g.al = t
        out[j] = {t, g.su, g.st, lu or -1, lt or -1}
      end
    end
    spend_save(key, g, now)
  end
end
"""
    + anomaly_redis.STEP
    + """
return {out, anomaly}
"""
)

# KEYS: the owners' leases (a hash: owner -> lease end). ARGV: now, this owner, the
# seconds its lease is renewed for (0: it ends now), the prefix of an owner's hash of
# holds. Gives back every hold of each owner whose lease has lapsed (`step_release` of
# `budgets.dead_hold`), forgets it, and returns how many holds were given back.
BEAT = """
local now = clock(ARGV[1])
redis.call('HSET', KEYS[1], ARGV[2], num(now + tonumber(ARGV[3])))
local leases = redis.call('HGETALL', KEYS[1])
local given = 0
for i = 1, #leases, 2 do
  if tonumber(leases[i + 1]) <= now then
    local owned = ARGV[4] .. leases[i]
    local holds = redis.call('HGETALL', owned)
    for k = 1, #holds, 2 do
      if string.sub(holds[k], 1, 1) == 'u' then
        local key = string.sub(holds[k], 2)
        local tokens = tonumber(redis.call('HGET', owned, 't' .. key)) or 0
        local g = spend_load(key, now)
        if g then
          g.hu, g.ht = math.max(0, g.hu - tonumber(holds[k + 1])), math.max(0, g.ht - tokens)
          spend_save(key, g, now)
        end
        given = given + 1
      end
    end
    redis.call('DEL', owned)
    redis.call('HDEL', KEYS[1], leases[i])
  end
end
return given
"""

# KEYS: group records. Returns per key {su, st, hu, ht, al, ea} or false (ended, absent).
LIVE = """
local now = clock(ARGV[1])
local out = {}
for i, key in ipairs(KEYS) do
  local g = spend_load(key, now)
  if g then out[i] = {g.su, g.st, g.hu, g.ht, g.al, num(g.ea)} else out[i] = false end
end
return out
"""

# KEYS: admin-limit keys. Returns per key {u, t} ('' none) or false (ended).
LIVE_LIMITS = """
local now = clock(ARGV[1])
local out = {}
for i, key in ipairs(KEYS) do
  local l = redis.call('HMGET', key, 'u', 't', 'ea')
  if l[3] and tonumber(l[3]) > now then out[i] = {l[1], l[2]} else out[i] = false end
end
return out
"""


def _optional(value: int | None) -> str:
    return "" if value is None else str(value)


def group_args(groups: Sequence[SpendGroup]) -> list[str]:
    """Per group: the config's limits ('' for none) and the period's end."""
    args: list[str] = []
    for group in groups:
        args += [
            _optional(group.limits.nano_usd),
            _optional(group.limits.tokens),
            repr(group.ends_at),
        ]
    return args


def check_args(event: SpendEvent) -> list[str]:
    """The spend part of the decide script's ARGV (its group count goes last)."""
    estimate = event.estimate
    return [str(estimate.nano_usd), str(estimate.tokens), *group_args(event.groups)]


class ChargeId(NamedTuple):
    """Who applied a charge: the owner's set of applied charges, its id, the lowest id of
    the owner's charges not yet confirmed (the ids below it leave the set); for the
    release of a decision whose answer never came, the owner's set of reservation
    answers and that decision's reservation id (its hold is given back only if it held)."""

    charged: str
    id: int
    floor: int
    reserved: str = ""
    reservation: int | None = None


def charge_args(
    now: str, hold: SpendHold, used: Amount | None, owned: str, charge: ChargeId
) -> list[str]:
    """The charge script's ARGV (the detector's, `anomaly_redis.args`, may follow)."""
    spent = used or Amount()
    held = hold.amount
    return [
        now,
        str(held.nano_usd),
        str(held.tokens),
        "0" if used is None else "1",
        str(spent.nano_usd),
        str(spent.tokens),
        str(len(hold.groups)),
        owned,
        charge.charged,
        str(charge.id),
        str(charge.floor),
        charge.reserved,
        "" if charge.reservation is None else str(charge.reservation),
        *group_args(hold.groups),
    ]


def _limit(value: object) -> int | None:
    number = int(str(value))
    return None if number < 0 else number


def refused_alert(group: SpendGroup, reply: Sequence[object]) -> tuple[Limits, SpendAlert | None]:
    """The limits and (when due) the alert of a refusal reply `{4, retry, j, alert, ...}`."""
    limits = Limits(_limit(reply[6]), _limit(reply[7]))
    spent = Amount(int(str(reply[4])), int(str(reply[5])))
    if not int(str(reply[3])):
        return limits, None
    return limits, SpendAlert(group.budget, group.group, 100, spent, limits, group.ends_at)


def charge_alerts(hold: SpendHold, reply: Sequence[object]) -> list[SpendAlert]:
    """The alerts of a charge reply."""
    alerts = []
    for group, crossed in zip(hold.groups, reply, strict=True):
        if not isinstance(crossed, list):
            continue
        threshold, su, st, lu, lt = crossed
        alerts.append(
            SpendAlert(
                group.budget,
                group.group,
                int(threshold),
                Amount(int(su), int(st)),
                Limits(_limit(lu), _limit(lt)),
                group.ends_at,
            )
        )
    return alerts


def live_group(reply: Sequence[object]) -> GroupSpend:
    """A group record from the LIVE script's reply."""
    su, st, hu, ht, al, ea = reply
    return GroupSpend(
        Amount(int(str(su)), int(str(st))),
        Amount(int(str(hu)), int(str(ht))),
        int(str(al)),
        float(str(ea)),
    )


def live_limit(reply: Sequence[object]) -> Limits:
    """An admin's limits from the LIVE_LIMITS script's reply."""
    usd, tokens = (str(value) for value in reply)
    return Limits(int(usd) if usd else None, int(tokens) if tokens else None)
