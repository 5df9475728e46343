"""A guard's mode: `enforce` stops what it refuses; `shadow` decides alike and lets it pass.

In shadow a guard keeps the same state and counts as in enforce (a cooldown or a pause
is opened as far as the state goes), so switching to enforce refuses at once what is
already over its budget. Only the exact words are modes: a value that merely looks like
one (`Shadow`, ` shadow`, a Cyrillic `ѕhadow`) is refused, since a guard silently left
in the wrong mode is worse than a config error.
"""

from __future__ import annotations

from typing import Literal

from guards.lookalike import fold

GuardMode = Literal["enforce", "shadow"]
MODES: tuple[GuardMode, ...] = ("enforce", "shadow")
_SHOWN_CHARS = 40


def parse_mode(value: object) -> GuardMode:
    """`value` when it is exactly "enforce" or "shadow"; ValueError saying why otherwise."""
    if value == "enforce" and isinstance(value, str):
        return "enforce"
    if value == "shadow" and isinstance(value, str):
        return "shadow"
    if isinstance(value, str) and fold(value).strip() in MODES:
        raise ValueError(
            f"must be exactly enforce or shadow, in lowercase ASCII without spaces "
            f"(got {value[:_SHOWN_CHARS]!r})"
        )
    shown = repr(value)[:_SHOWN_CHARS]
    raise ValueError(f"must be enforce or shadow, got {shown}")
