"""Verdicts on LLM calls: what a caller is told, built once for every backend.

The guard and the stateful call stores (gateway/calls/) answer with these builders, so a
refusal reads the same whichever backend decided it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from guards.call_loop.policy import RuleKey, UniquenessRule, rule_group

CallCode = Literal["ok", "loop_detected", "loop_paused", "duplicate_call"]

# User-facing refusal texts (the proxy puts them in the provider-shaped 429 body).
MSG_LOOP_DETECTED = (
    "loopwarden: likely agent loop ({circuit} keeps repeating the same request). "
    "Calls paused for {seconds} seconds."
)
MSG_LOOP_PAUSED = (
    "loopwarden: calls on {circuit} are paused after a likely loop; retry in {seconds} seconds."
)
MSG_RULE_PAUSED = (
    "loopwarden: calls like this one are paused by rule {rule}; retry in {seconds} seconds."
)
MSG_DUPLICATE = (
    "loopwarden: rule {rule} allows {limit} such call(s) per {window} seconds; "
    "retry in {seconds} seconds."
)
MSG_DUPLICATE_PAUSED = (
    "loopwarden: rule {rule} allows {limit} such call(s) per {window} seconds; "
    "calls like this one are paused for {seconds} seconds."
)


@dataclass(frozen=True, slots=True)
class CallReceipt:
    """What `check` counted for an allowed call, so `record_outcome` can uncount it."""

    at: float
    call: tuple[str, str]
    rule_keys: tuple[tuple[str, RuleKey], ...]


@dataclass(frozen=True, slots=True)
class CallDecision:
    """The verdict on one LLM call: send it or not, why, and when to try again (seconds).

    `count` is the number of identical calls in the window with this one ("ok",
    "loop_detected"), of calls with this rule key ("duplicate_call"), or of calls the
    running pause refused so far ("loop_paused"). `receipt` (allowed calls only) goes
    back to `record_outcome`. `paused_group` is the key of what this refusal paused: the
    circuit ("loop_detected") or the rule group (a "pause" rule's "duplicate_call"); None
    when it paused nothing (an allowed call, "loop_paused", a "reject" rule).
    """

    allowed: bool
    code: CallCode
    retry_after: float
    count: int
    circuit: str
    message: str
    rule: str | None = None
    receipt: CallReceipt | None = None
    paused_group: str | None = None


@dataclass(frozen=True, slots=True)
class PausedCircuit:
    """A paused circuit or rule group for status commands and the dashboard.

    `reason` is "loop_detected" or "rule:NAME"; `count` is how many calls the pause has
    refused so far, the one that opened it included.
    """

    circuit: str
    remaining: float
    reason: str
    count: int


def seconds_text(value: float) -> str:
    """Seconds for a message: whole seconds, rounded up ("many" when there is no end)."""
    return str(math.ceil(value)) if math.isfinite(value) else "many"


def _refusal(
    code: CallCode,
    circuit: str,
    count: int,
    retry_after: float,
    message: str,
    *,
    rule: str | None,
    paused_group: str | None = None,
) -> CallDecision:
    """A refused call's verdict: never counted, so without a receipt."""
    return CallDecision(
        allowed=False,
        code=code,
        retry_after=retry_after,
        count=count,
        circuit=circuit,
        message=message,
        rule=rule,
        paused_group=paused_group,
    )


def paused_verdict(circuit: str, remaining: float, count: int, rule: str | None) -> CallDecision:
    """A call refused because its circuit (rule None) or its rule group is paused."""
    if rule is None:
        message = MSG_LOOP_PAUSED.format(circuit=circuit, seconds=seconds_text(remaining))
    else:
        message = MSG_RULE_PAUSED.format(rule=rule, seconds=seconds_text(remaining))
    return _refusal("loop_paused", circuit, count, remaining, message, rule=rule)


def loop_verdict(circuit: str, count: int, pause: float) -> CallDecision:
    """The call that repeats too often: refused, and its circuit is paused for `pause`."""
    message = MSG_LOOP_DETECTED.format(circuit=circuit, seconds=seconds_text(pause))
    return _refusal(
        "loop_detected", circuit, count, pause, message, rule=None, paused_group=circuit
    )


def duplicate_verdict(
    circuit: str, rule: UniquenessRule, key: RuleKey, count: int, retry_after: float
) -> CallDecision:
    """A call over a rule's limit ("pause" rules: `retry_after` is the pause of its group)."""
    pauses = rule.action == "pause"
    message = (MSG_DUPLICATE_PAUSED if pauses else MSG_DUPLICATE).format(
        rule=rule.name,
        limit=rule.max_calls,
        window=f"{rule.window_seconds:g}",
        seconds=seconds_text(retry_after),
    )
    return _refusal(
        "duplicate_call",
        circuit,
        count,
        retry_after,
        message,
        rule=rule.name,
        paused_group=rule_group(rule, key) if pauses else None,
    )


def allowed_verdict(
    circuit: str,
    identity: str,
    count: int,
    at: float,
    rule_keys: tuple[tuple[str, RuleKey], ...],
) -> CallDecision:
    """An allowed, counted call, with the receipt that lets a provider failure uncount it."""
    return CallDecision(
        allowed=True,
        code="ok",
        retry_after=0.0,
        count=count,
        circuit=circuit,
        message="",
        receipt=CallReceipt(at=at, call=(circuit, identity), rule_keys=rule_keys),
    )
