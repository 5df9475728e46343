"""One logged LLM call (`CallLogEntry`) and its outcomes: the record every store reads."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from guards.call_loop import (
    LoggedCall,
)

CallOutcome = Literal[
    "forwarded",
    "loop_detected",
    "loop_paused",
    "duplicate_call",
    "budget_exceeded",
    "upstream_error",
]


_NO_FIELDS: Mapping[str, str] = MappingProxyType({})


def _no_fields() -> Mapping[str, str]:
    return _NO_FIELDS


@dataclass(frozen=True, slots=True)
class CallLogEntry:
    """One LLM call in the request log: who, what, the verdict, tokens and cost.

    `outcome` is "forwarded" (the provider answered below 400), a refusal code, or
    "upstream_error" (the provider answered 400 or more, or not at all; `status` tells
    which, None when there was no answer). `cost` is in the price table's currency, None
    when the model has no price; `estimated` marks a cost (and the token counts it came
    from) estimated rather than reported by the provider: every refused call's cost is an
    estimate of what it would have cost. `fields` are the rule fields the call carried.
    """

    at: float
    provider: str
    agent: str
    session: str
    circuit: str
    model: str
    outcome: CallOutcome
    status: int | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    cost: float | None = None
    estimated: bool = False
    fingerprint: str = ""
    rule: str | None = None
    retry: int = 0
    duration_ms: float = 0.0
    fields: Mapping[str, str] = field(default_factory=_no_fields, hash=False)

    def logged_call(self) -> LoggedCall:
        """The call as `preview_rule` replays it."""
        return LoggedCall(at=self.at, fingerprint=self.fingerprint, fields=self.fields)
