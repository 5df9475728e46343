"""What the stateful call stores share with CallLoopGuard: call identities, rule keys, verdicts.

The memory store wraps `CallLoopGuard` itself. The SQLite and Redis stores keep the same
state (counted calls, pauses, fresh starts after a reopen) in their backend and build
their answers here, with the guard's own message texts, so the three backends answer
alike; tests/gateway/calls/test_call_store_conformance.py holds them to it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import quote

from guards.call_loop import (
    MSG_DUPLICATE,
    MSG_DUPLICATE_PAUSED,
    MSG_LOOP_DETECTED,
    MSG_LOOP_PAUSED,
    MSG_RULE_PAUSED,
    CallDecision,
    CallLoopPolicy,
    CallReceipt,
    UniquenessRule,
    fingerprint_call,
    is_provider_failure,
)

NEVER = -math.inf
"""The fresh start of a hold that never was reopened: every counted call is live."""

RuleKey = tuple[str, ...]


def call_identity(fingerprint: str, fields: Mapping[str, str]) -> str:
    """What makes two calls "the same": the fingerprint, or model + step when a step is sent."""
    step = fields.get("step")
    if step:
        return fingerprint_call(fields.get("model", ""), (), step=step)
    return fingerprint


def _field_value(name: str, fingerprint: str, fields: Mapping[str, str]) -> str | None:
    """A call's value for a rule field; "prompt" falls back to the fingerprint."""
    value = fields.get(name)
    if value:
        return value
    if name == "prompt":
        return fingerprint or None
    return None


def rule_key(rule: UniquenessRule, fingerprint: str, fields: Mapping[str, str]) -> RuleKey | None:
    """The rule's key for a call (its field values), or None when the rule does not apply."""
    for name, pattern in rule.filters.items():
        value = _field_value(name, fingerprint, fields)
        if value is None:
            return None
        if pattern.endswith("*"):
            if not value.startswith(pattern[:-1]):
                return None
        elif value != pattern:
            return None
    values: list[str] = []
    for name in rule.fields:
        value = _field_value(name, fingerprint, fields)
        if value is None:
            return None
        values.append(value)
    return tuple(values)


def rule_group(rule: UniquenessRule, key: RuleKey) -> str:
    """The group a "pause" rule pauses ("rule=NAME/field=value"): the key without the prompt."""
    parts = [f"rule={quote(rule.name, safe='')}"]
    parts.extend(
        f"{name}={quote(value, safe='')}"
        for name, value in zip(rule.fields, key, strict=True)
        if name != "prompt"
    )
    return "/".join(parts)


def is_group(key: str) -> bool:
    """True for a rule group's key; circuit roots are quoted, so they never start so."""
    return key.startswith("rule=")


def rules_by_name(rules: Iterable[UniquenessRule]) -> dict[str, UniquenessRule]:
    """The rules by name, as the guard checks them (a name used twice is a ValueError)."""
    named: dict[str, UniquenessRule] = {}
    for rule in rules:
        if rule.name in named:
            raise ValueError(f"rules: the name {rule.name!r} is used twice")
        named[rule.name] = rule
    return named


def longest_window(policy: CallLoopPolicy, rules: Mapping[str, UniquenessRule]) -> float:
    """How long a reopened rule group's fresh start must be remembered."""
    return max([policy.window_seconds, *(rule.window_seconds for rule in rules.values())])


def reopen_window(
    policy: CallLoopPolicy, rules: Mapping[str, UniquenessRule], circuit: str
) -> float:
    """How long the fresh start of a reopened circuit or rule group must be remembered."""
    return longest_window(policy, rules) if is_group(circuit) else policy.window_seconds


def receipt_to_uncount(
    decision: CallDecision, status: int | None, error: str | None
) -> CallReceipt | None:
    """The receipt of an allowed call the provider failed; None when the call stays counted."""
    receipt = decision.receipt
    if receipt is None or not is_provider_failure(status, error):
        return None
    return receipt


def seconds_text(value: float) -> str:
    """Seconds for a message: whole seconds, rounded up (as the guard writes them)."""
    return str(math.ceil(value)) if math.isfinite(value) else "many"


@dataclass(frozen=True, slots=True)
class Hold:
    """A pause and/or fresh start on a circuit or rule group, as a store keeps it."""

    paused_until: float
    fresh_from: float
    expires_at: float
    reason: str
    rule: str | None
    count: int


def pause_hold(
    earlier: Hold | None, now: float, pause: float, *, reason: str, rule: str | None
) -> Hold:
    """A pause from now; an earlier reopen's fresh start (and its lifetime) carries over."""
    if earlier is None:
        return Hold(now + pause, NEVER, now + pause, reason, rule, 1)
    expires = max(earlier.expires_at, now + pause)
    return Hold(now + pause, earlier.fresh_from, expires, reason, rule, 1)


def reopen_hold(earlier: Hold | None, now: float, window: float) -> Hold:
    """No pause, and a fresh start now that lasts as long as a counted call could."""
    reason = earlier.reason if earlier is not None else "reopened"
    rule = earlier.rule if earlier is not None else None
    return Hold(now, now, now + window, reason, rule, 0)


def paused_verdict(circuit: str, remaining: float, count: int, rule: str | None) -> CallDecision:
    """A call refused because its circuit (rule None) or its rule group is paused."""
    if rule is None:
        message = MSG_LOOP_PAUSED.format(circuit=circuit, seconds=seconds_text(remaining))
    else:
        message = MSG_RULE_PAUSED.format(rule=rule, seconds=seconds_text(remaining))
    return CallDecision(
        allowed=False,
        code="loop_paused",
        retry_after=remaining,
        count=count,
        circuit=circuit,
        message=message,
        rule=rule,
    )


def loop_verdict(circuit: str, count: int, pause: float) -> CallDecision:
    """The call that repeats too often: refused, and its circuit is paused."""
    return CallDecision(
        allowed=False,
        code="loop_detected",
        retry_after=pause,
        count=count,
        circuit=circuit,
        message=MSG_LOOP_DETECTED.format(circuit=circuit, seconds=seconds_text(pause)),
    )


def duplicate_verdict(
    circuit: str, rule: UniquenessRule, count: int, retry_after: float
) -> CallDecision:
    """A call over a rule's limit ("pause" rules: `retry_after` is the pause)."""
    window = f"{rule.window_seconds:g}"
    template = MSG_DUPLICATE_PAUSED if rule.action == "pause" else MSG_DUPLICATE
    message = template.format(
        rule=rule.name, limit=rule.max_calls, window=window, seconds=seconds_text(retry_after)
    )
    return CallDecision(
        allowed=False,
        code="duplicate_call",
        retry_after=retry_after,
        count=count,
        circuit=circuit,
        message=message,
        rule=rule.name,
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
