"""What the stateful call stores share with CallLoopGuard: the step, rule keys, verdicts.

The memory store wraps `CallLoopGuard` itself; the SQLite store loads each call's record,
steps it with `guards.call_loop.step_call` and saves it; the Redis store's scripts are
the one sanctioned second version of that step. They build their answers with the
guard's own pure functions (call identity, rule keys and groups, holds, the verdicts and
their messages, re-exported here), so the three backends answer alike;
tests/gateway/calls/test_call_store_conformance.py holds them to it. Only which receipts
a failure uncounts is defined here.
"""

from __future__ import annotations

from guards.call_loop import (
    NEVER,
    CallDecision,
    CallReceipt,
    Hold,
    RuleKey,
    allowed_verdict,
    call_identity,
    duplicate_verdict,
    is_group,
    is_provider_failure,
    loop_verdict,
    pause_hold,
    paused_verdict,
    reopen_hold,
    reopen_window,
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


def receipt_to_uncount(
    decision: CallDecision, status: int | None, error: str | None
) -> CallReceipt | None:
    """The receipt of an allowed call the provider failed; None when the call stays counted."""
    receipt = decision.receipt
    if receipt is None or not is_provider_failure(status, error):
        return None
    return receipt
