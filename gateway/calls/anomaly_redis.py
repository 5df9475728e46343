"""The anomaly detector in Lua: the Redis call store's one second version of gateway.calls.anomaly.

`AGENT_HOLD_CHECK` runs first in the call store's decide script (`step_agent_hold`: a
paused agent's call is refused before anything counts it); `STEP` runs inside the charge
script after the budgets' charge (`step_anomaly`, and the pause of `action: pause`), so
the charge and the detector are one script call, one round trip, after the call. Held to
the Python step by tests/gateway/calls/test_anomaly.py. The step's constants are written
into the Lua source from gateway.calls.anomaly, so they are kept once.

Keys, under the call store's `{calls}:` base, per agent: `anomaly:<agent>`, a hash (fa:
first charge; w: the current window's index; s: its spend; m: the median before it; al:
'1' once it alerted), `anomalypast:<agent>`, the earlier windows' spend by index, and
`anomalysessions:<agent>`, the current window's spend by session. All three expire a
minute after the record stops mattering (`anomaly.expires_at`). An agent's pause is the
hold `hold:anomaly=<agent>`, written with the circuits' own hold functions.
"""

from __future__ import annotations

from collections.abc import Sequence
from string import Template

from gateway.calls.anomaly import (
    HISTORY_SECONDS,
    MAX_SESSIONS,
    NEW_AGENT_SECONDS,
    NO_SESSION,
    OTHER_SESSIONS,
    PAUSE_REASON,
    PAUSE_SECONDS,
    TOP_SESSIONS,
    AnomalyAlert,
    AnomalyCharge,
)

# Needs `now` and, when ARGV[#ARGV - 1] is 1, the agent's hold key last in KEYS.
# Refused: {5, remaining, refusals so far, 0}.
AGENT_HOLD_CHECK = """
if nagent == 1 then
  local held = hold(KEYS[#KEYS], now)
  if held and held.pu > now then
    return {5, num(held.pu - now), redis.call('HINCRBY', KEYS[#KEYS], 'n', 1), 0}
  end
end
"""

# Needs `now`, `ngroups`, KEYS from 2 * ngroups + 1 (the agent's record, earlier windows,
# sessions and hold) and ARGV from `aargs` + 1 (window, factor, min nano-dollars, pause
# '1' or '0', session, used nano-dollars). Sets `anomaly`: false, or {spent, median, new
# agent 1/0, window index, paused 1/0, then session and spend of the top sessions}.
STEP = Template(
    """
local anomaly = false
if aargs then
  local ak, pk, sk, hk = KEYS[2 * ngroups + 1], KEYS[2 * ngroups + 2], KEYS[2 * ngroups + 3],
    KEYS[2 * ngroups + 4]
  local window, factor, floor_nano = tonumber(ARGV[aargs + 1]), tonumber(ARGV[aargs + 2]),
    tonumber(ARGV[aargs + 3])
  local pauses, session, used_nano = ARGV[aargs + 4] == '1', ARGV[aargs + 5], ARGV[aargs + 6]
  local index = math.floor(now / window)
  local r = redis.call('HMGET', ak, 'fa', 'w', 's', 'm', 'al')
  local fa, w, spent, med, al
  if r[1] and (tonumber(r[2]) + 1) * window + $history > now then
    fa, w, spent, med = tonumber(r[1]), tonumber(r[2]), tonumber(r[3]), tonumber(r[4])
    al = r[5] == '1'
    if index > w then
      if spent > 0 then redis.call('HSET', pk, num(w), num(spent)) end
      local oldest = index - math.floor($history / window)
      local past, byindex = redis.call('HGETALL', pk), {}
      for i = 1, #past, 2 do
        local k = tonumber(past[i])
        if k < oldest then
          redis.call('HDEL', pk, past[i])
        else
          byindex[k] = tonumber(past[i + 1])
        end
      end
      local values = {}
      for k = math.max(oldest, math.floor(fa / window)), index - 1 do
        values[#values + 1] = byindex[k] or 0
      end
      table.sort(values)
      local n = #values
      med = 0
      if n % 2 == 1 then
        med = values[(n + 1) / 2]
      elseif n > 0 then
        med = (values[n / 2] + values[n / 2 + 1]) / 2
      end
      w, spent, al = index, 0, false
      redis.call('DEL', sk)
    end
  else
    redis.call('DEL', ak, pk, sk)
    fa, w, spent, med, al = now, index, 0, 0, false
  end
  spent = spent + tonumber(used_nano)
  if redis.call('HEXISTS', sk, session) == 0 and redis.call('HLEN', sk) >= $max_sessions then
    session = $other
  end
  redis.call('HINCRBY', sk, session, used_nano)
  if not al and spent > floor_nano then
    local new_agent = now - fa < $new_agent
    if new_agent or spent > factor * med then
      al = true
      local all, ranked = redis.call('HGETALL', sk), {}
      for i = 1, #all, 2 do ranked[#ranked + 1] = {all[i], tonumber(all[i + 1])} end
      table.sort(ranked, function(x, y)
        if x[2] ~= y[2] then return x[2] > y[2] end
        return x[1] < y[1]
      end)
      anomaly = {num(spent), num(med), new_agent and 1 or 0, num(w), pauses and 1 or 0}
      for i = 1, math.min($top, #ranked) do
        anomaly[#anomaly + 1] = ranked[i][1]
        anomaly[#anomaly + 1] = num(ranked[i][2])
      end
      if pauses then pause(hk, hold(hk, now), now, $pause_seconds, $reason, '') end
    end
  end
  local al_flag = '0'
  if al then al_flag = '1' end
  redis.call('HSET', ak, 'fa', num(fa), 'w', num(w), 's', num(spent), 'm', num(med), 'al', al_flag)
  local keep = ttl((w + 1) * window + $history - now)
  redis.call('PEXPIRE', ak, keep)
  redis.call('PEXPIRE', pk, keep)
  redis.call('PEXPIRE', sk, keep)
end
"""
).substitute(
    history=HISTORY_SECONDS,
    new_agent=NEW_AGENT_SECONDS,
    max_sessions=MAX_SESSIONS,
    top=TOP_SESSIONS,
    pause_seconds=PAUSE_SECONDS,
    other=f"'{OTHER_SESSIONS}'",
    reason=f"'{PAUSE_REASON}'",
)


def keys(base: str, charge: AnomalyCharge, hold_key: str) -> list[str]:
    """The step's KEYS: the agent's record, earlier windows, sessions, and its hold."""
    agent = charge.event.agent
    return [
        f"{base}anomaly:{agent}",
        f"{base}anomalypast:{agent}",
        f"{base}anomalysessions:{agent}",
        hold_key,
    ]


def args(charge: AnomalyCharge) -> list[str]:
    """The step's ARGV."""
    event, policy = charge
    return [
        repr(policy.window),
        repr(policy.factor),
        str(policy.min_nano),
        "1" if policy.action == "pause" else "0",
        event.session or NO_SESSION,
        str(event.used),
    ]


def alert(charge: AnomalyCharge, reply: object) -> AnomalyAlert | None:
    """The alert of the charge script's `anomaly` reply (None: no anomaly)."""
    if not isinstance(reply, list):
        return None
    event, policy = charge
    fields: Sequence[object] = [
        item.decode() if isinstance(item, bytes) else item for item in reply
    ]
    spent, median, new_agent, window, paused = fields[:5]
    ranked = fields[5:]
    start = int(str(window)) * policy.window
    return AnomalyAlert(
        agent=event.agent,
        window_start=start,
        window_end=start + policy.window,
        spent=int(str(spent)),
        median=float(str(median)),
        factor=policy.factor,
        min_nano=policy.min_nano,
        new_agent=bool(int(str(new_agent))),
        sessions=tuple((str(ranked[i]), int(str(ranked[i + 1]))) for i in range(0, len(ranked), 2)),
        paused=event.hold_key if int(str(paused)) else None,
    )
