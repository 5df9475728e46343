"""Redis call store: several proxy (or gateway) replicas share circuits, pauses and the log.

Every decision is one Lua script call (EVALSHA, reloaded by redis-py after NOSCRIPT), so
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
  counted calls, scored by time, members unique (`{calls}:seq`);
- `{calls}:log`: the request log, a sorted set of JSON entries scored by their time,
  trimmed to the newest `log_keep`.
Keys carry a TTL (PEXPIRE) of what they serve plus a minute: the scripts check times
themselves, the TTL only frees memory.

Decisions where DESIGN.md is silent:
- Redis down: `on_error: allow` lets calls through uncounted (code "ok", count 0, no
  receipt); `deny` refuses them with `loop_paused` and a retry after the probe interval.
  A lost log entry is dropped; `reopen`, `paused` and `calls_since` raise `StateError`,
  so an admin is never told a change was made or that nothing is paused when Redis did
  not answer. The first failure logs one warning and the recovery one line; while down,
  one call per `probe_interval` goes to Redis and the others fail fast.
- The request log is a sorted set rather than a stream: it is read by time range, and
  the entries' times come from the replicas, not from Redis.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Literal, TypeVar, cast
from urllib.parse import urlsplit

from redis import exceptions as redis_errors
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from gateway.calls.store import LOG_KEEP, OUTCOMES, CallLogEntry, CallOutcome
from gateway.calls.verdicts import (
    RuleKey,
    allowed_verdict,
    call_identity,
    duplicate_verdict,
    is_group,
    longest_window,
    loop_verdict,
    paused_verdict,
    rule_group,
    rule_key,
)
from gateway.errors import StateError
from guards.call_loop import (
    CallDecision,
    CallLoopPolicy,
    PausedCircuit,
    UniquenessRule,
    is_provider_failure,
)

log = logging.getLogger(__name__)

T = TypeVar("T")
OnError = Literal["allow", "deny"]

MSG_STATE_DOWN = (
    "loopwarden: the call guard's shared state is unreachable; retry in {seconds} seconds."
)
_SEP = "\x1f"
_SCAN_COUNT = 1000
_LOG_CHUNK = 1000
_UNAVAILABLE = (
    redis_errors.ConnectionError,
    redis_errors.TimeoutError,
    redis_errors.ReadOnlyError,
    redis_errors.OutOfMemoryError,
    redis_errors.ClusterDownError,
    OSError,
)

_PRELUDE = """
local function clock(given)
  if given ~= '' then return tonumber(given) end
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local function num(x) return string.format('%.17g', x) end
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
local function live(key, now, window, floor)
  while true do
    local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
    if #first == 0 then return 0 end
    local t = tonumber(first[2])
    if t + window <= now or t < floor then
      redis.call('ZPOPMIN', key)
    else
      break
    end
  end
  return redis.call('ZCARD', key)
end
"""

# KEYS: circuit hold, call events, seq, then per applicable rule: group hold, rule events.
# ARGV: now, max_repeats, window, pause, then per rule: max_calls, window, action, name.
# Returns {0, at, count, 0} allowed; {1, pause, count, 0} loop detected;
# {2, remaining, refusals, rule index or 0} paused; {3, retry_after, count, rule index}.
_DECIDE = (
    _PRELUDE
    + """
local now = clock(ARGV[1])
local max_repeats, window, seconds = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local nrules = (#KEYS - 3) / 2
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
  local count = live(KEYS[3 + 2 * i], now, rwindow, gfloor)
  if count >= limit then
    if action == 'pause' then
      pause(KEYS[2 + 2 * i], g, now, seconds, 'rule:' .. name, name)
      return {3, num(seconds), count + 1, i}
    end
    local first = redis.call('ZRANGE', KEYS[3 + 2 * i], 0, 0, 'WITHSCORES')
    return {3, num(tonumber(first[2]) + rwindow - now), count + 1, i}
  end
end
local member = tostring(redis.call('INCR', KEYS[3]))
local at = num(now)
redis.call('ZADD', KEYS[2], at, member)
redis.call('PEXPIRE', KEYS[2], ttl(window))
for i = 1, nrules do
  redis.call('ZADD', KEYS[3 + 2 * i], at, member)
  redis.call('PEXPIRE', KEYS[3 + 2 * i], ttl(tonumber(ARGV[4 + 4 * (i - 1) + 2])))
end
return {0, at, repeats + 1, 0}
"""
)

# KEYS: counted-call sets (the circuit's first). ARGV: the call's time.
# Returns 1 when the circuit's call was uncounted.
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


class RedisCallStore:
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
    ) -> None:
        self._client = Redis.from_url(
            url,
            decode_responses=True,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry=Retry(NoBackoff(), 1, supported_errors=(redis_errors.ConnectionError,)),
        )
        self._password = urlsplit(url).password
        self._policy = policy or CallLoopPolicy()
        self._rules: dict[str, UniquenessRule] = {}
        for rule in rules:
            if rule.name in self._rules:
                raise ValueError(f"rules: the name {rule.name!r} is used twice")
            self._rules[rule.name] = rule
        self._on_error = on_error
        self._base = f"{key_prefix}{{calls}}:"
        self._clock = clock
        self._wall_clock = wall_clock
        self._log_keep = log_keep
        self._probe_interval = probe_interval
        register = self._client.register_script
        self._decide = register(_DECIDE)
        self._uncount = register(_UNCOUNT)
        self._reopen = register(_REOPEN)
        self._paused = register(_PAUSED)
        self._down = False
        self._down_since = 0.0
        self._probe_at = 0.0
        self.unavailable_calls = 0
        """Calls that could not reach Redis (counted across outages)."""

    def __repr__(self) -> str:
        # The URL may hold a password: never part of a repr that could end up in a log.
        return f"RedisCallStore(key_prefix={self._base!r}, on_error={self._on_error!r})"

    @property
    def degraded(self) -> bool:
        """True while Redis is unreachable and `on_error` decides."""
        return self._down

    async def start(self) -> None:
        """Load the scripts; an unreachable Redis is an outage (logged), not a start failure."""

        async def load() -> None:
            for script in (self._decide, self._uncount, self._reopen, self._paused):
                await self._client.script_load(script.script)

        try:
            await self._guarded(load)
        except StateError:
            return

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._client.aclose()

    async def _guarded(self, call: Callable[[], Awaitable[T]]) -> T:
        """Run one Redis call; an unreachable Redis becomes a StateError (logged once)."""
        if self._down:
            now = time.monotonic()
            if now < self._probe_at:
                self.unavailable_calls += 1
                raise StateError("the redis call store is unreachable")
            self._probe_at = now + self._probe_interval
        try:
            result = await call()
        except _UNAVAILABLE as exc:
            self._failed(exc)
            raise StateError("the redis call store is unreachable") from None
        if self._down:
            self._down = False
            log.warning(
                "redis call store reachable again after %.1f s; %d call(s) failed meanwhile",
                time.monotonic() - self._down_since,
                self.unavailable_calls,
            )
        return result

    def _failed(self, exc: BaseException) -> None:
        self.unavailable_calls += 1
        if self._down:
            return
        self._down = True
        self._down_since = time.monotonic()
        self._probe_at = self._down_since + self._probe_interval
        text = f"{type(exc).__name__}: {exc}"
        if self._password:
            text = text.replace(self._password, "***")
        consequence = (
            "letting LLM calls through uncounted"
            if self._on_error == "allow"
            else "refusing LLM calls"
        )
        log.warning(
            "redis call store unreachable (%s); on_error=%s: %s until it is back",
            text,
            self._on_error,
            consequence,
        )

    def _now(self) -> str:
        """The injected clock's time for a script, or '' to use the server's TIME."""
        return "" if self._clock is None else repr(self._clock())

    def _hold_key(self, key: str) -> str:
        return f"{self._base}hold:{key}"

    def _call_key(self, circuit: str, identity: str) -> str:
        return f"{self._base}ev:c{_SEP}{circuit}{_SEP}{identity}"

    def _rule_events_key(self, name: str, key: RuleKey) -> str:
        return f"{self._base}ev:" + _SEP.join(("r", name, *key))

    async def decide(
        self, circuit: str, fingerprint: str, fields: Mapping[str, str] = MappingProxyType({})
    ) -> CallDecision:
        """Decide one call and count it when allowed, in one script call."""
        identity = call_identity(fingerprint, fields)
        policy = self._policy
        keys = [self._hold_key(circuit), self._call_key(circuit, identity), f"{self._base}seq"]
        args: list[str | int] = [
            self._now(),
            policy.max_repeats,
            repr(policy.window_seconds),
            repr(policy.pause_seconds),
        ]
        applied: list[tuple[UniquenessRule, RuleKey]] = []
        for candidate in self._rules.values():
            key = rule_key(candidate, fingerprint, fields)
            if key is None:
                continue
            applied.append((candidate, key))
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
        try:
            kind, value, count, index = await self._guarded(
                lambda: self._decide(keys=keys, args=args)
            )
        except StateError:
            return self._unavailable(circuit)
        number, count = float(value), int(count)
        rule = applied[int(index) - 1][0] if index else None
        if kind == 0:
            rule_keys = tuple((r.name, key) for r, key in applied)
            return allowed_verdict(circuit, identity, count, number, rule_keys)
        if kind == 1:
            return loop_verdict(circuit, count, number)
        if kind == 2:
            return paused_verdict(circuit, number, count, None if rule is None else rule.name)
        if rule is None:
            raise StateError(f"the decide script answered {kind} without a rule")
        return duplicate_verdict(circuit, rule, count, number)

    def _unavailable(self, circuit: str) -> CallDecision:
        """The decision while Redis is down: `on_error` lets the call through or refuses it."""
        if self._on_error == "allow":
            return CallDecision(True, "ok", 0.0, 0, circuit, "")
        wait = self._probe_interval
        message = MSG_STATE_DOWN.format(seconds=max(1, round(wait)))
        return CallDecision(False, "loop_paused", wait, 0, circuit, message)

    async def record_outcome(
        self, decision: CallDecision, status: int | None = None, error: str | None = None
    ) -> bool:
        """Uncount an allowed call the provider failed, in one script call."""
        receipt = decision.receipt
        if receipt is None or not is_provider_failure(status, error):
            return False
        keys = [self._call_key(*receipt.call)]
        keys += [self._rule_events_key(name, key) for name, key in receipt.rule_keys]
        args = [repr(receipt.at)]
        try:
            removed = await self._guarded(lambda: self._uncount(keys=keys, args=args))
        except StateError:
            return False
        return bool(removed)

    async def reopen(self, circuit: str) -> bool:
        """Lift a pause (circuit or rule group) and forget the counts before now."""
        window = (
            longest_window(self._policy, self._rules)
            if is_group(circuit)
            else self._policy.window_seconds
        )
        args = [self._now(), repr(window)]
        lifted = await self._guarded(
            lambda: self._reopen(keys=[self._hold_key(circuit)], args=args)
        )
        return bool(lifted)

    async def paused(self) -> list[PausedCircuit]:
        """The circuits and rule groups paused now, by key (SCAN: an admin path)."""
        head = self._hold_key("")

        async def paused() -> list[PausedCircuit]:
            keys = sorted(
                {
                    str(key)
                    async for key in self._client.scan_iter(
                        match=_glob_escape(head) + "*", count=_SCAN_COUNT
                    )
                }
            )
            if not keys:
                return []
            views = await self._paused(keys=keys, args=[self._now()])
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

        return await self._guarded(paused)

    async def log_call(self, entry: CallLogEntry) -> None:
        """Add one entry (ZADD by time) and trim to the newest `log_keep` (dropped while down)."""
        key = f"{self._base}log"
        member = json.dumps(_encode(entry), sort_keys=True)

        async def append() -> None:
            async with self._client.pipeline(transaction=True) as pipe:
                pipe.zadd(key, {member: entry.at})
                pipe.zremrangebyrank(key, 0, -self._log_keep - 1)
                await pipe.execute()

        try:
            await self._guarded(append)
        except StateError:
            return

    async def calls_since(self, seconds: float) -> list[CallLogEntry]:
        """Entries at or after now - seconds, oldest first, read in chunks."""
        key = f"{self._base}log"
        cutoff = self._wall_clock() - seconds

        async def since() -> list[CallLogEntry]:
            found: list[CallLogEntry] = []
            offset = 0
            while True:
                batch = await self._client.zrangebyscore(
                    key, cutoff, "+inf", start=offset, num=_LOG_CHUNK
                )
                found.extend(_decode(str(raw)) for raw in batch)
                if len(batch) < _LOG_CHUNK:
                    return found
                offset += _LOG_CHUNK

        return await self._guarded(since)


def _encode(entry: CallLogEntry) -> dict[str, object]:
    """A log entry as JSON-able data, with a unique id so equal entries are kept apart."""
    return {
        "id": uuid.uuid4().hex,
        "at": entry.at,
        "provider": entry.provider,
        "agent": entry.agent,
        "session": entry.session,
        "circuit": entry.circuit,
        "model": entry.model,
        "outcome": entry.outcome,
        "status": entry.status,
        "input_tokens": entry.input_tokens,
        "output_tokens": entry.output_tokens,
        "cost": entry.cost,
        "estimated": entry.estimated,
        "fingerprint": entry.fingerprint,
        "rule": entry.rule,
        "retry": entry.retry,
        "duration_ms": entry.duration_ms,
        "fields": dict(entry.fields),
    }


def _decode(raw: str) -> CallLogEntry:
    """A log entry from its JSON form."""
    data = json.loads(raw)
    outcome = data["outcome"]
    if outcome not in OUTCOMES:
        raise StateError(f"the call log holds an unknown outcome {outcome!r}")
    return CallLogEntry(
        at=float(data["at"]),
        provider=str(data["provider"]),
        agent=str(data["agent"]),
        session=str(data["session"]),
        circuit=str(data["circuit"]),
        model=str(data["model"]),
        outcome=cast(CallOutcome, outcome),
        status=data["status"],
        input_tokens=data["input_tokens"],
        output_tokens=data["output_tokens"],
        cost=data["cost"],
        estimated=bool(data["estimated"]),
        fingerprint=str(data["fingerprint"]),
        rule=data["rule"],
        retry=int(data["retry"]),
        duration_ms=float(data["duration_ms"]),
        fields=MappingProxyType({str(k): str(v) for k, v in data["fields"].items()}),
    )


def _glob_escape(text: str) -> str:
    """`text` as a literal in a Redis MATCH pattern."""
    return "".join("\\" + ch if ch in "*?[]\\" else ch for ch in text)
