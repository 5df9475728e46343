"""Numeric platform ids in outbound calls: ASCII digits (an optional minus), within 64 bits.

Discord snowflakes and Telegram chat, message and topic ids are 64-bit integers; the ids a
reply carries come from inbound translation, the admin API or an agent, so they are read
strictly: `int()` alone would take `"١٢٣"` (Arabic-Indic digits), `" 12 "` or `"1_000"`.
"""

from __future__ import annotations

from gateway.app.errors import DeliveryError

_LIMIT = 2**64


def numeric_id(value: str, *, platform: str, field: str) -> int:
    """`value` as an int, or a non-retryable DeliveryError naming `field` and why."""
    digits = value[1:] if value.startswith("-") else value
    if not (digits.isascii() and digits.isdigit()) or len(digits) > 20:
        raise DeliveryError(f"{platform}: {field} {value[:40]!r} is not a numeric id")
    number = int(value)
    if not -_LIMIT < number < _LIMIT:
        raise DeliveryError(f"{platform}: {field} {value!r} is beyond 64 bits")
    return number
