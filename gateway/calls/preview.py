"""A uniqueness rule's preview: what it would have done to the logged calls of a window.

`loopwarden calls preview-rule` prints it and the console's Rules page (`GET
/admin/rules`) shows it per configured rule; both replay the logged calls through the
rule alone with `guards.call_loop.preview_rule`, every outcome included (a refused call
was still sent by the agent), with the proxy's `pause_seconds` for "pause" rules.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gateway.calls.entry import CallLogEntry
from guards.call_loop import UniquenessRule, preview_rule, rule_key

PREVIEW_SECONDS = 7 * 86_400.0


@dataclass(frozen=True, slots=True)
class RulePreview:
    """Of `calls` logged calls, how many the rule applies to, in how many groups, and refuses."""

    calls: int
    applies: int
    groups: int
    would_refuse: int


def preview(
    rule: UniquenessRule, entries: Sequence[CallLogEntry], *, pause_seconds: float
) -> RulePreview:
    """The rule replayed over the entries (`preview_rule`), with the groups it forms."""
    logged = [entry.logged_call() for entry in entries]
    keys = [rule_key(rule, call.fingerprint, call.fields) for call in logged]
    applied = [key for key in keys if key is not None]
    return RulePreview(
        calls=len(logged),
        applies=len(applied),
        groups=len(set(applied)),
        would_refuse=preview_rule(rule, logged, pause_seconds=pause_seconds),
    )
