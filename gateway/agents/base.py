"""The Agent protocol: one async call per turn, returning the reply and its tool calls."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    pass
