"""The Calls page's totals and cost series on the Redis call store, from per-hour sums.

`gateway.calls.query` defines the filters, totals and series; the Redis log is one sorted
set of JSON entries, so adding up 100,000 of them meant reading and decoding them all.
Each batch of logged calls also adds its `call_sums` to one hash per hour, in the same
script call as the log write; a total over a time range then reads the hours it covers
whole and scans, exactly, only the entries of the partial hours at its edges.

Keys, beside the log (`{calls}:log`):
- `{calls}:agg:<hour>`: a hash per hour (its start, in seconds since the epoch) of sums,
  field `<dimension>␟<value>␟<outcome>␟<sum>`: the dimension `*` (every call, value
  empty) or one of `AGGREGATED` with the call's value, split by outcome;
- `{calls}:agg:hours`: the hours that have a hash, scored by their start;
- `{calls}:agg:floor`: the last hour whose sums are no longer whole ("none": none yet).

Decisions where DESIGN.md is silent:
- Sums are kept for every call and per agent, model, customer and feature, each split by
  outcome, so a filter of at most one of those fields, with or without `outcome`, is
  read from them (the Calls page's usual agent + outcome too). `session` and `user` may
  take as many values as there are calls (one conversation, one end user), so sums of
  them would weigh as much as the log: those filters, and two fields together (say agent
  and customer), scan the entries of their time range as before.
- Retention follows the log's: trimming it to `log_keep` drops the oldest entries, so the
  hours up to the last trimmed entry's lose their sums (deleted in the same script) and
  become the floor; the floor's hour, and any entry older, are scanned. The hashes never
  outlive the log's oldest hour, however old it is, and need no TTL.
- A log written before these sums (no floor key) is scanned whole until the first write,
  which sets the floor at its newest entry's hour: the hours after it are summed.
- A reading is one MULTI (the floor, the hours, their sums) repeated until the floor and
  the hours it read are those it saw before, so it never mixes hours of two trims; the
  edges are read after it, like the scanned pages (a call logged in between may count).
- Money adds up with HINCRBYFLOAT (long double), other sums with HINCRBY; the answers
  are rounded to nano-dollars like every backend's.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from gateway.calls.entry import OUTCOMES, CallLogEntry
from gateway.calls.query import CallFilter, CallTotals, call_sums, series_start
from gateway.state.redis_link import Client

HOUR = 3600.0
AGGREGATED = ("agent", "model", "customer", "feature")
"""The filter fields with per-hour sums (beside `outcome`, by which every sum is split)."""
_ALL = "*"
_SEP = "\x1f"
_CODES = dict(zip(CallTotals._fields, "nrioesu", strict=True))
"""Each sum's letter in a hash field (calls, refused, tokens in/out, cost, saved, unpriced)."""
_MONEY = frozenset({"cost", "cost_saved"})

# KEYS: the log, the floor, the hour index, then one hash per hour of the batch.
# ARGV: log_keep, the hashes' key prefix, the entry count n, n pairs (time, entry JSON),
# then per hash: its hour, how many whole sums (ni) and money sums (nf), ni pairs
# (field, increment) for HINCRBY, nf pairs for HINCRBYFLOAT.
# The trimmed hours' hashes are named from the prefix (keys of one slot: `{calls}`).
# A batch whose first entry is in the log already was written by an earlier try whose
# answer was lost (gateway.calls.redis_pending): it changes nothing.
LOG_SCRIPT = """
local log, floorkey, hours = KEYS[1], KEYS[2], KEYS[3]
local keep, prefix, n = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
if n > 0 and redis.call('ZSCORE', log, ARGV[5]) then return end
local function hour_of(t) return math.floor(t / 3600) * 3600 end
local floor = redis.call('GET', floorkey)
if not floor then
  -- A log written before the sums: its hours stay on the scan path.
  local newest = redis.call('ZRANGE', log, -1, -1, 'WITHSCORES')
  floor = 'none'
  if #newest > 0 then floor = string.format('%d', hour_of(tonumber(newest[2]))) end
  redis.call('SET', floorkey, floor)
end
floor = tonumber(floor)
for first = 1, n, 500 do
  local args = {}
  for i = first, math.min(n, first + 499) do
    args[#args + 1] = ARGV[2 + 2 * i]
    args[#args + 1] = ARGV[3 + 2 * i]
  end
  redis.call('ZADD', log, unpack(args))
end
local at = 4 + 2 * n
for k = 4, #KEYS do
  local hour, ni, nf = ARGV[at], tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2])
  local live = not floor or tonumber(hour) > floor
  at = at + 3
  if live then redis.call('ZADD', hours, hour, hour) end
  for j = 1, ni + nf do
    if live and j <= ni then
      redis.call('HINCRBY', KEYS[k], ARGV[at], ARGV[at + 1])
    elseif live then
      redis.call('HINCRBYFLOAT', KEYS[k], ARGV[at], ARGV[at + 1])
    end
    at = at + 2
  end
end
local excess = redis.call('ZCARD', log) - keep
if excess > 0 then
  local last = redis.call('ZRANGE', log, excess - 1, excess - 1, 'WITHSCORES')
  redis.call('ZREMRANGEBYRANK', log, 0, excess - 1)
  local cut = hour_of(tonumber(last[2]))
  if not floor or cut > floor then
    -- The hours up to the cut lost entries: their sums go, their entries are scanned.
    redis.call('SET', floorkey, string.format('%d', cut))
    for _, h in ipairs(redis.call('ZRANGEBYSCORE', hours, '-inf', cut)) do
      redis.call('DEL', prefix .. h)
    end
    redis.call('ZREMRANGEBYSCORE', hours, '-inf', cut)
  end
end
"""


class Reading(NamedTuple):
    """A filter's sums: whole hours from the hashes, and the time ranges left to scan."""

    hours: list[tuple[float, CallTotals]]
    scan: list[tuple[float | None, float | None]]


def hour_key(base: str, hour: str) -> str:
    """The key of one hour's sums."""
    return f"{base}agg:{hour}"


def _hour_of(at: float) -> str:
    """The hour an entry's sums go to (the script's `hour_of`, the same float arithmetic)."""
    return str(int(series_start(at, HOUR)))


def _dimensions(entry: CallLogEntry) -> Iterable[tuple[str, str]]:
    """The (dimension, value) sums an entry adds to."""
    yield _ALL, ""
    yield "agent", entry.agent
    yield "model", entry.model
    for name in ("customer", "feature"):
        value = entry.fields.get(name)
        if value is not None:
            yield name, value


def log_keys_and_args(
    base: str, keep: int, members: Sequence[tuple[str, float]], entries: Sequence[CallLogEntry]
) -> tuple[list[str], list[str]]:
    """The log script's KEYS and ARGV for a batch: its members, and its sums per hour."""
    by_hour: dict[str, tuple[dict[str, int], dict[str, float]]] = {}
    for entry in entries:
        sums = call_sums(entry)._asdict()
        whole, money = by_hour.setdefault(_hour_of(entry.at), ({}, {}))
        for dimension, value in _dimensions(entry):
            head = _SEP.join((dimension, value, entry.outcome, ""))
            for stat, amount in sums.items():
                if not amount:
                    continue
                field = head + _CODES[stat]
                if stat in _MONEY:
                    money[field] = money.get(field, 0.0) + amount
                else:
                    whole[field] = whole.get(field, 0) + int(amount)
    keys = [f"{base}log", f"{base}agg:floor", f"{base}agg:hours"]
    args = [str(keep), hour_key(base, ""), str(len(members))]
    for member, at in members:
        args += [repr(at), member]
    for hour, (whole, money) in by_hour.items():
        keys.append(hour_key(base, hour))
        args += [hour, str(len(whole)), str(len(money))]
        for field, count in whole.items():
            args += [field, str(count)]
        for field, total in money.items():
            args += [field, repr(total)]
    return keys, args


def aggregation(where: CallFilter) -> tuple[str, str] | None:
    """The (dimension, value) whose sums answer a filter; None when it must be scanned."""
    if where.session is not None or where.user is not None:
        return None
    given = [
        (name, getattr(where, name)) for name in AGGREGATED if getattr(where, name) is not None
    ]
    if len(given) > 1:
        return None
    return given[0] if given else (_ALL, "")


def _sums(values: Sequence[str | None]) -> CallTotals:
    """An hour's sums from its HMGET: the sums of `_CODES`, outcome after outcome."""
    width = len(_CODES)
    calls, refused, tokens_in, tokens_out, cost, saved, unpriced = (
        sum(float(value) for value in values[index::width] if value is not None)
        for index in range(width)
    )
    return CallTotals(
        int(calls), int(refused), int(tokens_in), int(tokens_out), cost, saved, int(unpriced)
    )


async def read(
    client: Client, base: str, where: CallFilter, since: float | None, until: float | None
) -> Reading:
    """What of `where` over since..until the hours' sums answer, and what is left to scan."""
    everything = Reading([], [(since, until)])
    chosen = aggregation(where)
    first = -math.inf if since is None else math.ceil(since / HOUR) * HOUR
    end = math.inf if until is None else math.floor(until / HOUR) * HOUR
    if chosen is None or first + HOUR > end:
        return everything
    outcomes = OUTCOMES if where.outcome is None else (where.outcome,)
    codes = _CODES.values()
    fields = [_SEP.join((*chosen, outcome, code)) for outcome in outcomes for code in codes]
    low = "-inf" if since is None else str(int(first))
    high = "+inf" if until is None else str(int(end - HOUR))
    hours: list[str] = []
    seen: tuple[str | None, list[str]] | None = None
    while True:
        async with client.pipeline(transaction=True) as pipe:
            pipe.get(f"{base}agg:floor")
            pipe.zrangebyscore(f"{base}agg:hours", low, high)
            for hour in hours:
                pipe.hmget(hour_key(base, hour), fields)
            floor, found, *values = await pipe.execute()
        if floor is None:
            return everything
        if (floor, found) == seen:
            break
        seen, hours = (floor, found), found
    start = max(first, -math.inf if floor == "none" else float(floor) + HOUR)
    if start + HOUR > end:
        return everything
    summed = [
        (float(hour), _sums(sums))
        for hour, sums in zip(hours, values, strict=True)
        if float(hour) >= start
    ]
    scan: list[tuple[float | None, float | None]] = []
    if start > (-math.inf if since is None else since):
        scan.append((since, start))
    if until is not None and end < until:
        scan.append((end, until))
    return Reading(summed, scan)


def hour_sums(bucket_seconds: float) -> bool:
    """True when a series' buckets are whole hours, so hours' sums can fill them."""
    return bucket_seconds % HOUR == 0
