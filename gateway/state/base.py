"""The StateStore seam: every piece of state that must survive restarts or be shared.

Each method is one decision or one fact, so a backend can make it atomic (the Redis
backend runs each decision as one server-side script). Durations are relative seconds,
never wall-clock instants, so replicas with skewed clocks agree: the backend owns time.
Scopes are room keys such as `discord:1100123`; `"*"` is the global scope.

The seam is seven small protocols, one per kind of state (decisions, receipts, controls,
audit, transcripts, activity, cursors); `StateStore` is all of them with `start` and `aclose`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from gateway.state.activity import ActivityBucket, ActivityEvent, Span
from guards.bot_loop import BotLoopPolicy, PairDecision, PairSnapshot
from guards.room_budget import RoomDecision

GLOBAL_SCOPE = "*"


AuditKind = Literal["admin", "others"]
"""The audit trail's two logs (gateway/state/audit.py): what admins did, and the rest."""


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One admin-command attempt: who, where, what, whether it was allowed, and its log."""

    at: float
    platform: str
    room: str
    user_id: str
    user_name: str
    command: str
    allowed: bool
    outcome: str
    kind: AuditKind | None = None
    """`admin` for what an admin did, `others` for anyone else's attempt (a non-admin's
    refused command, a bot's, a person's own `/new` in a DM). Left out, it is `admin` when
    `allowed`, else `others`; it is never None once built."""

    def __post_init__(self) -> None:
        if self.kind is None:
            object.__setattr__(self, "kind", "admin" if self.allowed else "others")


@dataclass(frozen=True, slots=True)
class TranscriptEntry:
    """One message of a room's transcript (DESIGN.md §3), as every hosted bot shares it.

    `key` is the message's identity (`InboundMessage.message_key`, or the reply's): an
    entry is appended once per key, however many hosted bots or redeliveries report it.
    """

    key: str
    sender_id: str
    sender_name: str
    text: str


@dataclass(frozen=True, slots=True)
class Transcript:
    """A transcript read: its entries, oldest first, and how many records were unreadable."""

    entries: tuple[TranscriptEntry, ...] = ()
    skipped: int = 0


class DecisionStore(Protocol):
    """The guards' shared counters and claims: each call is one atomic decision.

    What the bot-loop stages, `loopwarden_integrations.RoomGuard` and the agents' spend notices use;
    the turn carries it (`TurnContext.state`).
    """

    async def pair_decide(
        self, *, scope: str, self_bot_id: str, sender_bot_id: str, policy: BotLoopPolicy
    ) -> PairDecision:
        """Record one bot-authored exchange of a pair in a room and decide it atomically."""

    async def pair_reset(self, *, scope: str | None = None, bot_id: str | None = None) -> int:
        """Forget pairs: all, one room's, or one bot's; returns how many were dropped."""

    async def pair_snapshot(self, scope: str | None = None) -> list[PairSnapshot]:
        """The pairs held (optionally in one room) with counts and cooldown time left."""

    async def room_decide(
        self, *, scope: str, bot: str, message_key: str | None, policy: BotLoopPolicy
    ) -> RoomDecision:
        """Record one bot message in the room's budget and decide it atomically.

        `bot` is the sender's label (named in a refusal); with `message_key`, a message
        counts once however many hosted bots report it (guards/room_budget.py).
        """

    async def room_reset(self, scope: str | None = None) -> int:
        """Forget the room budget of one room, or of every room; returns how many were held."""

    async def bot_turn(self, scope: str, *, is_bot: bool, message_key: str | None = None) -> int:
        """Count consecutive bot turns in a room; a human turn resets to 0. Returns the count.

        With `message_key`, a message counts once however many hosted bots report it: the
        first call applies it, later calls with the same key return the count it produced.
        """

    async def bot_turns_peek(self, scope: str) -> int:
        """The room's consecutive bot turns now, without counting one (the console reads it)."""

    async def claim(self, key: str, ttl: float) -> bool:
        """Claim a once-only key for `ttl` seconds: True for the first claimant only."""


class ReceiptStore(Protocol):
    """Delivery receipts (gateway/state/receipts.py): what the dedupe stage needs."""

    async def receive(self, key: str, ttl: float) -> bool:
        """Take a delivery's receipt in flight for `ttl` seconds; False for a duplicate.

        True when no live receipt exists, or when it is still in flight under a previous
        run (a process killed mid-turn); see gateway/state/receipts.py.
        """

    async def confirm(self, key: str, ttl: float) -> None:
        """Mark a received delivery answered: every delivery of it is refused for `ttl` s."""


class ControlStore(Protocol):
    """What admins set on a scope: runtime policy overrides and pauses."""

    async def get_overrides(self, scope: str) -> Mapping[str, object]:
        """Runtime policy overrides (`bot_loop.max_events_per_window` → value) for a scope."""

    async def set_override(self, scope: str, field: str, value: object) -> None:
        """Set one runtime override (a JSON-able value) for a scope."""

    async def clear_overrides(self, scope: str) -> None:
        """Drop every runtime override of a scope."""

    async def pause(self, scope: str, seconds: float | None) -> None:
        """Pause a room for `seconds` (None: until resumed)."""

    async def resume(self, scope: str) -> None:
        """Lift a pause."""

    async def pause_remaining(self, scope: str) -> float | None:
        """Seconds a pause has left (`inf` when indefinite), None when not paused."""


class AuditStore(Protocol):
    """The audit trail's two logs (gateway/state/audit.py)."""

    async def audit(self, entry: AuditEntry) -> None:
        """Append one entry to its log (`entry.kind`), each bounded (gateway/state/audit.py)."""

    async def recent_audit(
        self, limit: int = 20, scope: str | None = None, kind: AuditKind | None = None
    ) -> list[AuditEntry]:
        """The newest audit entries first, optionally for one room, of one log or both."""


class TranscriptStore(Protocol):
    """Rooms' transcripts (DESIGN.md §3, gateway/state/transcripts.py)."""

    async def transcript_append(
        self, scope: str, entry: TranscriptEntry, *, max_messages: int, ttl: float
    ) -> bool:
        """Append to a transcript, once per `entry.key`; False when the key is there already.

        The oldest entries beyond `max_messages` go; the transcript is forgotten `ttl`
        seconds after its last append. `scope` comes from `transcripts.scope`.
        """

    async def transcript_recent(self, scope: str, limit: int) -> Transcript:
        """The newest `limit` entries, oldest first; unreadable records skipped and counted."""

    async def transcript_forget(self, scope: str, *, threads: bool = False) -> int:
        """Empty a transcript (with `threads`, its threads' too); returns the entries dropped."""


class ActivityStore(Protocol):
    """The Activity feed's events and counters (gateway/state/activity.py)."""

    async def activity_append(self, events: Sequence[ActivityEvent]) -> None:
        """Append a batch of feed events (ids given here) and count them: one transaction.

        A message in (`kind` in) whose message key was appended within `SEEN_SECONDS` is
        not appended or counted again (gateway/state/activity.py says what is kept).
        """

    async def activity_since(
        self, cursor: int | None, limit: int, room: str | None = None
    ) -> tuple[list[ActivityEvent], int | None]:
        """Events after `cursor` (None: the newest `limit`), oldest first, and the next cursor.

        At most `limit`, of one room when `room` is given. The next cursor is the last
        event's id when `limit` were returned, else the newest id held. A cursor beyond the
        newest id (the store was emptied, a memory store restarted) reads as None.
        """

    async def activity_series(
        self, span: Span, now: float, room: str | None = None
    ) -> list[ActivityBucket]:
        """The chart: per minute over the last hour or per hour over the last day, at `now`."""

    async def activity_rooms(self) -> list[tuple[str, float]]:
        """Every room seen (at most `ROOMS_KEEP`) with when it last was, newest first."""


class CursorStore(Protocol):
    """Where a connector resumes reading its platform (a Matrix sync token), by key."""

    async def cursor_get(self, key: str) -> str | None:
        """The position saved under `key`, None when none was."""

    async def cursor_set(self, key: str, value: str) -> None:
        """Save a position under `key` (replacing the one before)."""


class StateStore(
    DecisionStore,
    ReceiptStore,
    ControlStore,
    AuditStore,
    TranscriptStore,
    ActivityStore,
    CursorStore,
    Protocol,
):
    """Every store at once, as each backend (memory, sqlite, redis) implements it.

    A user annotates the narrowest of the protocols above it needs, so a new backend or a
    test double serves only that; only what opens and closes the store holds all of it.
    """

    async def start(self) -> None:
        """Open connections and create schemas; called once before the first message."""

    async def aclose(self) -> None:
        """Flush and close."""
