"""Redis call store: several proxy (or gateway) replicas share circuits, pauses and the log.

Every decision is one Lua script call (EVALSHA, reloaded after NOSCRIPT; the connection
and its outage handling are gateway/state/redis_link.py, shared with the StateStore), so
replicas never race on a read-modify-write: the circuit's pause, the rule groups' pauses,
the counted calls of the circuit and every applicable uniqueness rule are read and
written in that one script. Which rules apply to a call (its field values and filters)
is worked out in Python first, since it depends on the call alone; the counting and the
verdict happen in the script. Time is the Redis server's `TIME` inside the script (tests
inject a clock whose value goes in ARGV), so replicas with skewed clocks agree.

Keys, under `key_prefix` (default `lw:`), all with the hash tag `{calls}` so one script
touches one cluster slot:
- `{calls}:hold:<circuit or group>`: a hash (paused_until, fresh_from, expires_at, reason,
  rule, refusal count);
- `{calls}:ev:c␟<circuit>␟<call>` and `{calls}:ev:r␟<rule>␟<values>`: sorted sets of
  counted calls, scored by time, members unique (`{calls}:seq`), plus the member `idle`
  scored by when the record goes idle (`CountedCalls.idle_at`; always the highest score:
  a call's window is never empty);
- `{calls}:log`: the request log, a sorted set of JSON entries scored by their time,
  trimmed to the newest `log_keep`;
- `{calls}:agg:…`: the log's sums per hour for the Calls page (gateway.calls.query_redis).
Keys carry a TTL (PEXPIRE) of what they serve plus a minute: the scripts check times
themselves, the TTL only frees memory.

- `{calls}:owners` and `{calls}:owned:<owner>`: who holds which budget estimates
  (gateway.calls.budgets_redis, gateway.calls.owners): a replica's lease, renewed while
  it runs, and its holds, given back by any replica once the lease lapses;
  `{calls}:charged:<owner>`: the ids of its charges applied but not yet answered, so a
  charge sent again counts once (gateway.calls.redis_pending);
  `{calls}:reserved:<owner>`: the answers to its budgeted calls' decisions not yet
  answered, so a decision sent again (its answer lost) holds once (budgets_redis.RESERVE).

The scripts are the one sanctioned second version of `guards.call_loop.step_call`,
`step_reopen` and `uncount`: the same steps over the same record, held to them by
tests/gateway/calls/test_call_store_conformance.py.

Decisions where DESIGN.md is silent:
- On a Redis Cluster the whole call store is one slot (`{calls}`), so on one master: a
  call's decision reads and writes its circuit, its rules' groups, its budget groups and
  its agent's hold in one script, which a tag per circuit or per group would split into
  several calls, and budgets exact across replicas need that one atomic step. A script
  that reads keys named inside a record (another owner's holds, the trimmed hours) names
  them under the same tag, which a cluster allows.
- Redis down: the circuits and uniqueness rules decide with a `MemoryCallStore` of this
  process, so they still hold, per process, instead of not at all; when Redis is back
  its shared state decides again, as it was before the outage, and the local counts are
  dropped (a later outage starts fresh). A call a budget applies to is decided by
  `on_error`: `allow` on this process's budget records too (each replica then lets its
  own limit's worth through), `deny` (fail closed, issue 24) refuses it, holding
  nothing, with a `SpendVerdict` marked `unavailable` and a retry after the probe
  interval, at least `STATE_RETRY_SECONDS`.
  A charge or log batch Redis did not answer is kept and sent again once it answers
  (gateway.calls.redis_pending), and so is the release of a budgeted call's decision
  whose answer never came when the call then holds nothing (refused without Redis): it
  gives the hold back only if that decision ran and held (budgets_redis.RESERVE);
  `reopen`, `paused` and `calls_since` raise `StateError`, so an admin is never told a
  change was made or that nothing is paused when Redis did not answer. The first failure
  logs one warning and the recovery one line; while down, one call per `probe_interval`
  goes to Redis and the others fail fast.
- `wait_replicas` (`state.wait_replicas`, issue 24): each script call that writes
  budgets (a call's hold, its charge or refund) is followed by `WAIT` on the same
  connection (`RedisLink.run_waited`). Fewer replicas in time: under `deny` an admitted
  call is refused `state_unavailable` as in an outage, its hold given back and its count
  in the circuit and rules taken off; under `allow` it goes on; a charge goes on either
  way (the call was answered). The first such write logs one warning, the first full
  one after it one line; `replica_waits_short` counts them.
- The request log is a sorted set rather than a stream: it is read by time range, and
  the entries' times come from the replicas, not from Redis.
- A batch of log entries is one script call: the entries, their hours' sums
  (`gateway.calls.query_redis`, from `query.call_sums`) and the trim to `log_keep`.
- The Calls page's totals and cost series add up those hours' sums and scan, exactly,
  only the entries of the partial hours at the range's edges (and of the oldest hour,
  which the trim cut into); filters with no sums (session, user, two fields together)
  scan the range. A page reads the set newest first, a chunk of 1,000 at a time, and
  filters in Python until it is full: index sets per filter value would store every
  entry again per field (the set's members are the entries), and a page of a filter
  that matches one call in 25 reads about 1,250 entries. Nothing of it runs inside
  Redis, so a long read never blocks other replicas' decisions.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncGenerator, Callable, Iterable, Mapping, Sequence
from contextlib import aclosing
from types import MappingProxyType
from typing import Any, cast

from redis.commands.core import AsyncScript
from redis.exceptions import RedisError

from gateway.app.errors import StateError
from gateway.calls import anomaly_redis, budgets_redis, codec, query_redis
from gateway.calls.anomaly import AnomalyCharge, agent_paused
from gateway.calls.budgets import (
    ADMITTED_FREE,
    Amount,
    GroupSpend,
    Limits,
    SpendAlert,
    SpendEvent,
    SpendGroup,
    SpendHold,
    SpendVerdict,
)
from gateway.calls.budgets_redis import SPEND_CHECK, SPEND_HOLD, SPEND_PRELUDE, ChargeId
from gateway.calls.entry import CallLogEntry
from gateway.calls.owners import OwnerLease
from gateway.calls.query import (
    CallFilter,
    CallPage,
    CallTotals,
    CostBucket,
    Cursor,
    PageBuilder,
    SeriesBuilder,
    TotalsBuilder,
)
from gateway.calls.redis_pending import ChargeIds, PendingWrite, PendingWrites
from gateway.calls.store import (
    ENFORCED,
    LOG_KEEP,
    Admission,
    MemoryCallStore,
    Settled,
    ShadowGuards,
)
from gateway.calls.verdicts import receipt_to_uncount
from gateway.state.receipts import new_owner
from gateway.state.redis_link import (
    LUA_CLOCK,
    ONE_SERVER,
    OnError,
    RedisLink,
    RedisLinked,
    RedisTopology,
    glob_escape,
)
from guards.call_loop import (
    CallDecision,
    CallLoopPolicy,
    PausedCircuit,
    RuleKey,
    UniquenessRule,
    allowed_verdict,
    call_event,
    duplicate_verdict,
    loop_verdict,
    paused_verdict,
    reopen_window,
    rule_group,
    rules_by_name,
)

log = logging.getLogger(__name__)

STATE_RETRY_SECONDS = 3.0
"""The least retry given a call refused with `on_error: deny` while Redis is down: one
client retry spans a few probes, so it finds Redis back soon after it is."""
_SEP = "\x1f"
_LOG_CHUNK = 1000

_PRELUDE = (
    LUA_CLOCK
    + """
-- TTLs only free memory (the scripts compare times themselves): a minute of slack.
local function ttl(seconds) return math.max(1, math.ceil(seconds * 1000)) + 60000 end
local NEVER = -math.huge
local function hold(key, now)
  local h = redis.call('HMGET', key, 'pu', 'ff', 'ex', 'rule')
  if not h[1] then return nil end
  local ex = tonumber(h[3])
  if ex <= now then
    redis.call('DEL', key)
    return nil
  end
  local ff = NEVER
  if h[2] ~= '' then ff = tonumber(h[2]) end
  return {pu = tonumber(h[1]), ff = ff, ex = ex, rule = h[4]}
end
local function put_hold(key, now, pu, ff, ex, reason, rule, n)
  local fresh = ''
  if ff ~= NEVER then fresh = num(ff) end
  redis.call('DEL', key)
  redis.call('HSET', key, 'pu', num(pu), 'ff', fresh, 'ex', num(ex), 'reason', reason,
    'rule', rule, 'n', n)
  redis.call('PEXPIRE', key, ttl(ex - now))
end
local function pause(key, earlier, now, seconds, reason, rule)
  local ff, ex = NEVER, now + seconds
  if earlier then
    ff = earlier.ff
    ex = math.max(earlier.ex, now + seconds)
  end
  put_hold(key, now, now + seconds, ff, ex, reason, rule, 1)
end
-- The counted calls of a key in the window after floor; the others are dropped, and an
-- idle record is deleted (it counts as none).
local function live(key, now, window, floor)
  local idle = redis.call('ZSCORE', key, 'idle')
  if idle and tonumber(idle) <= now then
    redis.call('DEL', key)
    return 0
  end
  while true do
    local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
    if #first == 0 or first[1] == 'idle' then break end
    local t = tonumber(first[2])
    if t + window <= now or t < floor then
      redis.call('ZPOPMIN', key)
    else
      break
    end
  end
  local count = redis.call('ZCARD', key)
  if idle then count = count - 1 end
  return count
end
-- Count one call at `at` in a key's record, which goes idle when it leaves the window.
local function count(key, at, member, now, window)
  redis.call('ZADD', key, at, member, num(now + window), 'idle')
  redis.call('PEXPIRE', key, ttl(window))
end
"""
)

# KEYS: circuit hold, call events, seq, then per applicable rule: group hold, rule events,
# then per budget group: its record and its admin's limits (budgets_redis), then the
# agent's anomaly hold when the agent may be paused (anomaly_redis).
# ARGV: now, max_repeats, window, pause, then per rule: max_calls, window, action, name,
# then the spend estimate and per group its limits and end, and last this owner's hash of
# holds (budgets_redis.SPEND_HOLD), the shadow flags (`ShadowGuards.flags`), whether the
# agent's hold is given (1 or 0), the group count, and the owner's set of answers, the
# call's reservation id ('' when it has no budget group) and the lowest id unanswered
# (budgets_redis.RESERVE). A call a guard in shadow mode refuses holds its estimate as an
# allowed call does; a decision sent again under a reservation id already decided gets
# that decision's answer.
# Returns {0, at, count, 0} allowed; {1, pause, count, 0} loop detected;
# {2, remaining, refusals, rule index or 0} paused; {3, retry_after, count, rule index};
# {4, ...} refused by a budget (budgets_redis.SPEND_CHECK); {5, remaining, refusals, 0}
# the agent is paused (anomaly_redis.AGENT_HOLD_CHECK).
_DECIDE = (
    _PRELUDE
    + SPEND_PRELUDE
    + """
local now = clock(ARGV[1])
local max_repeats, window, seconds = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local rfloor, rid, reserved = ARGV[#ARGV], ARGV[#ARGV - 1], ARGV[#ARGV - 2]
local ngroups, nagent = tonumber(ARGV[#ARGV - 3]), tonumber(ARGV[#ARGV - 4])
local shadow, owned = ARGV[#ARGV - 5], ARGV[#ARGV - 6]
local held = false
local nrules = (#KEYS - 3 - 2 * ngroups - nagent) / 2
local skeys, sargs = 3 + 2 * nrules, 4 + 4 * nrules
"""
    + budgets_redis.RESERVE
    + """
local kept = reserve_kept()
if kept then return kept end
local function decide()
"""
    + anomaly_redis.AGENT_HOLD_CHECK
    + SPEND_CHECK
    + """
local function guard()
local h = hold(KEYS[1], now)
if h and h.pu > now then
  return {2, num(h.pu - now), redis.call('HINCRBY', KEYS[1], 'n', 1), 0}
end
local groups = {}
for i = 1, nrules do
  local g = hold(KEYS[2 + 2 * i], now)
  if g and g.pu > now then
    return {2, num(g.pu - now), redis.call('HINCRBY', KEYS[2 + 2 * i], 'n', 1), i}
  end
  groups[i] = g or false
end
local floor = NEVER
if h then floor = h.ff end
local repeats = live(KEYS[2], now, window, floor)
if repeats >= max_repeats then
  pause(KEYS[1], h, now, seconds, 'loop_detected', '')
  return {1, num(seconds), repeats + 1, 0}
end
for i = 1, nrules do
  local base = 4 + 4 * (i - 1)
  local limit, rwindow = tonumber(ARGV[base + 1]), tonumber(ARGV[base + 2])
  local action, name = ARGV[base + 3], ARGV[base + 4]
  local g = groups[i] or nil
  local gfloor = NEVER
  if g then gfloor = g.ff end
  local counted = live(KEYS[3 + 2 * i], now, rwindow, gfloor)
  if counted >= limit then
    if action == 'pause' then
      pause(KEYS[2 + 2 * i], g, now, seconds, 'rule:' .. name, name)
      return {3, num(seconds), counted + 1, i}
    end
    -- The oldest counted call: `idle` scores highest and calls are counted here.
    local first = redis.call('ZRANGE', KEYS[3 + 2 * i], 0, 0, 'WITHSCORES')
    return {3, num(tonumber(first[2]) + rwindow - now), counted + 1, i}
  end
end
local member = tostring(redis.call('INCR', KEYS[3]))
local at = num(now)
count(KEYS[2], at, member, now, window)
for i = 1, nrules do
  count(KEYS[3 + 2 * i], at, member, now, tonumber(ARGV[4 + 4 * (i - 1) + 2]))
end
return {0, at, repeats + 1, 0}
end
local reply = guard()
local by = 1
if reply[1] ~= 1 then by = tonumber(reply[4]) + 1 end
if reply[1] == 0 or string.sub(shadow, by, by) == '1' then
"""
    + SPEND_HOLD
    + """
  held = true
end
return reply
end
return reserve_keep(decide())
"""
)
_CHARGE = _PRELUDE + SPEND_PRELUDE + budgets_redis.CHARGE
_LIVE = _PRELUDE + SPEND_PRELUDE + budgets_redis.LIVE
_BEAT = _PRELUDE + SPEND_PRELUDE + budgets_redis.BEAT
_LIVE_LIMITS = LUA_CLOCK + budgets_redis.LIVE_LIMITS

# KEYS: counted-call sets (the circuit's first). ARGV: the call's time (never the score of
# `idle`, which is later than every counted call). Returns 1 when the circuit's call was
# uncounted.
_UNCOUNT = """
local removed = 0
for i, key in ipairs(KEYS) do
  local found = redis.call('ZRANGEBYSCORE', key, ARGV[1], ARGV[1], 'LIMIT', 0, 1)
  if #found > 0 then
    redis.call('ZREM', key, found[1])
    if i == 1 then removed = 1 end
  end
end
return removed
"""

# KEYS: hold. ARGV: now, window. Returns 1 when a running pause was lifted.
_REOPEN = (
    _PRELUDE
    + """
local now, window = clock(ARGV[1]), tonumber(ARGV[2])
local reason, rule, lifted = 'reopened', '', 0
local h = redis.call('HMGET', KEYS[1], 'pu', 'ex', 'reason', 'rule')
if h[1] and tonumber(h[2]) > now then
  reason, rule = h[3], h[4]
  if tonumber(h[1]) > now then lifted = 1 end
end
put_hold(KEYS[1], now, now, now, now + window, reason, rule, 0)
return lifted
"""
)

# KEYS: holds. ARGV: now. Returns {remaining, reason, refusals} per paused hold, else false.
_PAUSED = (
    _PRELUDE
    + """
local now = clock(ARGV[1])
local out = {}
for i, key in ipairs(KEYS) do
  local h = redis.call('HMGET', key, 'pu', 'reason', 'n')
  if h[1] and tonumber(h[1]) > now then
    out[i] = {num(tonumber(h[1]) - now), h[2], tonumber(h[3])}
  else
    out[i] = false
  end
end
return out
"""
)


class RedisCallStore(RedisLinked):
    """A CallStore in Redis: one atomic script per decision, server time, capped log."""

    def __init__(
        self,
        url: str,
        policy: CallLoopPolicy | None = None,
        rules: Iterable[UniquenessRule] = (),
        *,
        on_error: OnError = "allow",
        key_prefix: str = "lw:",
        clock: Callable[[], float] | None = None,
        wall_clock: Callable[[], float] = time.time,
        log_keep: int = LOG_KEEP,
        timeout: float = 2.0,
        probe_interval: float = 1.0,
        topology: RedisTopology = ONE_SERVER,
        wait_replicas: int = 0,
        wait_timeout_ms: int = 100,
    ) -> None:
        self._link = RedisLink(
            url,
            topology=topology,
            name="redis call store",
            log=log,
            on_error=on_error,
            if_allowed="deciding on circuits and budgets local to this process",
            if_denied="deciding on circuits local to this process, refusing budgeted LLM calls",
            clock=clock,
            timeout=timeout,
            probe_interval=probe_interval,
            on_recovered=self._recovered,
        )
        self._policy = policy or CallLoopPolicy()
        self._rules = tuple(rules_by_name(rules).values())
        self._clock = clock
        self._local: MemoryCallStore | None = None
        self._base = f"{key_prefix}{{calls}}:"
        self._wall_clock = wall_clock
        self._log_keep = log_keep
        script = self._link.script
        self._decide = script(_DECIDE)
        self._uncount = script(_UNCOUNT)
        self._reopen = script(_REOPEN)
        self._paused = script(_PAUSED)
        self._charge = script(_CHARGE)
        self._live = script(_LIVE)
        self._live_limits = script(_LIVE_LIMITS)
        self._log = script(query_redis.LOG_SCRIPT)
        self._beat_script = script(_BEAT)
        self.owner = new_owner()
        self._owned = f"{self._base}owned:{self.owner}"
        self._charged = f"{self._base}charged:{self.owner}"
        self._reserved = f"{self._base}reserved:{self.owner}"
        self._lease = OwnerLease(self._beat, name="lw-redis-calls-lease")
        self._wait_replicas = wait_replicas
        self._wait_timeout_ms = wait_timeout_ms
        self._short = False
        self.replica_waits_short = 0
        """Budget writes fewer replicas than `wait_replicas` confirmed in time."""
        self._charge_ids = ChargeIds()
        self._pending = PendingWrites(log)
        self._replaying: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Load the scripts, then take the holds' lease (`gateway.calls.owners`)."""
        await super().start()
        await self._lease.start()

    async def aclose(self) -> None:
        """Write what is pending while Redis answers, end the lease (giving back this
        owner's holds), then disconnect; pending writes left then are logged as lost."""
        if self._replaying is not None:
            await self._replaying
        if self._pending.first() is not None and not self._link.degraded:
            await self._replay()
        if self._pending.entries:
            log.warning(
                "%d budget charges and request-log entries never reached Redis",
                self._pending.entries,
            )
        await self._lease.stop()
        await super().aclose()

    @property
    def pending_writes(self) -> int:
        """Budget charges and request-log entries waiting for Redis to answer again."""
        return self._pending.entries

    @property
    def pending_dropped(self) -> int:
        """Charges and log entries dropped because `MAX_PENDING` were waiting already."""
        return self._pending.dropped

    async def _budget_write(
        self,
        script: AsyncScript,
        keys: Sequence[str],
        args: Sequence[str | int],
        *,
        money: bool = True,
    ) -> tuple[Any, bool]:
        """Run a script; when it writes budgets (`money`) and `wait_replicas` is set, WAIT.

        Returns the script's reply and whether fewer replicas than asked hold the write:
        then, with `on_error: deny`, the caller refuses what it admitted.
        """
        wanted = self._wait_replicas
        if not wanted or not money:
            return await script(keys=keys, args=args), False
        reply, acknowledged = await self._link.run_waited(
            script, keys, args, wanted, self._wait_timeout_ms
        )
        if acknowledged >= wanted:
            if self._short:
                self._short = False
                log.info("budget writes reach %d replicas again", wanted)
            return reply, False
        self.replica_waits_short += 1
        if not self._short:
            self._short = True
            log.warning(
                "a budget write reached %d of %d replicas within %d ms (state.wait_replicas); "
                "on_error=%s: %s until they keep up",
                acknowledged,
                wanted,
                self._wait_timeout_ms,
                self._link.on_error,
                "refusing budgeted calls"
                if self._link.on_error == "deny"
                else "admitting them (a failover now may lose such writes)",
            )
        return reply, True

    async def _beat(self, seconds: float) -> int:
        """Renew this owner's lease; give back the holds of owners whose lease lapsed."""
        keys = [f"{self._base}owners"]
        args = (self._link.now(), self.owner, repr(seconds), f"{self._base}owned:")
        return int(await self._link.guarded(lambda: self._beat_script(keys=keys, args=args)))

    def __repr__(self) -> str:
        # The URL may hold a password: never part of a repr that could end up in a log.
        return f"RedisCallStore(key_prefix={self._base!r}, on_error={self._link.on_error!r})"

    def _hold_key(self, key: str) -> str:
        return f"{self._base}hold:{key}"

    def _call_key(self, circuit: str, identity: str) -> str:
        return f"{self._base}ev:c{_SEP}{circuit}{_SEP}{identity}"

    def _rule_events_key(self, name: str, key: RuleKey) -> str:
        return f"{self._base}ev:" + _SEP.join(("r", name, *key))

    async def decide(
        self,
        circuit: str,
        fingerprint: str,
        fields: Mapping[str, str] = MappingProxyType({}),
        *,
        policy: CallLoopPolicy | None = None,
    ) -> CallDecision:
        """Decide one call and count it when allowed, in one script call."""
        admission = await self._admit(circuit, fingerprint, fields, None, policy)
        if admission.call is None:
            raise StateError("the decide script answered a budget refusal without budgets")
        return admission.call

    async def admit(
        self,
        circuit: str,
        fingerprint: str,
        fields: Mapping[str, str],
        spend: SpendEvent,
        *,
        policy: CallLoopPolicy | None = None,
        shadow: ShadowGuards = ENFORCED,
    ) -> Admission:
        """The budgets, the circuit and the rules of one call in one script call."""
        return await self._admit(circuit, fingerprint, fields, spend, policy, shadow=shadow)

    async def _admit(
        self,
        circuit: str,
        fingerprint: str,
        fields: Mapping[str, str],
        spend: SpendEvent | None,
        policy: CallLoopPolicy | None,
        *,
        shadow: ShadowGuards = ENFORCED,
    ) -> Admission:
        event = call_event(circuit, fingerprint, fields, self._rules)
        identity = event.identity
        if policy is None:
            policy = self._policy
        keys = [self._hold_key(circuit), self._call_key(circuit, identity), f"{self._base}seq"]
        args: list[str | int] = [
            self._link.now(),
            policy.max_repeats,
            repr(policy.window_seconds),
            repr(policy.pause_seconds),
        ]
        applied = event.rules
        for candidate, key in applied:
            keys += [
                self._hold_key(rule_group(candidate, key)),
                self._rule_events_key(candidate.name, key),
            ]
            args += [
                candidate.max_calls,
                repr(candidate.window_seconds),
                candidate.action,
                candidate.name,
            ]
        groups = spend.groups if spend is not None else ()
        agent = spend.agent_hold if spend is not None else None
        if spend is not None:
            keys += self._spend_keys(groups)
            args += budgets_redis.check_args(spend)
        if agent is not None:
            keys.append(self._hold_key(agent))
        flags = shadow.flags([rule for rule, _ in applied])
        args += [self._owned, flags, 0 if agent is None else 1, len(groups)]
        try:
            reply, short = await self._decide_call(keys, args, spend)
        except StateError:
            return await self._unavailable(
                circuit, fingerprint, fields, spend, policy, shadow=shadow
            )
        kind, value, count, index = reply[:4]
        number, count = float(value), int(count)
        hold = SpendHold(groups, spend.estimate) if spend is not None and groups else None
        deny = self._link.on_error == "deny"
        if short and deny and hold is not None and _holds(kind, int(index), flags):
            counted = [self._call_key(circuit, identity)]
            counted += [self._rule_events_key(rule.name, key) for rule, key in applied]
            return await self._unreplicated(hold, counted if kind == 0 else [], str(value))
        admitted = SpendVerdict(True, hold=hold)
        if kind == 5 and agent is not None:
            return Admission(agent_paused(agent, circuit, number, count), ADMITTED_FREE)
        if kind == 4:
            group = groups[count - 1]
            limits, alert = budgets_redis.refused_alert(group, reply)
            refused = SpendVerdict(
                False, refused=group, limits=limits, retry_after=number, alert=alert
            )
            return Admission(None, refused)
        rule, key = applied[int(index) - 1] if index else (None, ())
        if kind == 0:
            rule_keys = tuple((r.name, k) for r, k in applied)
            return Admission(allowed_verdict(circuit, identity, count, number, rule_keys), admitted)
        if kind == 1:
            return Admission(loop_verdict(circuit, count, number), admitted)
        if kind == 2:
            paused = paused_verdict(circuit, number, count, None if rule is None else rule.name)
            return Admission(paused, admitted)
        if rule is None:
            raise StateError(f"the decide script answered {kind} without a rule")
        return Admission(duplicate_verdict(circuit, rule, key, count, number), admitted)

    def _spend_keys(self, groups: Sequence[SpendGroup]) -> list[str]:
        """Per group: its record's key and its budget's admin-limit key."""
        keys: list[str] = []
        for group in groups:
            keys += [f"{self._base}spend:{group.key}", f"{self._base}spendlimit:{group.limit_key}"]
        return keys

    async def _unreplicated(self, hold: SpendHold, counted: list[str], at: str) -> Admission:
        """Refuse an admitted call whose hold too few replicas confirmed (`on_error: deny`):
        its hold is given back and its count in the circuit and rules taken off."""
        await self.settle(hold, None)
        if counted:
            try:
                await self._link.guarded(lambda: self._uncount(keys=counted, args=[at]))
            except StateError:
                log.warning("a call refused for too few replicas stays counted in its circuit")
        retry = max(STATE_RETRY_SECONDS, self._link.probe_interval)
        refused = SpendVerdict(False, refused=hold.groups[0], retry_after=retry, unavailable=True)
        return Admission(None, refused)

    async def _decide_call(
        self, keys: Sequence[str], args: Sequence[str | int], spend: SpendEvent | None
    ) -> tuple[Any, bool]:
        """The decide script's reply and whether too few replicas hold it, under the call's
        reservation id when it has budget groups (`budgets_redis.RESERVE`: a decision
        redis-py sends again after a lost answer holds once). StateError when Redis did
        not answer; a decision sent and never answered under `deny` (its call is refused,
        holding nothing) leaves its release to be written (`_release_lost`)."""
        groups = () if spend is None else spend.groups
        ids = self._charge_ids
        reservation = ids.new() if groups else None
        rid = "" if reservation is None else str(reservation)
        args = [*args, self._reserved, rid, str(ids.floor())]
        sent = False

        async def decide() -> tuple[Any, bool]:
            nonlocal sent
            sent = True
            return await self._budget_write(self._decide, keys, args, money=bool(groups))

        try:
            return await self._link.guarded(decide)
        except StateError:
            if sent and self._release_lost(spend, reservation):
                reservation = None  # answered once the release is written
            raise
        finally:
            if reservation is not None:
                ids.answered(reservation)  # never sent again by this store

    def _release_lost(self, spend: SpendEvent | None, reservation: int | None) -> bool:
        """Under `on_error: deny`, keep the release of a decision sent and never answered:
        its call is refused as in an outage and holds nothing, but the decision may have
        run and held. Written once Redis answers, it gives the hold back only if that
        decision held, so none stays stuck. Not counted among the pending charges (it
        moves no money but back; one per decision sent, not per call refused fast). True
        when kept (the reservation's id is answered once it is written). Under `allow` a
        call admitted on local records gives the hold back with its own charge; one they
        refuse leaves it standing until the period ends (not handled)."""
        if spend is None or reservation is None or self._link.on_error != "deny":
            return False
        ids = self._charge_ids
        hold = SpendHold(spend.groups, spend.estimate)
        release = ChargeId(self._charged, reservation, ids.floor(), self._reserved, reservation)
        args = tuple(budgets_redis.charge_args(self._link.now(), hold, None, self._owned, release))
        keys = tuple(self._spend_keys(hold.groups))
        return self._pending.keep(PendingWrite("charge", keys, args, 0, charge=reservation))

    async def charge(self, hold: SpendHold, used: Amount | None) -> list[SpendAlert]:
        """`step_charge` in one script call (while Redis is down: on the local records)."""
        return (await self.settle(hold, used)).alerts

    async def settle(
        self, hold: SpendHold, used: Amount | None, anomaly: AnomalyCharge | None = None
    ) -> Settled:
        """`step_charge` and `step_anomaly` in one script call (while down: the local records).

        A charge Redis did not answer is kept to be written again once it does
        (gateway.calls.redis_pending), under an id that makes it count once.
        """
        ids = self._charge_ids
        charge = ids.new()
        keys = self._spend_keys(hold.groups)
        applied = ChargeId(self._charged, charge, ids.floor())
        args = budgets_redis.charge_args(self._link.now(), hold, used, self._owned, applied)
        if anomaly is not None:
            keys += anomaly_redis.keys(self._base, anomaly, self._hold_key(anomaly.event.hold_key))
            args += anomaly_redis.args(anomaly)
        try:
            reply, _ = await self._link.guarded(
                lambda: self._budget_write(self._charge, keys, args)
            )
        except StateError:
            pending = PendingWrite("charge", tuple(keys), tuple(args), charge=charge, hold=hold)
            if not self._pending.keep(pending):
                ids.answered(charge)
            local = self._local
            return Settled([]) if local is None else await local.settle(hold, used, anomaly)
        except BaseException:
            ids.answered(charge)  # refused by Redis, or cancelled: never sent again
            raise
        ids.answered(charge)
        charged, found = reply
        alerts = budgets_redis.charge_alerts(hold, charged)
        return Settled(alerts, None if anomaly is None else anomaly_redis.alert(anomaly, found))

    async def spend_groups(self) -> list[tuple[str, GroupSpend]]:
        """The groups of periods not ended (SCAN: an admin path)."""
        head = f"{self._base}spend:"

        async def live() -> list[tuple[str, GroupSpend]]:
            keys = sorted({key async for key in self._link.scan(glob_escape(head) + "*")})
            if not keys:
                return []
            replies = await self._live(keys=keys, args=[self._link.now()])
            return [
                (key[len(head) :], budgets_redis.live_group(reply))
                for key, reply in zip(keys, replies, strict=True)
                if reply
            ]

        return await self._link.guarded(live)

    async def spend_limits(self) -> dict[str, Limits]:
        """The admins' limits in force (SCAN: an admin path)."""
        head = f"{self._base}spendlimit:"

        async def live() -> dict[str, Limits]:
            keys = sorted({key async for key in self._link.scan(glob_escape(head) + "*")})
            if not keys:
                return {}
            replies = await self._live_limits(keys=keys, args=[self._link.now()])
            return {
                key[len(head) :]: budgets_redis.live_limit(reply)
                for key, reply in zip(keys, replies, strict=True)
                if reply
            }

        return await self._link.guarded(live)

    async def set_spend_limit(self, key: str, limits: Limits, ends_at: float) -> None:
        """Store an admin's limits until the period ends (a minute longer, like the records)."""
        name = f"{self._base}spendlimit:{key}"
        usd = "" if limits.nano_usd is None else str(limits.nano_usd)
        tokens = "" if limits.tokens is None else str(limits.tokens)

        async def put() -> None:
            async with self._link.client.pipeline(transaction=True) as pipe:
                pipe.delete(name)
                pipe.hset(name, mapping={"u": usd, "t": tokens, "ea": repr(ends_at)})
                pipe.expireat(name, int(ends_at) + 61)
                await pipe.execute()

        await self._link.guarded(put)

    async def reset_spend(self, key: str) -> bool:
        """Forget one group's spend."""
        name = f"{self._base}spend:{key}"
        return bool(await self._link.guarded(lambda: self._link.client.delete(name)))

    def _fallback(self) -> MemoryCallStore:
        """The per-process store that decides while Redis is down (budgets: with `allow`)."""
        if self._local is None:
            self._local = MemoryCallStore(
                self._policy, self._rules, clock=self._clock, wall_clock=self._wall_clock
            )
        return self._local

    def _recovered(self) -> None:
        """Redis is back: its shared circuits decide again (the local counts are dropped),
        and the writes kept while it was away are sent."""
        self._local = None
        running = self._replaying is not None and not self._replaying.done()
        if self._pending.first() is not None and not running:
            self._replaying = asyncio.get_running_loop().create_task(self._replay())

    async def _replay(self) -> None:
        """Send the kept writes, oldest first, until none is left or Redis is away again."""
        written = 0
        while (write := self._pending.first()) is not None:
            try:
                written += await self._send(write)
            except StateError:
                return  # away again: the next recovery sends the rest
            self._pending.done()
            if write.charge is not None:
                self._charge_ids.answered(write.charge)
        if written:
            log.info(
                "wrote %d budget charges and request-log entries kept while Redis was away",
                written,
            )

    async def _send(self, write: PendingWrite) -> int:
        """Send one kept write; the entries it wrote (0: Redis refused it for good)."""
        charge = write.kind == "charge"
        script = self._charge if charge else self._log
        try:
            reply, _ = await self._link.guarded(
                lambda: self._budget_write(script, write.keys, write.args, money=charge)
            )
        except RedisError:
            log.exception("a kept %s was refused by Redis and dropped", write.kind)
            return 0
        if write.hold is not None:
            _log_late_alerts(write.hold, reply)
        return write.entries

    async def _unavailable(
        self,
        circuit: str,
        fingerprint: str,
        fields: Mapping[str, str],
        spend: SpendEvent | None,
        policy: CallLoopPolicy,
        *,
        shadow: ShadowGuards,
    ) -> Admission:
        """The decision while Redis is down: local, but a budgeted call is refused with `deny`."""
        if spend is not None and spend.groups and self._link.on_error == "deny":
            retry = max(STATE_RETRY_SECONDS, self._link.probe_interval)
            refused = SpendVerdict(
                False, refused=spend.groups[0], retry_after=retry, unavailable=True
            )
            return Admission(None, refused)
        local = self._fallback()
        if spend is not None:
            return await local.admit(
                circuit, fingerprint, fields, spend, policy=policy, shadow=shadow
            )
        decision = await local.decide(circuit, fingerprint, fields, policy=policy)
        return Admission(decision, ADMITTED_FREE)

    async def record_outcome(
        self, decision: CallDecision, status: int | None = None, error: str | None = None
    ) -> bool:
        """Uncount an allowed call the provider failed, in one script call."""
        receipt = receipt_to_uncount(decision, status, error)
        if receipt is None:
            return False
        keys = [self._call_key(*receipt.call)]
        keys += [self._rule_events_key(name, key) for name, key in receipt.rule_keys]
        args = [repr(receipt.at)]
        try:
            removed = await self._link.guarded(lambda: self._uncount(keys=keys, args=args))
        except StateError:
            local = self._local
            return local is not None and await local.record_outcome(decision, status, error)
        return bool(removed)

    async def reopen(self, circuit: str) -> bool:
        """Lift a pause (circuit or rule group) and forget the counts before now."""
        window = reopen_window(self._policy, self._rules, circuit)
        args = [self._link.now(), repr(window)]
        lifted = await self._link.guarded(
            lambda: self._reopen(keys=[self._hold_key(circuit)], args=args)
        )
        return bool(lifted)

    async def paused(self) -> list[PausedCircuit]:
        """The circuits and rule groups paused now, by key (SCAN: an admin path)."""
        head = self._hold_key("")

        async def paused() -> list[PausedCircuit]:
            keys = sorted({key async for key in self._link.scan(glob_escape(head) + "*")})
            if not keys:
                return []
            views = await self._paused(keys=keys, args=[self._link.now()])
            return [
                PausedCircuit(
                    circuit=key[len(head) :],
                    remaining=float(view[0]),
                    reason=str(view[1]),
                    count=int(view[2]),
                )
                for key, view in zip(keys, views, strict=True)
                if view
            ]

        return await self._link.guarded(paused)

    async def log_call(self, entry: CallLogEntry) -> None:
        """`log_calls` of one entry."""
        await self.log_calls((entry,))

    async def log_calls(self, entries: Sequence[CallLogEntry]) -> None:
        """One script call: the entries, their hours' sums, the trim (dropped while down)."""
        if not entries:
            return
        members = [(json.dumps(_encode(entry), sort_keys=True), entry.at) for entry in entries]
        keys, args = query_redis.log_keys_and_args(self._base, self._log_keep, members, entries)
        try:
            await self._link.guarded(lambda: self._log(keys=keys, args=args))
        except StateError:
            batch = PendingWrite("log", tuple(keys), tuple(args), len(entries))
            self._pending.keep(batch)

    async def calls_since(self, seconds: float) -> list[CallLogEntry]:
        """Entries at or after now - seconds, oldest first, read in chunks."""
        key = f"{self._base}log"
        cutoff = self._wall_clock() - seconds

        async def since() -> list[CallLogEntry]:
            found: list[CallLogEntry] = []
            offset = 0
            while True:
                batch = await self._link.client.zrangebyscore(
                    key, cutoff, "+inf", start=offset, num=_LOG_CHUNK
                )
                found.extend(_decode(str(raw)) for raw in batch)
                if len(batch) < _LOG_CHUNK:
                    return found
                offset += _LOG_CHUNK

        return await self._link.guarded(since)

    async def query_calls(
        self, where: CallFilter, limit: int, cursor: Cursor | None = None
    ) -> CallPage:
        """The page, read newest first in chunks until it is full."""
        builder = PageBuilder(where, limit, cursor)

        async def read() -> CallPage:
            before = None if cursor is None else cursor.at
            async with aclosing(self._newest_first(where.since, where.until, before)) as entries:
                async for entry in entries:
                    if builder.offer(entry):
                        break
            return builder.page()

        return await self._link.guarded(read)

    async def call_totals(self, where: CallFilter) -> CallTotals:
        """The hours' sums over the filter's time range, plus a scan of its partial hours."""

        async def read() -> CallTotals:
            builder = TotalsBuilder(where)
            client = self._link.client
            reading = await query_redis.read(client, self._base, where, where.since, where.until)
            for _, sums in reading.hours:
                builder.add_sums(sums)
            for since, until in reading.scan:
                async for entry in self._newest_first(since, until, None):
                    builder.add(entry)
            return builder.totals()

        return await self._link.guarded(read)

    async def cost_series(
        self, where: CallFilter, since: float, until: float, bucket_seconds: float
    ) -> list[CostBucket]:
        """The sums per bucket of since..until: hours' sums for buckets of whole hours."""

        async def read() -> list[CostBucket]:
            builder = SeriesBuilder(where, since, until, bucket_seconds)
            reading = query_redis.Reading([], [(since, until)])
            if query_redis.hour_sums(bucket_seconds):
                reading = await query_redis.read(self._link.client, self._base, where, since, until)
            for hour, sums in reading.hours:
                builder.add_sums(hour, sums)
            for start, end in reading.scan:
                async for entry in self._newest_first(start, end, None):
                    builder.add(entry)
            return builder.buckets()

        return await self._link.guarded(read)

    async def _newest_first(
        self, since: float | None, until: float | None, before: float | None
    ) -> AsyncGenerator[CallLogEntry]:
        """The log's entries of since..until (and at or before `before`), newest first.

        Each chunk starts at the last one's lowest time, skipping the entries of that time
        already read, so a chunk costs O(log n + chunk), not a walk from the top.
        """
        key = f"{self._base}log"
        high = "+inf" if until is None else f"({until!r}"
        if before is not None and (until is None or before < until):
            high = repr(before)
        low = "-inf" if since is None else repr(since)
        skip = 0
        while True:
            batch = cast(
                list[tuple[str, float]],
                await self._link.client.zrevrangebyscore(
                    key, high, low, start=skip, num=_LOG_CHUNK, withscores=True
                ),
            )
            for raw, _ in batch:
                yield _decode(raw)
            if len(batch) < _LOG_CHUNK:
                return
            lowest = batch[-1][1]
            same = sum(1 for _, score in batch if score == lowest)
            skip = skip + same if high == repr(lowest) else same
            high = repr(lowest)


def _holds(kind: int, index: int, flags: str) -> bool:
    """Whether the decide script held the call's estimate: an allowed call does, and a
    refusal of a guard in shadow mode (`flags`, the rule's or the circuit's)."""
    if kind == 0:
        return True
    if kind not in (1, 2, 3):
        return False
    by = 1 if kind == 1 else index + 1
    return flags[by - 1 : by] == "1"


def _log_late_alerts(hold: SpendHold, reply: Sequence[object]) -> None:
    """Log the thresholds a charge written late crossed (their call was answered long ago,
    so no alert is sent: gateway.calls.redis_pending)."""
    crossed = reply[0]
    if not isinstance(crossed, list):
        return
    for alert in budgets_redis.charge_alerts(hold, crossed):
        log.warning(
            "budget %s for %s reached %d%% of its limit by a charge written late; "
            "no alert is sent for it",
            alert.budget,
            alert.group,
            alert.threshold,
        )


def _encode(entry: CallLogEntry) -> dict[str, object]:
    """A log entry as JSON-able data, with a unique id so equal entries are kept apart."""
    return {"id": uuid.uuid4().hex, **codec.plain(entry)}


def _decode(raw: str) -> CallLogEntry:
    """A log entry from its JSON form."""
    data: dict[str, object] = json.loads(raw)
    return codec.from_plain(data)
