"""What the admin answers are about, as data: a room's state, audit entries, paused circuits.

`AdminService` builds a `RoomView` once and both the `status` text and the JSON the
console reads (`room_json`) are drawn from it, so the two never disagree. The JSON
functions here are the `data` beside `result` in the admin API's answers.

Decisions where DESIGN.md is silent:
- An audit entry's texts (room, who, command, outcome) are shown as
  `gateway.observability.visible.visible` writes them, in the text line and in the JSON
  alike: a line break or escape sequence typed in chat is `\\n`, `\\x1b`, never a second line.
- Times the guards act on are relative seconds (`paused_left`, `cooldown_left`, a
  refusal's `age`, a circuit's `paused_left`), as the state backends count them, so
  replicas with skewed clocks show the same; audit entries keep their wall-clock `at`
  with `iso`, the same instant in UTC ISO 8601.
- A pause until resumed is `paused: true, paused_left: null`; no pause is
  `paused: false, paused_left: null` (JSON has no infinity).
- `overrides` are the runtime overrides in effect in the room: the global (`*`) ones with
  the room's own on top, as the policy resolves them.
- `shadow` names each guard running in shadow mode with what it would have refused in
  this room, counted by this process since it started (as `status` says it).
- A circuit's `rule` is the uniqueness rule of a paused rule group (its reason
  `rule:NAME`), null for the repeat guard's circuit; `group` says which of the two it is.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from gateway.app import messages
from gateway.config import Policy
from gateway.observability.visible import visible
from gateway.state.base import AuditEntry
from guards.bot_loop import PairSnapshot
from guards.call_loop import PausedCircuit

_RULE_REASON = "rule:"


@dataclass(frozen=True, slots=True)
class PairView:
    """One live bot pair of a room, with the hosted bots' names where they are known."""

    snapshot: PairSnapshot
    name_a: str
    name_b: str


@dataclass(frozen=True, slots=True)
class RoomView:
    """Everything `status` and the Rooms page show about one room, read once."""

    room: str
    policy: Policy
    overrides: Mapping[str, object]
    paused: float | None
    """Seconds of pause left, `inf` until resumed, None when not paused."""
    pairs: tuple[PairView, ...]
    bot_turns: int
    shadowed: Mapping[str, int]
    refusals: tuple[messages.RefusalLine, ...]
    degraded: bool
    """The state backend is in an outage: what it could not read is shown empty."""
    linked: tuple[str, ...] = ()
    """The other rooms of the room's link (`links:`), which share its budgets and pause."""


def status_text(view: RoomView) -> str:
    """The answer to `status`, drawn from the view."""
    text = messages.status_text(
        view.room,
        view.policy,
        paused=view.paused,
        pairs=[
            messages.PairLine(
                a=pair.name_a,
                b=pair.name_b,
                count=pair.snapshot.count,
                cooldown_left=pair.snapshot.cooldown_remaining,
            )
            for pair in view.pairs
        ],
        refusals=view.refusals,
        shadowed=view.shadowed,
        linked=view.linked,
    )
    if view.degraded:
        text += "\n" + messages.STATUS_DEGRADED
    return text


def room_json(view: RoomView) -> dict[str, object]:
    """The room object of `GET /admin/rooms` and `GET /admin/status`."""
    platform, _, channel = view.room.partition(":")
    loop = view.policy.bot_loop
    return {
        "room": view.room,
        "platform": platform,
        "channel": channel,
        "paused": view.paused is not None,
        "paused_left": _finite(view.paused),
        "policy": view.policy.model_dump(mode="json"),
        "overrides": dict(view.overrides),
        "pairs": [
            {
                "bot_a": pair.snapshot.bot_a,
                "bot_b": pair.snapshot.bot_b,
                "names": [pair.name_a, pair.name_b],
                "count": pair.snapshot.count,
                "budget": loop.max_events_per_window,
                "window_seconds": loop.window_seconds,
                "cooldown_left": pair.snapshot.cooldown_remaining,
            }
            for pair in view.pairs
        ],
        "bot_turns": view.bot_turns,
        "max_bot_turns": loop.max_consecutive_bot_turns,
        "shadow": {
            guard: view.shadowed.get(guard, 0) for guard in messages.shadow_guards(view.policy)
        },
        "recent_refusals": [
            {"age": r.age, "stage": r.stage, "code": r.code, "detail": r.detail}
            for r in view.refusals
        ],
        "degraded": view.degraded,
        "linked": list(view.linked),
    }


def audit_json(entry: AuditEntry) -> dict[str, object]:
    """One audit entry of `GET /admin/audit`, its texts as `visible` writes them."""
    return {
        "at": entry.at,
        "iso": iso_time(entry.at),
        "kind": entry.kind,
        "platform": visible(entry.platform),
        "room": visible(entry.room),
        "user_id": visible(entry.user_id),
        "user_name": visible(entry.user_name),
        "command": visible(entry.command),
        "allowed": entry.allowed,
        "outcome": visible(entry.outcome),
    }


def audit_line(entry: AuditEntry) -> str:
    """`2026-11-30T10:00:00Z discord:1100 1234 (alice) allowed done: /loop reset`, one line."""
    at = iso_time(entry.at)
    verdict = "allowed" if entry.allowed else "refused"
    name = f" ({entry.user_name})" if entry.user_name else ""
    said = f"{entry.room} {entry.user_id}{name} {verdict} {entry.outcome}: {entry.command}"
    return f"{at} {visible(said)}"


def circuit_json(paused: PausedCircuit) -> dict[str, object]:
    """One paused circuit or rule group of `GET /admin/circuits`."""
    rule = (
        paused.reason.removeprefix(_RULE_REASON) if paused.reason.startswith(_RULE_REASON) else None
    )
    return {
        "circuit": paused.circuit,
        "rule": rule,
        "group": rule is not None,
        "paused_left": _finite(paused.remaining),
        "reason": paused.reason,
        "count": paused.count,
    }


def iso_time(at: float) -> str:
    """`2026-11-30T10:00:00Z`: a wall-clock instant in UTC, as the audit log shows it."""
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _finite(seconds: float | None) -> float | None:
    """Seconds for JSON: None for no end (or none at all)."""
    return seconds if seconds is not None and math.isfinite(seconds) else None
