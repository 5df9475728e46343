"""The spend records of one process: what the memory call store steps budgets over.

Records and admins' limits are kept by key until their period ends; a heap of ends lets
each call drop a few ended ones (an ended record counts as none, so when it goes changes
no answer), never by a scan.
"""

from __future__ import annotations

import heapq

from gateway.calls.budgets import (
    GroupSpend,
    Limits,
    SpendEvent,
    SpendHold,
    SpendRecord,
)

# Ended records dropped per call: more than a call adds, so they go quickly.
_SWEEP_PER_CALL = 4


class SpendTable:
    """Group records and admins' limits by key, each until its period ends."""

    def __init__(self) -> None:
        self.groups: dict[str, GroupSpend] = {}
        self.limits: dict[str, tuple[Limits, float]] = {}
        self._ends: list[tuple[float, str, str]] = []

    def load(self, groups: SpendEvent | SpendHold, now: float) -> SpendRecord:
        """The record of an event's (or a hold's) groups, ended ones dropped first."""
        self._sweep(now)
        return SpendRecord(
            [self.groups.get(group.key) for group in groups.groups],
            [self.limit(group.limit_key, now) for group in groups.groups],
        )

    def save(self, groups: SpendEvent | SpendHold, record: SpendRecord) -> None:
        """Keep what the step left (the records are updated in place; new ones are added)."""
        for group, current in zip(groups.groups, record.groups, strict=True):
            if current is None:
                self.groups.pop(group.key, None)
            elif self.groups.get(group.key) is not current:
                self.groups[group.key] = current
                heapq.heappush(self._ends, (current.ends_at, "g", group.key))

    def limit(self, key: str, now: float) -> Limits | None:
        """An admin's limits for a budget's period, while it lasts."""
        found = self.limits.get(key)
        return None if found is None or found[1] <= now else found[0]

    def set_limit(self, key: str, limits: Limits, ends_at: float) -> None:
        """An admin's limits for a budget until its period ends."""
        self.limits[key] = (limits, ends_at)
        heapq.heappush(self._ends, (ends_at, "l", key))

    def reset(self, key: str) -> bool:
        """Forget a group's spend this period; True when it had any."""
        return self.groups.pop(key, None) is not None

    def live(self, now: float) -> list[tuple[str, GroupSpend]]:
        """The groups whose period has not ended, by key."""
        return sorted((key, g) for key, g in self.groups.items() if g.ends_at > now)

    def live_limits(self, now: float) -> dict[str, Limits]:
        """The admins' limits in force, by budget-and-period key."""
        return {key: limits for key, (limits, ends) in self.limits.items() if ends > now}

    def _sweep(self, now: float) -> None:
        ends = self._ends
        for _ in range(_SWEEP_PER_CALL):
            if not ends or ends[0][0] > now:
                return
            ended, kind, key = heapq.heappop(ends)
            if kind == "g":
                group = self.groups.get(key)
                if group is not None and group.ends_at <= ended:
                    del self.groups[key]
            else:
                limit = self.limits.get(key)
                if limit is not None and limit[1] <= ended:
                    del self.limits[key]
