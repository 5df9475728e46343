"""One logged LLM call (`CallLogEntry`) and its outcomes: the record every store reads.

`CallLogEntry`'s fields are the one list of what a call's log entry holds: each says its
`LogKind` (how it is stored and shown) in its metadata, and the Redis and SQLite codecs,
the CSV export and the console's JSON are derived from them (`gateway.calls.codec`,
`gateway.calls.export`), so a field added here reaches all four.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal, get_args

from guards.call_loop import (
    LoggedCall,
)

CallOutcome = Literal[
    "forwarded",
    "loop_detected",
    "loop_paused",
    "duplicate_call",
    "budget_exceeded",
    "state_unavailable",
    "upstream_error",
]
OUTCOMES: tuple[CallOutcome, ...] = get_args(CallOutcome)
"""Every outcome a log entry may hold, in `CallOutcome`'s order."""

LogKind = Literal["time", "text", "outcome", "int", "money", "flag", "ms", "fields"]
"""How a field is stored and shown: `time` seconds since the epoch (ISO 8601 in the CSV),
`int` a whole number, `money` a cost (6 decimals in the CSV), `ms` a duration (3
decimals), `flag` a bool (`true`/`false` in the CSV), `fields` the rule fields (JSON when
stored, one CSV column each of `gateway.calls.export.FIELD_COLUMNS`)."""


def _kind(kind: LogKind, csv: str | None = None) -> Mapping[str, object]:
    """A field's metadata: its kind, and its CSV column when not named as the field is."""
    return {"kind": kind, "csv": csv}


_NO_FIELDS: Mapping[str, str] = MappingProxyType({})


def _no_fields() -> Mapping[str, str]:
    return _NO_FIELDS


@dataclass(frozen=True, slots=True)
class CallLogEntry:
    """One LLM call in the request log: who, what, the verdict, tokens and cost.

    `outcome` is "forwarded" (the provider answered below 400), a refusal code, or
    "upstream_error" (the provider answered 400 or more, or not at all; `status` tells
    which, None when there was no answer). "state_unavailable": a call a budget applies
    to, refused because the shared state was unreachable or its replicas behind
    (`state.on_error: deny`). `cost` is in the price table's currency, None when the
    model has no price; `estimated` marks a cost (and the token counts it came from)
    estimated rather than reported by the provider: every refused call's cost is an
    estimate of what it would have cost. `fields` are the rule fields the call carried.
    """

    at: float = field(metadata=_kind("time", csv="time"))
    provider: str = field(metadata=_kind("text"))
    agent: str = field(metadata=_kind("text"))
    session: str = field(metadata=_kind("text"))
    circuit: str = field(metadata=_kind("text"))
    model: str = field(metadata=_kind("text"))
    outcome: CallOutcome = field(metadata=_kind("outcome"))
    status: int | None = field(default=None, metadata=_kind("int"))
    input_tokens: int | None = field(default=None, metadata=_kind("int"))
    output_tokens: int | None = field(default=None, metadata=_kind("int"))
    cost: float | None = field(default=None, metadata=_kind("money"))
    estimated: bool = field(default=False, metadata=_kind("flag", csv="cost_estimated"))
    rule: str | None = field(default=None, metadata=_kind("text"))
    retry: int = field(default=0, metadata=_kind("int"))
    duration_ms: float = field(default=0.0, metadata=_kind("ms"))
    fields: Mapping[str, str] = field(
        default_factory=_no_fields, hash=False, metadata=_kind("fields")
    )
    fingerprint: str = field(default="", metadata=_kind("text"))

    def logged_call(self) -> LoggedCall:
        """The call as `preview_rule` replays it."""
        return LoggedCall(at=self.at, fingerprint=self.fingerprint, fields=self.fields)
