"""What the stateful call stores share with CallLoopGuard: call identities, rule keys, verdicts.

The memory store wraps `CallLoopGuard` itself. The SQLite and Redis stores keep the same
state (counted calls, pauses, fresh starts after a reopen) in their backend and build
their answers with the guard's own pure functions (call identity, rule keys and groups,
holds, the verdicts and their messages, re-exported here), so the three backends answer
alike; tests/gateway/calls/test_call_store_conformance.py holds them to it. Only how long
a reopened key's fresh start is remembered, and which receipts a failure uncounts, are
defined here.
"""

from __future__ import annotations

from collections.abc import Mapping

from guards.call_loop import (
    NEVER,
    CallDecision,
    CallLoopPolicy,
    CallReceipt,
    Hold,
    RuleKey,
    UniquenessRule,
    allowed_verdict,
    call_identity,
    duplicate_verdict,
    is_provider_failure,
    loop_verdict,
    pause_hold,
    paused_verdict,
    reopen_hold,
    rule_group,
    rule_key,
    rules_by_name,
)

__all__ = [
    "NEVER",
    "Hold",
    "RuleKey",
    "allowed_verdict",
    "call_identity",
    "duplicate_verdict",
    "is_group",
    "longest_window",
    "loop_verdict",
    "pause_hold",
    "paused_verdict",
    "receipt_to_uncount",
    "reopen_hold",
    "reopen_window",
    "rule_group",
    "rule_key",
    "rules_by_name",
]


def is_group(key: str) -> bool:
    """True for a rule group's key; circuit roots are quoted, so they never start so."""
    return key.startswith("rule=")


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
