"""Budget charges and request-log batches that could not reach Redis, kept to write again.

A call in flight when Redis goes away is answered by the provider and then charged; the
charge (and the call's request-log entry) would be lost with the failed write, and
`/admin/spend` would under-report. The Redis call store (gateway.calls.redis_store)
keeps each failed write here, exactly as it was to be sent (its script's KEYS and ARGV),
and writes them again, oldest first, once Redis answers (the link's recovery, at the
latest the owner lease's next beat, a few seconds). A write is replayed until Redis
answers it; one that Redis refuses for another reason is dropped, logged.

Sending a write again must not count it twice when its first try did reach Redis and
only the answer was lost:
- a charge carries an id (`ChargeIds`, one sequence per store instance): the charge
  script records the ids it applied in the owner's set and skips one it finds there. The
  ids stay in that set until the store has its answer (`ChargeIds.floor`: the lowest id
  still unanswered, below which the script forgets them), so the set stays as small as
  the charges in flight;
- a log batch is one script call whose entries each carry a unique id; the log script
  skips a batch whose first entry is in the log already (gateway.calls.query_redis);
- the release of a budgeted call's decision that was sent and never answered (kept
  under `on_error: deny`, gateway.calls.redis_store) is a charge of nothing under the
  decision's reservation id, and gives back only what that decision held; it counts no
  entry (it moves no money but back).

Decisions where the issue is silent:
- Kept in this process only, not in a local file: a process that dies loses its pending
  writes, as it loses the calls it was serving; its holds go back to the budgets when
  its lease lapses (gateway.calls.owners), so the budgets never stay blocked by them.
  A file would have to be shared by the replicas that restart in another container,
  which a local file is not.
- At most `MAX_PENDING` entries (a charge counts one, a log batch its entries: a few MB
  at most); a write that would pass that is dropped and counted (`dropped`). The first
  write kept in an outage logs one warning, the first one dropped another, and the
  replay one line with what it wrote.
- A replayed charge's alerts (50/80/100 percent, the anomaly detector's) are logged, not
  sent: the call they belong to was answered long ago. A threshold it crosses is marked
  sent in the group's record as any charge's is.
- After a Redis that lost its data (restarted without persistence), the charge of a
  call admitted before the loss is added again; its hold is gone with the data, and it
  gives back at most what this process holds in the group now (`budgets.owned`), which
  may be the hold of a call admitted since: that call's group then shows less held
  until the call is charged. The money charged is exact.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass
from typing import Literal

from gateway.calls.budgets import SpendHold

MAX_PENDING = 10_000
"""Entries kept at most: charges plus request-log entries."""

WriteKind = Literal["charge", "log"]


@dataclass(frozen=True, slots=True)
class PendingWrite:
    """One failed write as it was to be sent: its script, KEYS and ARGV."""

    kind: WriteKind
    keys: tuple[str, ...]
    args: tuple[str, ...]
    entries: int = 1
    charge: int | None = None
    hold: SpendHold | None = None


class ChargeIds:
    """The ids of one store's charges and reservations (one sequence), and which of them
    still await Redis's answer."""

    def __init__(self) -> None:
        self._next = 1
        # Ids in the order given: the first key is the lowest unanswered one.
        self._open: dict[int, None] = {}

    def new(self) -> int:
        """A fresh id, unanswered until `answered`."""
        given = self._next
        self._next += 1
        self._open[given] = None
        return given

    def answered(self, charge: int) -> None:
        """Redis answered this charge: its id may leave the owner's set."""
        self._open.pop(charge, None)

    def floor(self) -> int:
        """The lowest id without an answer (the next one when all are answered)."""
        return next(iter(self._open), self._next)


class PendingWrites:
    """The failed writes, oldest first, bounded by `limit` entries."""

    def __init__(self, log: logging.Logger, limit: int = MAX_PENDING) -> None:
        self._log = log
        self._limit = limit
        self._writes: deque[PendingWrite] = deque()
        self._entries = 0
        self.dropped = 0
        self._dropping = False

    @property
    def entries(self) -> int:
        """Charges and log entries waiting for Redis."""
        return self._entries

    def keep(self, write: PendingWrite) -> bool:
        """Keep a write to send again; False when the bound is reached (dropped, counted)."""
        if self._entries + write.entries > self._limit:
            self.dropped += write.entries
            if not self._dropping:
                self._dropping = True
                self._log.warning(
                    "%d budget charges and request-log entries already wait for Redis; "
                    "later ones are dropped until it is back",
                    self._entries,
                )
            return False
        if not self._writes:
            self._log.warning(
                "a %s could not reach Redis: kept in this process (up to %d entries) "
                "and written when Redis answers again",
                "budget charge" if write.kind == "charge" else "request-log batch",
                self._limit,
            )
        self._writes.append(write)
        self._entries += write.entries
        return True

    def first(self) -> PendingWrite | None:
        """The oldest write waiting, None when none is."""
        return self._writes[0] if self._writes else None

    def done(self) -> PendingWrite:
        """Forget the oldest write: Redis has it (or refused it for good)."""
        write = self._writes.popleft()
        self._entries -= write.entries
        if not self._writes:
            self._dropping = False
        return write
