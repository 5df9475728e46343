"""`call_loop`: identical LLM calls allowed per window and the pause after, with its mode.

One model for both places that take it: the gateway's `policy.call_loop` (its `openai`
agents, per room) and `proxy.call_loop` (every proxied call). It is valid only when the
guard can run with it (validating builds its `CallLoopPolicy`), and `max_repeats` is at
most a million (`gateway.config.limits.MAX_COUNT`) in both.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from gateway.config.base import Frozen
from gateway.config.limits import MAX_COUNT, Duration, Mode
from guards.call_loop import CallLoopPolicy


class CallLoopSettings(Frozen):
    """Identical calls allowed per window (per room, or per proxy circuit), the pause after."""

    max_repeats: int = Field(default=5, ge=1, le=MAX_COUNT)
    window_seconds: Duration = Field(default=60.0, gt=0)
    pause_seconds: Duration = Field(default=300.0, ge=0)
    mode: Mode = "enforce"

    @model_validator(mode="after")
    def _guard_runs(self) -> CallLoopSettings:
        self.policy()
        return self

    def policy(self) -> CallLoopPolicy:
        """The call-loop guard's policy, as the `openai` agents and the proxy run it."""
        return CallLoopPolicy(self.max_repeats, self.window_seconds, self.pause_seconds)
