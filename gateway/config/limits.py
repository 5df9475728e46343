"""The bounds every entry point holds a value to, written once for config, chat and HTTP.

- A duration (a window, a cooldown, a pause, a timeout, a receipt's lifetime) is a finite
  number of seconds of at most `MAX_DURATION_SECONDS`, 366 days: longer than any real
  cooldown or pause, and far inside what every backend stores (a Redis `PX` is a 64-bit
  count of milliseconds; `1e308` seconds is not). A pause "until resumed" is written as no
  duration, never as a huge one.
- A secret the operator chooses (an admin token, a webhook secret) is at least
  `MIN_SECRET_LENGTH` characters: a short one is guessable, and the log filter masks its
  text in every log line. Empty still means "not set" where it did; platform-issued
  tokens are not held to this.
- Money is at most `MAX_USD` dollars and a token count at most `MAX_TOKENS` (a budget's
  limit, a price per 1,000 tokens); 1e308 or a 5,000-digit number is refused.
- A guard's `mode` is exactly `enforce` or `shadow` (`guards.mode`): `Shadow`, ` shadow`
  or a look-alike letter is refused, naming the field.
- A duration may also be written `30s`, `10m`, `2h` or `7d` (ASCII digits) where a field
  says so (`DurationText`, e.g. `pipeline.transcript.ttl`), and is parsed by
  `parse_duration` as `/loop pause` parses its argument.
- A transcript holds at most `MAX_TRANSCRIPT_MESSAGES` messages and an agent's history
  at most that many and `MAX_TOKENS` tokens.
- The memory backend's transcripts hold `DEFAULT_TRANSCRIPT_BYTES` (32 MiB) in all unless
  configured otherwise, from `MIN_TRANSCRIPT_BYTES` (a few of the largest messages: 8,000
  emoji are 32 KB) to `MAX_TRANSCRIPT_BYTES` (64 GiB), a whole number of bytes.
"""

from __future__ import annotations

import math
import re
from typing import Annotated

from pydantic import AfterValidator, BeforeValidator, SecretStr

from guards.mode import GuardMode, parse_mode

MAX_DURATION_SECONDS = 366 * 86_400
MIN_SECRET_LENGTH = 16
# Money and token counts (a budget's limit, a price): far above any real bill, and inside
# what every backend adds up exactly (nano-dollars below 2**53, `gateway.calls.budgets`).
MAX_COUNT = 1_000_000
"""The most a guard's count allows (a pair budget, a bot-turn cap, repeats): a bound, not a goal."""
MAX_USD = 1_000_000.0
MAX_TOKENS = 10**12
MAX_TRANSCRIPT_MESSAGES = 10_000
DEFAULT_TRANSCRIPT_BYTES = 32 * 1024 * 1024
MIN_TRANSCRIPT_BYTES = 64 * 1024
MAX_TRANSCRIPT_BYTES = 64 * 1024**3

DURATION_BOUND = (
    f"must be a finite number of seconds, at most 366 days ({MAX_DURATION_SECONDS} seconds)"
)


def bounded_duration(seconds: float) -> float:
    """`seconds` when it is a finite duration of at most 366 days, else ValueError."""
    if not math.isfinite(seconds) or seconds > MAX_DURATION_SECONDS:
        raise ValueError(DURATION_BOUND)
    return seconds


_DURATION = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*([smhd]?)", re.IGNORECASE | re.ASCII)
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3_600, "d": 86_400}


def parse_duration(text: str) -> float | None:
    """`30s`, `10m`, `2h`, `1d` or bare seconds; None when unreadable, not positive or too long."""
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        return None
    seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2).lower()]
    return seconds if 0 < seconds <= MAX_DURATION_SECONDS else None


def duration_text(value: object) -> object:
    """A duration written `7d` (or `30s`, `10m`, `2h`) as seconds; anything else unchanged."""
    if not isinstance(value, str):
        return value
    seconds = parse_duration(value)
    if seconds is None:
        raise ValueError(
            "must be a number of seconds or a duration such as 30s, 10m, 2h or 7d, "
            "more than 0 and at most 366 days"
        )
    return seconds


def long_enough(secret: SecretStr | None) -> SecretStr | None:
    """`secret` when it is unset or at least MIN_SECRET_LENGTH characters, else ValueError."""
    if secret is not None and len(secret.get_secret_value()) < MIN_SECRET_LENGTH:
        raise ValueError(
            f"must be at least {MIN_SECRET_LENGTH} characters long (e.g. the output of "
            "`openssl rand -hex 16`): a short secret is guessable"
        )
    return secret


Duration = Annotated[float, AfterValidator(bounded_duration)]
"""A number of seconds, finite and at most MAX_DURATION_SECONDS (add gt/ge with Field)."""

DurationText = Annotated[float, BeforeValidator(duration_text), AfterValidator(bounded_duration)]
"""A Duration that may also be written `30s`, `10m`, `2h` or `7d`."""

Mode = Annotated[GuardMode, BeforeValidator(parse_mode)]
"""A guard's mode, `enforce` or `shadow` exactly (its error says why a near miss is refused)."""


DEFAULT_SESSION_HOURS = 12.0
