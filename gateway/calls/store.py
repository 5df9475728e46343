"""The CallStore seam: CallLoopGuard decisions and the request log behind one async interface.

Three backends answer alike: `MemoryCallStore` (this module: one process, lost on
restart), `SqliteCallStore` (gateway.calls.sqlite_store: one node, pauses and the log
survive a restart) and `RedisCallStore` (gateway.calls.redis_store: several proxy or
gateway replicas share circuits). `gateway.calls.factory.build_call_store` picks one from
the `state:` section, so the call guard lives where the rest of the state lives.

Decisions where DESIGN.md is silent:
- The request log holds wall-clock times (`at`, seconds since the epoch), set by whoever
  logs the call; `calls_since(seconds)` compares them with the store's wall clock. The
  memory backend decides on a monotonic clock (it never restarts), the others on time
  they can persist (see their modules).
- The memory log keeps the newest `log_keep` entries (100,000 by default); so do the
  others, so a busy proxy never fills its disk or Redis with the log.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from gateway.calls.anomaly import (
    ANOMALY_PREFIX,
    AgentPaused,
    AgentSpend,
    AnomalyAlert,
    AnomalyCharge,
    anomaly_pause,
    step_agent_hold,
    step_anomaly,
)
from gateway.calls.budgets import (
    ADMITTED_FREE,
    Amount,
    GroupSpend,
    Limits,
    SpendAlert,
    SpendEvent,
    SpendHold,
    SpendVerdict,
    step_charge,
    step_release,
    step_spend,
)
from gateway.calls.budgets_memory import SpendTable
from gateway.calls.entry import _NO_FIELDS, CallLogEntry
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
from guards.call_loop import (
    CallDecision,
    CallLoopGuard,
    CallLoopPolicy,
    Hold,
    PausedCircuit,
    UniquenessRule,
    step_reopen,
)

LOG_KEEP = 100_000


@dataclass(frozen=True, slots=True)
class ShadowGuards:
    """Which call guards run in shadow mode: the circuit's, and the rules named.

    A call one of them refuses is forwarded anyway (DESIGN.md §5), so admission keeps
    its budget hold as for an admitted call: shadow mode changes what is enforced, never
    what is counted. The pause of an agent the anomaly detector stopped (`AgentPaused`)
    is a spend decision: no call guard's shadow mode waives it (issue 20).
    """

    circuit: bool = False
    rules: frozenset[str] = frozenset()

    def covers(self, refused: CallDecision) -> bool:
        """True when the guard that gave this refusal runs in shadow mode."""
        if isinstance(refused, AgentPaused):
            return False
        return self.circuit if refused.rule is None else refused.rule in self.rules

    def flags(self, rules: Sequence[UniquenessRule]) -> str:
        """The Redis script's form: '1' or '0' for the circuit, then for each rule given."""
        marks = [self.circuit, *(rule.name in self.rules for rule in rules)]
        return "".join("1" if mark else "0" for mark in marks)


ENFORCED = ShadowGuards()
"""Every guard enforces: a refused call holds nothing."""


class Admission(NamedTuple):
    """The verdicts on one call: the budgets', then (when they admit it) the repeat guard's.

    `call` is None when a budget refused the call: the repeat guard never counted it.
    """

    call: CallDecision | None
    spend: SpendVerdict


class Settled(NamedTuple):
    """What charging a call's real usage said: the budgets' alerts and the detector's."""

    alerts: list[SpendAlert]
    anomaly: AnomalyAlert | None = None


class CallStore(Protocol):
    """Circuits, pauses, uniqueness-rule windows and the request log of LLM calls."""

    async def start(self) -> None:
        """Open connections and create schemas; called once before the first call."""

    async def aclose(self) -> None:
        """Flush and close."""

    async def decide(
        self,
        circuit: str,
        fingerprint: str,
        fields: Mapping[str, str] = _NO_FIELDS,
        *,
        policy: CallLoopPolicy | None = None,
    ) -> CallDecision:
        """Decide one call atomically and, when it is allowed, count it.

        `policy` is the circuit's policy for this call (a room's `policy.call_loop`); None
        is the store's own. The calls already counted count against whichever applies.
        """

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
        """Decide one call on its budgets (`gateway.calls.budgets.step_spend`) and, when
        they admit it, as `decide` does, atomically; an admitted call's estimate is held,
        and so is that of a call a guard of `shadow` refuses (it is forwarded anyway).
        """

    async def charge(self, hold: SpendHold, used: Amount | None) -> list[SpendAlert]:
        """Replace an admitted call's hold with what it used (None: it cost nothing)."""

    async def settle(
        self, hold: SpendHold, used: Amount | None, anomaly: AnomalyCharge | None = None
    ) -> Settled:
        """`charge`, and with `anomaly` the detector's step on the agent, atomically.

        An anomaly under `action: pause` pauses the agent there too (`anomaly_key`).
        """

    async def spend_groups(self) -> list[tuple[str, GroupSpend]]:
        """The budget groups of periods not ended, by storage key."""

    async def spend_limits(self) -> dict[str, Limits]:
        """The admins' limits in force, by budget-and-period key."""

    async def set_spend_limit(self, key: str, limits: Limits, ends_at: float) -> None:
        """Set a budget's limits until its period ends (the next call is held to them)."""

    async def reset_spend(self, key: str) -> bool:
        """Forget one group's spend this period; True when it had any."""

    async def record_outcome(
        self, decision: CallDecision, status: int | None = None, error: str | None = None
    ) -> bool:
        """Uncount an allowed call the provider failed (429, 408, 5xx, timeout, dropped)."""

    async def reopen(self, circuit: str) -> bool:
        """Lift the pause of a circuit (or rule group) and forget its counts so far."""

    async def paused(self) -> list[PausedCircuit]:
        """The circuits and rule groups paused now, by key."""

    async def log_call(self, entry: CallLogEntry) -> None:
        """Append one call to the request log."""

    async def log_calls(self, entries: Sequence[CallLogEntry]) -> None:
        """Append calls to the request log in order, in one write (the proxy's batches)."""

    async def calls_since(self, seconds: float) -> list[CallLogEntry]:
        """The logged calls of the last `seconds`, oldest first."""

    async def query_calls(
        self, where: CallFilter, limit: int, cursor: Cursor | None = None
    ) -> CallPage:
        """A page of the logged calls `where` matches, newest first (`gateway.calls.query`)."""

    async def call_totals(self, where: CallFilter) -> CallTotals:
        """What the logged calls `where` matches add up to."""

    async def cost_series(
        self, where: CallFilter, since: float, until: float, bucket_seconds: float
    ) -> list[CostBucket]:
        """The matched calls of since..until per bucket of `bucket_seconds`, oldest first."""


class MemoryCallStore:
    """A CallStore in this process: a CallLoopGuard and a bounded in-memory request log."""

    def __init__(
        self,
        policy: CallLoopPolicy | None = None,
        rules: Iterable[UniquenessRule] = (),
        *,
        clock: Callable[[], float] | None = None,
        wall_clock: Callable[[], float] = time.time,
        log_keep: int = LOG_KEEP,
        guard: CallLoopGuard | None = None,
    ) -> None:
        # `is not None`: an empty guard has len() 0 and so is falsy.
        self.guard = guard if guard is not None else CallLoopGuard(policy, rules, clock=clock)
        self._wall_clock = wall_clock
        self._log: deque[CallLogEntry] = deque(maxlen=log_keep)
        self._spend = SpendTable()
        # The anomaly detector's records and pauses, by agent (one per proxy key's agent).
        self._agents: dict[str, AgentSpend] = {}
        self._agent_holds: dict[str, Hold] = {}

    async def start(self) -> None:
        """Nothing to open."""

    async def aclose(self) -> None:
        """Nothing to close."""

    async def decide(
        self,
        circuit: str,
        fingerprint: str,
        fields: Mapping[str, str] = _NO_FIELDS,
        *,
        policy: CallLoopPolicy | None = None,
    ) -> CallDecision:
        """The guard's decision (no I/O: it never waits)."""
        return self.guard.check(
            circuit=circuit, fingerprint=fingerprint, fields=fields, policy=policy
        )

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
        """The agent's pause, the budgets' step, then the guard's decision (atomic: no I/O)."""
        now = self._wall_clock()
        key = spend.agent_hold
        if key is not None:
            hold, paused = step_agent_hold(self._agent_holds.get(key), key, circuit, now)
            if paused is not None and hold is not None:
                self._agent_holds[key] = hold
                return Admission(paused, ADMITTED_FREE)
        table = self._spend
        record, verdict = step_spend(table.load(spend, now), spend, now)
        if not verdict.allowed:
            table.save(spend, record)
            return Admission(None, verdict)
        decision = self.guard.check(
            circuit=circuit, fingerprint=fingerprint, fields=fields, policy=policy
        )
        if not decision.allowed and verdict.hold is not None and not shadow.covers(decision):
            record = step_release(record, verdict.hold, now)
        table.save(spend, record)
        return Admission(decision, verdict)

    async def charge(self, hold: SpendHold, used: Amount | None) -> list[SpendAlert]:
        """`step_charge` on this process's records."""
        return (await self.settle(hold, used)).alerts

    async def settle(
        self, hold: SpendHold, used: Amount | None, anomaly: AnomalyCharge | None = None
    ) -> Settled:
        """`step_charge` and `step_anomaly` on this process's records."""
        now = self._wall_clock()
        record, alerts = step_charge(self._spend.load(hold, now), hold, used, now)
        self._spend.save(hold, record)
        if anomaly is None:
            return Settled(alerts)
        event = anomaly.event
        agent, found = step_anomaly(self._agents.get(event.agent), event, anomaly.policy, now)
        self._agents[event.agent] = agent
        if found is not None and found.paused is not None:
            earlier = self._agent_holds.get(found.paused)
            self._agent_holds[found.paused] = anomaly_pause(earlier, now)
        return Settled(alerts, found)

    async def spend_groups(self) -> list[tuple[str, GroupSpend]]:
        """The live groups of this process."""
        return self._spend.live(self._wall_clock())

    async def spend_limits(self) -> dict[str, Limits]:
        """The admins' limits in force in this process."""
        return self._spend.live_limits(self._wall_clock())

    async def set_spend_limit(self, key: str, limits: Limits, ends_at: float) -> None:
        """Keep an admin's limits until the period ends."""
        self._spend.set_limit(key, limits, ends_at)

    async def reset_spend(self, key: str) -> bool:
        """Forget one group's spend."""
        return self._spend.reset(key)

    async def record_outcome(
        self, decision: CallDecision, status: int | None = None, error: str | None = None
    ) -> bool:
        """The guard's record_outcome."""
        return self.guard.record_outcome(decision, status=status, error=error)

    async def reopen(self, circuit: str) -> bool:
        """The guard's reopen (an agent's anomaly pause: this store's)."""
        if not circuit.startswith(ANOMALY_PREFIX):
            return self.guard.reopen(circuit)
        earlier = self._agent_holds.get(circuit)
        if earlier is None:
            return False
        window = self.guard.policy.window_seconds
        hold, lifted = step_reopen(earlier, self._wall_clock(), window)
        self._agent_holds[circuit] = hold
        return lifted

    async def paused(self) -> list[PausedCircuit]:
        """The guard's paused circuits and groups, and the agents the detector paused."""
        now = self._wall_clock()
        agents = [
            PausedCircuit(key, hold.paused_until - now, hold.reason, hold.count)
            for key, hold in self._agent_holds.items()
            if hold.paused_until > now
        ]
        if not agents:
            return self.guard.paused()
        return sorted([*self.guard.paused(), *agents], key=_paused_key)

    async def log_call(self, entry: CallLogEntry) -> None:
        """Append; the oldest entry goes beyond `log_keep`."""
        self._log.append(entry)

    async def log_calls(self, entries: Sequence[CallLogEntry]) -> None:
        """Append in order; the oldest entries go beyond `log_keep`."""
        self._log.extend(entries)

    async def calls_since(self, seconds: float) -> list[CallLogEntry]:
        """Entries at or after now - seconds, oldest first."""
        cutoff = self._wall_clock() - seconds
        return sorted((e for e in self._log if e.at >= cutoff), key=_entry_time)

    async def query_calls(
        self, where: CallFilter, limit: int, cursor: Cursor | None = None
    ) -> CallPage:
        """The page, read newest first."""
        builder = PageBuilder(where, limit, cursor)
        for entry in self._newest_first():
            if builder.offer(entry):
                break
        return builder.page()

    async def call_totals(self, where: CallFilter) -> CallTotals:
        """The sums over the whole log."""
        builder = TotalsBuilder(where)
        for entry in self._log:
            builder.add(entry)
        return builder.totals()

    async def cost_series(
        self, where: CallFilter, since: float, until: float, bucket_seconds: float
    ) -> list[CostBucket]:
        """The sums per bucket over the whole log."""
        builder = SeriesBuilder(where, since, until, bucket_seconds)
        for entry in self._log:
            builder.add(entry)
        return builder.buckets()

    def _newest_first(self) -> list[CallLogEntry]:
        """The log by time, newest first; entries of one time newest written first."""
        return sorted(reversed(self._log), key=_entry_time, reverse=True)


def _paused_key(paused: PausedCircuit) -> str:
    """Sort key of a paused circuit: its key."""
    return paused.circuit


def _entry_time(entry: CallLogEntry) -> float:
    """Sort key of a log entry: its time."""
    return entry.at
