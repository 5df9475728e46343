"""The `pipeline:` section: stages that can be switched off, receipts, timeouts, room memory.

Decisions where DESIGN.md is silent: `pipeline.transcript` (`max_messages` 0 switches room
memory off, `ttl` in seconds or `7d`) is bounded by `gateway.config.limits` (DESIGN.md §3;
`gateway.app.middlewares.transcript`).
"""

from __future__ import annotations

from pydantic import Field

from gateway.config.base import Frozen
from gateway.config.limits import MAX_TRANSCRIPT_MESSAGES, Duration, DurationText


class TranscriptConfig(Frozen):
    """Room memory: the messages kept per room and thread (0: none), forgotten `ttl` idle."""

    max_messages: int = Field(default=200, ge=0, le=MAX_TRANSCRIPT_MESSAGES)
    ttl: DurationText = Field(default=7 * 86_400.0, gt=0)


class PipelineConfig(Frozen):
    """Stages that can be switched off, dedupe receipt lifetime, and room memory."""

    dedupe: bool = True
    dedupe_ttl_seconds: Duration = Field(default=600.0, gt=0)
    admin_commands: bool = True
    typing_indicator: bool = True
    turn_timeout_seconds: Duration = Field(default=120.0, gt=0)
    drain_seconds: Duration = Field(default=10.0, gt=0)
    transcript: TranscriptConfig = TranscriptConfig()
