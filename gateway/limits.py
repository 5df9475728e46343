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
"""

from __future__ import annotations

import math
from typing import Annotated

from pydantic import AfterValidator, SecretStr

MAX_DURATION_SECONDS = 366 * 86_400
MIN_SECRET_LENGTH = 16

DURATION_BOUND = (
    f"must be a finite number of seconds, at most 366 days ({MAX_DURATION_SECONDS} seconds)"
)


def bounded_duration(seconds: float) -> float:
    """`seconds` when it is a finite duration of at most 366 days, else ValueError."""
    if not math.isfinite(seconds) or seconds > MAX_DURATION_SECONDS:
        raise ValueError(DURATION_BOUND)
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
