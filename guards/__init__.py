"""Pure decision logic for loopwarden: stdlib only, no I/O, no asyncio, injected clocks.

- `BotLoopGuard`: a per-room, direction-independent budget for bot-to-bot exchanges.
- `is_silent` / `apply_silence`: keep `NO_REPLY`, silence narration and reasoning out of
  chat (`strip_reasoning` removes `<think>` blocks on its own).
- `LoopGuard`: per-turn tool-call counts, no-progress streaks and cycles.
- `CallLoopGuard`: repeated LLM calls on a circuit (key + session [+ step]).
"""

from guards.bot_loop import BotLoopGuard, BotLoopPolicy, PairDecision, PairSnapshot, pair_key
from guards.call_loop import (
    CallDecision,
    CallLoopGuard,
    CallLoopPolicy,
    UniquenessRule,
    circuit_key,
    fingerprint_call,
)
from guards.loop_guard import (
    GuardAction,
    LoopGuard,
    LoopGuardConfig,
    LoopGuardDecision,
    ToolExecutionError,
    apply_decision,
)
from guards.reasoning import ReasoningFilter, strip_reasoning
from guards.silence import NO_REPLY, SilencePolicy, SilenceStreamFilter, apply_silence, is_silent
from guards.tool_wrapper import guarded_call, guarded_call_sync, settling_decision

__all__ = [
    "NO_REPLY",
    "BotLoopGuard",
    "BotLoopPolicy",
    "CallDecision",
    "CallLoopGuard",
    "CallLoopPolicy",
    "GuardAction",
    "LoopGuard",
    "LoopGuardConfig",
    "LoopGuardDecision",
    "PairDecision",
    "PairSnapshot",
    "ReasoningFilter",
    "SilencePolicy",
    "SilenceStreamFilter",
    "ToolExecutionError",
    "UniquenessRule",
    "apply_decision",
    "apply_silence",
    "circuit_key",
    "fingerprint_call",
    "guarded_call",
    "guarded_call_sync",
    "is_silent",
    "pair_key",
    "settling_decision",
    "strip_reasoning",
]
