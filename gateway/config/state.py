"""The `state:` section: where budgets, cooldowns, receipts and the call log live.

Decisions where DESIGN.md is silent: `state.max_transcript_bytes` (default 32 MiB, from
64 KiB to 64 GiB, a whole number) is what the memory backend's transcripts may hold in
all (`gateway.state.memory_transcripts`); sqlite and redis keep theirs outside the
process and ignore it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr

from gateway.config.base import Frozen
from gateway.config.limits import (
    DEFAULT_TRANSCRIPT_BYTES,
    MAX_TRANSCRIPT_BYTES,
    MIN_TRANSCRIPT_BYTES,
)


class StateConfig(Frozen):
    """Where budgets, cooldowns and receipts live; `max_transcript_bytes` is memory's only."""

    backend: Literal["memory", "sqlite", "redis"] = "memory"
    path: str = "loopwarden.sqlite3"
    url: SecretStr = SecretStr("redis://127.0.0.1:6379/0")
    on_error: Literal["allow", "deny"] = "allow"
    key_prefix: str = "lw:"
    max_transcript_bytes: int = Field(
        default=DEFAULT_TRANSCRIPT_BYTES, ge=MIN_TRANSCRIPT_BYTES, le=MAX_TRANSCRIPT_BYTES
    )
