"""The spend anomaly detector as one pure step: an agent spending far above its own median.

`step_anomaly(record, event, policy, now) -> (record, alert)` runs on every charge of a
call's real usage (the call store does it in the same transaction, or the same Lua
script call, as the budgets' `step_charge`): it adds what the call cost to the agent's
spend in the current window and says whether that window has become an anomaly. The
memory and SQLite call stores load an `AgentSpend`, step it and save it; the Redis call
store's Lua (gateway.calls.anomaly_redis) is the one sanctioned second version, held to
this one by tests/gateway/calls/test_anomaly.py. `step_agent_hold` is the other half of
`action: pause`: the check, before the budgets, that refuses the calls of a paused agent.
Stdlib only, no I/O.

Decisions the design left open:
- Windows are aligned to the epoch (`floor(now / window)`: with `1h`, 14:00 to 15:00
  UTC), so "the last window" is the current one and "one alert per window" means one per
  such window, the same on every replica; the median is over the windows before it in the
  last 7 days (`HISTORY_SECONDS`), a window with no spend counting as 0, but never over
  windows before the agent's first charge (it did not exist then). It is worked out once,
  when the first charge of a window rolls the record over: the earlier windows do not
  change within one, so a call never pays for it. Odd counts take the middle window,
  even ones the mean of the two middle ones.
- An agent is the circuit root (the proxy key's agent, `ProxyClient.root`), not the
  `X-Loopwarden-Agent` header: a header never escapes the detector by naming a new agent.
  An agent whose first charge is less than a day old (`NEW_AGENT_SECONDS`) is judged by
  `min_usd` alone; every other agent needs spend above both `min_usd` and
  `factor` x median. A record whose window and the 7 days after it are over
  (`expires_at`) counts as none, so a backend may drop it then (by TTL, or swept): an
  agent back after 7 quiet days would be judged against a median of 0, by `min_usd`
  alone, either way.
- Money is whole nano-dollars, as in gateway.calls.budgets; `factor` x median is one
  float product, the same in Python and Lua (IEEE doubles both).
- The alert names the agent's top sessions (`TOP_SESSIONS`) by spend in the window. At
  most `MAX_SESSIONS` sessions are told apart per window; the calls of later sessions in
  it count together as `OTHER_SESSIONS`, so a client minting session ids cannot grow the
  record without bound.
- `action: pause` pauses the agent with a hold under `anomaly_key(root)` (`anomaly=AGENT`,
  which no circuit key can be: a circuit's first part is percent-quoted) in the call
  store's holds, so `/admin/circuits` and `loopwarden circuits` list it and reopen lifts
  it. The pause has no end of its own ("until reopened"): it lasts `PAUSE_SECONDS`, the
  longest duration loopwarden stores. A paused agent's calls are refused `loop_paused`
  (`AgentPaused`), also when the call guard runs in shadow mode (issue 20).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Literal, NamedTuple
from urllib.parse import quote

from guards.call_loop import CallDecision, Hold, pause_hold

AnomalyAction = Literal["alert", "pause"]
HISTORY_SECONDS = 7 * 86_400
NEW_AGENT_SECONDS = 86_400
MIN_WINDOW_SECONDS = 60.0
MAX_WINDOW_SECONDS = 86_400.0
TOP_SESSIONS = 5
MAX_SESSIONS = 100
OTHER_SESSIONS = "(other sessions)"
NO_SESSION = "(none)"
PAUSE_SECONDS = 366 * 86_400
PAUSE_REASON = "anomaly"
ANOMALY_PREFIX = "anomaly="
MSG_AGENT_PAUSED = (
    "loopwarden: this agent's calls are paused after a spend anomaly, until an admin reopens {key}."
)


def anomaly_key(root: str) -> str:
    """The hold key that pauses every call of an agent: `anomaly=billing-bot`."""
    return ANOMALY_PREFIX + quote(root, safe="")


@dataclass(frozen=True, slots=True)
class AnomalyPolicy:
    """`proxy.anomaly`: the window, the factor over the median, the floor, the action."""

    window: float
    factor: float
    min_nano: int
    action: AnomalyAction = "alert"

    @property
    def windows(self) -> int:
        """How many windows the median looks back over (7 days' worth)."""
        return math.floor(HISTORY_SECONDS / self.window)

    def index(self, now: float) -> int:
        """The window holding `now` (windows are aligned to the epoch)."""
        return math.floor(now / self.window)


@dataclass(frozen=True, slots=True)
class AnomalyEvent:
    """One charge as the detector sees it: the agent, its hold key, the session, the cost."""

    agent: str
    hold_key: str
    session: str
    used: int


class AnomalyCharge(NamedTuple):
    """What the store's `settle` steps the detector with: the charge and the policy."""

    event: AnomalyEvent
    policy: AnomalyPolicy


@dataclass(slots=True)
class AgentSpend:
    """An agent's record: its first charge, the current window's spend, the earlier ones.

    `spent`, `sessions`, `median` and `alerted` are for window `window`; `past` holds the
    spend of earlier windows in the last 7 days (only those that spent anything).
    """

    first_at: float
    window: int
    spent: int = 0
    median: float = 0.0
    alerted: bool = False
    past: dict[int, int] = field(default_factory=dict)
    sessions: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class AnomalyAlert:
    """An agent's window became an anomaly: the figures the alert states."""

    agent: str
    window_start: float
    window_end: float
    spent: int
    median: float
    factor: float
    min_nano: int
    new_agent: bool
    sessions: tuple[tuple[str, int], ...]
    paused: str | None = None
    """The hold key the alert paused (`action: pause`), None when it only alerts."""


def median(values: list[int]) -> float:
    """The median of the windows' spends (0 for none)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return float(ordered[middle])
    return (ordered[middle - 1] + ordered[middle]) / 2


def top_sessions(sessions: dict[str, int]) -> tuple[tuple[str, int], ...]:
    """The sessions that spent most in the window, most first (ties by name)."""
    ranked = sorted(sessions.items(), key=lambda item: (-item[1], item[0]))
    return tuple(ranked[:TOP_SESSIONS])


def _roll(record: AgentSpend, index: int, policy: AnomalyPolicy) -> None:
    """Close the record's window and open `index`: keep 7 days of windows, take the median."""
    past = record.past
    if record.spent:
        past[record.window] = record.spent
    oldest = index - policy.windows
    for old in [k for k in past if k < oldest]:
        del past[old]
    first = max(oldest, policy.index(record.first_at))
    record.median = median([past.get(k, 0) for k in range(first, index)])
    record.window = index
    record.spent = 0
    record.alerted = False
    record.sessions = {}


def expires_at(record: AgentSpend, policy: AnomalyPolicy) -> float:
    """When a record stops mattering: its window and the 7 days after it are over."""
    return (record.window + 1) * policy.window + HISTORY_SECONDS


def step_anomaly(
    record: AgentSpend | None, event: AnomalyEvent, policy: AnomalyPolicy, now: float
) -> tuple[AgentSpend, AnomalyAlert | None]:
    """Add one charge to the agent's window; the alert when the window just became an anomaly.

    The record is updated in place (a new agent, or one back after its record expired,
    gets a new one). A clock that went back stays in the record's window.
    """
    index = policy.index(now)
    if record is None or expires_at(record, policy) <= now:
        record = AgentSpend(first_at=now, window=index)
    elif index > record.window:
        _roll(record, index, policy)
    record.spent += event.used
    sessions = record.sessions
    session = event.session or NO_SESSION
    if session not in sessions and len(sessions) >= MAX_SESSIONS:
        session = OTHER_SESSIONS
    sessions[session] = sessions.get(session, 0) + event.used
    if record.alerted or record.spent <= policy.min_nano:
        return record, None
    new_agent = now - record.first_at < NEW_AGENT_SECONDS
    if not new_agent and record.spent <= policy.factor * record.median:
        return record, None
    record.alerted = True
    start = record.window * policy.window
    alert = AnomalyAlert(
        agent=event.agent,
        window_start=start,
        window_end=start + policy.window,
        spent=record.spent,
        median=record.median,
        factor=policy.factor,
        min_nano=policy.min_nano,
        new_agent=new_agent,
        sessions=top_sessions(sessions),
        paused=event.hold_key if policy.action == "pause" else None,
    )
    return record, alert


def anomaly_pause(earlier: Hold | None, now: float) -> Hold:
    """The hold `action: pause` puts on an agent (an earlier reopen's fresh start carries over)."""
    live = None if earlier is None or earlier.expires_at <= now else earlier
    return pause_hold(live, now, PAUSE_SECONDS, reason=PAUSE_REASON, rule=None)


@dataclass(frozen=True, slots=True)
class AgentPaused(CallDecision):
    """The refusal of a call of an agent the detector paused: a spend decision, not a guard's.

    It reads as any `loop_paused` (the same answer, log entry and listing), but no call
    guard gave it, so no call guard's shadow mode waives it (`ShadowGuards.covers`).
    """


def agent_paused(key: str, circuit: str, remaining: float, count: int) -> AgentPaused:
    """The verdict on a call of a paused agent (`count`: the calls its pause has refused)."""
    message = MSG_AGENT_PAUSED.format(key=key)
    return AgentPaused(False, "loop_paused", remaining, count, circuit, message)


def step_agent_hold(
    hold: Hold | None, key: str, circuit: str, now: float
) -> tuple[Hold | None, CallDecision | None]:
    """A call of a paused agent: its hold after the refusal (one more counted) and the verdict.

    A hold that is not a running pause refuses nothing and is returned unchanged.
    """
    if hold is None or hold.paused_until <= now:
        return hold, None
    refused = replace(hold, count=hold.count + 1)
    return refused, agent_paused(key, circuit, refused.paused_until - now, refused.count)
