"""Repeated LLM calls: fingerprint each call and stop a circuit that keeps sending the same one.

A call's fingerprint (`fingerprint_call`) is the model, the last two messages and the
attachments' content hashes, after the volatile tokens that change every round without
changing the question (dates, times, UUIDs, hex ids, provider ids, numbers of 5+ digits)
are replaced by one placeholder. A circuit (`circuit_key`) is an agent (or key id) plus
session, plus step when given. `CallLoopGuard.check` refuses the call that would be the
(max_repeats + 1)-th identical one on its circuit inside the window (`loop_detected`) and
pauses the circuit: until the pause ends or `reopen`, every call on it gets `loop_paused`.
Uniqueness rules (`UniquenessRule`) cap calls that share chosen fields (`duplicate_call`).

One concern per module, each with the decisions it made where the design is silent:
`normalise` (volatile tokens), `fingerprint` (call identities), `policy` (circuits, the
policy, uniqueness rules), `verdicts` (what a caller is told), `step` (the decision, one
pure step over an explicit record, shared with the stateful stores in gateway/calls/)
and `guard` (`CallLoopGuard`, the step over in-memory tables).
"""

from guards.call_loop.fingerprint import call_identity, fingerprint_call
from guards.call_loop.guard import CallLoopGuard, preview_rule
from guards.call_loop.normalise import normalise_text
from guards.call_loop.policy import (
    MAX_RULE_WINDOW,
    MIN_RULE_WINDOW,
    RULE_FIELDS,
    CallLoopPolicy,
    Circuit,
    LoggedCall,
    RuleAction,
    RuleKey,
    UniquenessRule,
    circuit_key,
    is_group,
    rule_group,
    rule_key,
    rules_by_name,
)
from guards.call_loop.step import (
    NEVER,
    CallEvent,
    CallRecord,
    CountedCalls,
    Hold,
    call_event,
    is_provider_failure,
    pause_hold,
    reopen_hold,
    reopen_window,
    step_call,
    step_reopen,
    uncount,
)
from guards.call_loop.verdicts import (
    MSG_DUPLICATE,
    MSG_DUPLICATE_PAUSED,
    MSG_LOOP_DETECTED,
    MSG_LOOP_PAUSED,
    MSG_RULE_PAUSED,
    CallCode,
    CallDecision,
    CallReceipt,
    PausedCircuit,
    allowed_verdict,
    duplicate_verdict,
    loop_verdict,
    paused_verdict,
    seconds_text,
)

__all__ = [
    "MAX_RULE_WINDOW",
    "MIN_RULE_WINDOW",
    "MSG_DUPLICATE",
    "MSG_DUPLICATE_PAUSED",
    "MSG_LOOP_DETECTED",
    "MSG_LOOP_PAUSED",
    "MSG_RULE_PAUSED",
    "NEVER",
    "RULE_FIELDS",
    "CallCode",
    "CallDecision",
    "CallEvent",
    "CallLoopGuard",
    "CallLoopPolicy",
    "CallReceipt",
    "CallRecord",
    "Circuit",
    "CountedCalls",
    "Hold",
    "LoggedCall",
    "PausedCircuit",
    "RuleAction",
    "RuleKey",
    "UniquenessRule",
    "allowed_verdict",
    "call_event",
    "call_identity",
    "circuit_key",
    "duplicate_verdict",
    "fingerprint_call",
    "is_group",
    "is_provider_failure",
    "loop_verdict",
    "normalise_text",
    "pause_hold",
    "paused_verdict",
    "preview_rule",
    "reopen_hold",
    "reopen_window",
    "rule_group",
    "rule_key",
    "rules_by_name",
    "seconds_text",
    "step_call",
    "step_reopen",
    "uncount",
]
