"""In-process state: the default backend, fast and lost on restart.

Transcripts are held within a budget of bytes (`state.max_transcript_bytes`), least
recently written evicted first: see gateway/state/memory_transcripts.py.
"""

from __future__ import annotations

import itertools
import math
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence

from gateway.config.limits import DEFAULT_TRANSCRIPT_BYTES
from gateway.state import audit, receipts
from gateway.state.activity import ActivityBucket, ActivityEvent, Span
from gateway.state.base import AuditEntry, AuditKind, Transcript, TranscriptEntry
from gateway.state.memory_activity import MemoryActivity
from gateway.state.memory_transcripts import MemoryTranscripts
from gateway.state.receipts import Receipt
from guards.bot_loop import (
    BotLoopGuard,
    BotLoopPolicy,
    PairDecision,
    PairSnapshot,
    step_bot_turns,
)
from guards.room_budget import RoomBudgets, RoomDecision

_AUDIT_KEEP = 1000
# Messages whose bot-turn count is remembered, so every hosted bot seeing one gets the
# same count; hosted bots see a message within moments of each other, so a few thousand
# recent messages is plenty.
_TURNS_SEEN_KEEP = 4096


class MemoryStateStore:
    """A StateStore held in this process; one BotLoopGuard serves every room's policy."""

    def __init__(
        self,
        *,
        clock: Callable[[], float] | None = None,
        max_transcript_bytes: int = DEFAULT_TRANSCRIPT_BYTES,
    ) -> None:
        self._clock = clock or time.monotonic
        self._owner = receipts.new_owner()
        # One guard for every policy: each call brings the room's policy, so a `/loop set`
        # keeps the pair's events in the window (guards/bot_loop.py `step_pair`).
        self._pairs = BotLoopGuard(clock=self._clock)
        self._rooms = RoomBudgets(clock=self._clock)
        self._bot_turns: dict[str, int] = {}
        self._turns_seen: dict[str, int] = {}
        self._turns_order: deque[str] = deque()
        # Claims and dedupe receipts, by key (a claim is a receipt confirmed at once).
        self._claims: dict[str, Receipt] = {}
        self._claim_order: deque[tuple[float, str]] = deque()
        self._overrides: dict[str, dict[str, object]] = {}
        self._cursors: dict[str, str] = {}
        self._pauses: dict[str, float] = {}
        self._audit: deque[AuditEntry] = deque(maxlen=_AUDIT_KEEP)
        # The `others` log (gateway/state/audit.py) and how many entries each sender has in it.
        self._others: deque[AuditEntry] = deque()
        self._others_by: dict[tuple[str, str], int] = {}
        self._transcripts = MemoryTranscripts(max_transcript_bytes)
        self._activity = MemoryActivity()

    async def start(self) -> None:
        """Nothing to open."""

    async def aclose(self) -> None:
        """Nothing to close."""

    async def pair_decide(
        self, *, scope: str, self_bot_id: str, sender_bot_id: str, policy: BotLoopPolicy
    ) -> PairDecision:
        """Step the pair's record under the room's policy."""
        return self._pairs.decide(
            self_bot_id=self_bot_id, sender_bot_id=sender_bot_id, scope=scope, policy=policy
        )

    async def pair_reset(self, *, scope: str | None = None, bot_id: str | None = None) -> int:
        """Forget pairs; count what was dropped."""
        before = len(self._pairs)
        self._pairs.reset(scope=scope, bot_id=bot_id)
        return before - len(self._pairs)

    async def pair_snapshot(self, scope: str | None = None) -> list[PairSnapshot]:
        """The live pairs, optionally in one room."""
        return self._pairs.snapshot(scope)

    async def room_decide(
        self, *, scope: str, bot: str, message_key: str | None, policy: BotLoopPolicy
    ) -> RoomDecision:
        """Step the room's budget record under the room's policy."""
        return self._rooms.decide(scope, policy, bot=bot, key=message_key or "")

    async def room_reset(self, scope: str | None = None) -> int:
        """Forget one room's budget, or every room's."""
        return self._rooms.reset(scope)

    async def bot_turn(self, scope: str, *, is_bot: bool, message_key: str | None = None) -> int:
        """Count consecutive bot turns; a human resets; a message key counts once."""
        if message_key is not None:
            seen = self._turns_seen.get(message_key)
            if seen is not None:
                return seen
        count = step_bot_turns(self._bot_turns.get(scope, 0), is_bot=is_bot)
        if count:
            self._bot_turns[scope] = count
        else:
            self._bot_turns.pop(scope, None)
        if message_key is not None:
            self._turns_seen[message_key] = count
            self._turns_order.append(message_key)
            if len(self._turns_order) > _TURNS_SEEN_KEEP:
                del self._turns_seen[self._turns_order.popleft()]
        return count

    async def bot_turns_peek(self, scope: str) -> int:
        """The room's count, unchanged."""
        return self._bot_turns.get(scope, 0)

    async def claim(self, key: str, ttl: float) -> bool:
        """First claimant wins until the TTL runs out."""
        now = self._clock()
        held = self._claims.get(key)
        if held is not None and held.expires_at > now:
            return False
        self._hold(key, Receipt(self._owner, confirmed=True, expires_at=now + ttl), now)
        return True

    async def receive(self, key: str, ttl: float) -> bool:
        """Take the receipt in flight unless it is held (this store is its only owner)."""
        now = self._clock()
        taken = receipts.receive(
            self._claims.get(key), owner=self._owner, owner_alive=False, now=now, ttl=ttl
        )
        if taken is None:
            return False
        self._hold(key, taken, now)
        return True

    async def confirm(self, key: str, ttl: float) -> None:
        """Mark the receipt answered for `ttl` seconds from now."""
        now = self._clock()
        self._hold(key, Receipt(self._owner, confirmed=True, expires_at=now + ttl), now)

    def _hold(self, key: str, receipt: Receipt, now: float) -> None:
        """Store a claim or receipt; expired ones are swept lazily.

        They are swept from the front of a queue in the order stored, O(1) amortised per
        call; one with a short TTL behind one with a longer TTL is dropped late (it has
        expired already, so it is never honoured, only kept a while longer).
        """
        claims = self._claims
        order = self._claim_order
        while order and order[0][0] <= now:
            due, old = order.popleft()
            swept = claims.get(old)
            if swept is not None and swept.expires_at == due:
                del claims[old]
        claims[key] = receipt
        order.append((receipt.expires_at, key))

    async def get_overrides(self, scope: str) -> Mapping[str, object]:
        """A copy of the scope's overrides."""
        return dict(self._overrides.get(scope, {}))

    async def set_override(self, scope: str, field: str, value: object) -> None:
        """Set one override."""
        self._overrides.setdefault(scope, {})[field] = value

    async def clear_overrides(self, scope: str) -> None:
        """Drop a scope's overrides."""
        self._overrides.pop(scope, None)

    async def cursor_get(self, key: str) -> str | None:
        """The position saved under `key`."""
        return self._cursors.get(key)

    async def cursor_set(self, key: str, value: str) -> None:
        """Save a position."""
        self._cursors[key] = value

    async def pause(self, scope: str, seconds: float | None) -> None:
        """Pause until now + seconds, or forever."""
        self._pauses[scope] = math.inf if seconds is None else self._clock() + seconds

    async def resume(self, scope: str) -> None:
        """Lift the pause."""
        self._pauses.pop(scope, None)

    async def pause_remaining(self, scope: str) -> float | None:
        """Time left, inf when indefinite, None when not paused."""
        until = self._pauses.get(scope)
        if until is None:
            return None
        left = until - self._clock()
        if left <= 0:
            del self._pauses[scope]
            return None
        return left

    async def audit(self, entry: AuditEntry) -> None:
        """Append to the entry's bounded log; in `others`, a sender's oldest goes first."""
        if entry.kind == "admin":
            self._audit.append(entry)
            return
        who = audit.sender(entry)
        held = self._others_by.get(who, 0)
        if held >= audit.OTHERS_PER_SENDER:
            oldest = next(i for i, e in enumerate(self._others) if audit.sender(e) == who)
            del self._others[oldest]
        else:
            self._others_by[who] = held + 1
        self._others.append(entry)
        if len(self._others) > audit.OTHERS_KEEP:
            gone = audit.sender(self._others.popleft())
            self._others_by[gone] -= 1
            if not self._others_by[gone]:
                del self._others_by[gone]

    async def recent_audit(
        self, limit: int = 20, scope: str | None = None, kind: AuditKind | None = None
    ) -> list[AuditEntry]:
        """Newest first, of one log or both."""

        def newest(log: deque[AuditEntry]) -> list[AuditEntry]:
            entries = (e for e in reversed(log) if scope is None or e.room == scope)
            return list(itertools.islice(entries, max(limit, 0)))

        admin = newest(self._audit) if kind != "others" else []
        others = newest(self._others) if kind != "admin" else []
        return audit.newest_first(admin, others, limit)

    @property
    def transcript_bytes(self) -> int:
        """The bytes every transcript holds, as counted against `max_transcript_bytes`."""
        return self._transcripts.held_bytes

    async def transcript_append(
        self, scope: str, entry: TranscriptEntry, *, max_messages: int, ttl: float
    ) -> bool:
        """Append once per key; trim to `max_messages` and to the byte budget; live `ttl`."""
        return self._transcripts.append(
            scope, entry, max_messages=max_messages, ttl=ttl, now=self._clock()
        )

    async def transcript_recent(self, scope: str, limit: int) -> Transcript:
        """The newest `limit` entries, oldest first (nothing here can be unreadable)."""
        return self._transcripts.recent(scope, limit, self._clock())

    async def transcript_forget(self, scope: str, *, threads: bool = False) -> int:
        """Drop the transcript (and, with `threads`, every thread's of it)."""
        return self._transcripts.forget(scope, threads=threads)

    async def activity_append(self, events: Sequence[ActivityEvent]) -> None:
        """Store and count the events (gateway/state/memory_activity.py)."""
        self._activity.append(events)

    async def activity_since(
        self, cursor: int | None, limit: int, room: str | None = None
    ) -> tuple[list[ActivityEvent], int | None]:
        """Events after `cursor`, oldest first, and the next cursor."""
        return self._activity.since(cursor, limit, room)

    async def activity_series(
        self, span: Span, now: float, room: str | None = None
    ) -> list[ActivityBucket]:
        """The chart's buckets, oldest first."""
        return self._activity.series(span, now, room)

    async def activity_rooms(self) -> list[tuple[str, float]]:
        """Rooms seen, newest first."""
        return self._activity.rooms()
