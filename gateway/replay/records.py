"""What the format readers hand the engine: chat messages, LLM calls, skips and bad input.

A reader turns one export into `ChatMessage`s (or `RecordedCall`s) in the order the
export holds them, counts the records it skips in `Skipped` (a reason each), and raises
`ReplayInputError` for input that cannot be replayed: the error names the file, the
record (its index or line) and why, and never quotes more than a few characters of it.

`parse_time` is the one reading of a record's time: an ISO 8601 text (an offset, `Z`,
or none for UTC), or seconds since the epoch as a number or numeric text (Slack's
`ts`, Telegram's `date_unixtime`). `parse_millis` reads milliseconds since the epoch
(Matrix's `origin_server_ts`, Mattermost's `create_at`), a number only. Times outside
the years 1–9999 are refused.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime

from gateway.app.errors import LoopwardenError

# datetime's range: 0001-01-01 to 9999-12-31 23:59:59, as seconds since the epoch.
_EARLIEST = -62_135_596_800.0
_LATEST = 253_402_300_799.0
# An ISO time with fractions and an offset is 32 characters; anything longer is no time.
_MAX_TIME_TEXT = 40
_QUOTED = 40


class ReplayInputError(LoopwardenError):
    """An input that cannot be replayed: which file, which record, and why."""

    def __init__(self, file: str, where: str, why: str) -> None:
        self.file = file
        self.where = where
        self.why = why
        super().__init__(f"{file}: {where}: {why}" if where else f"{file}: {why}")


def quoted(value: object) -> str:
    """A short, printable rendering of a bad value for an error message."""
    if isinstance(value, int) and value.bit_length() > _QUOTED * 4:
        # repr of a 5,000-digit integer raises (Python's int-to-text limit); none is a time.
        return f"(an integer of ~{round(value.bit_length() * math.log10(2)):,} digits)"
    text = repr(value)
    return text if len(text) <= _QUOTED else text[: _QUOTED - 1] + "…"


def parse_time(value: object, name: str) -> float:
    """Seconds since the epoch of a record's time, or ValueError saying why it is none."""
    if isinstance(value, bool) or value is None:
        raise ValueError(f"{name} is missing")
    if isinstance(value, int | float):
        try:
            seconds = float(value)
        except OverflowError:  # an integer of more than 308 digits
            seconds = math.inf
        return _in_range(seconds, name, value)
    if not isinstance(value, str):
        # A ValueError like every other bad time: callers report them all the same way.
        raise ValueError(f"{name} must be a time, got {quoted(value)}")  # noqa: TRY004
    text = value.strip()
    if not text:
        raise ValueError(f"{name} is empty")
    if len(text) > _MAX_TIME_TEXT:
        raise ValueError(f"{name} is not a time (too long: {len(text)} characters)")
    if text[0].isascii() and (text[0].isdigit() or text[0] in "+-.") and "-" not in text[1:]:
        try:
            seconds = float(text)
        except ValueError:
            pass
        else:
            return _in_range(seconds, name, value)
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00", 1))
    except ValueError:
        raise ValueError(
            f"{name} {quoted(value)} is not an ISO 8601 time (years 1-9999) nor seconds since 1970"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    try:
        seconds = moment.timestamp()
    except (OverflowError, ValueError):  # 9999-12-31T23:59-01:00 is past datetime's range
        seconds = math.inf
    # 0001-01-01T00:00+01:00 is a time of the year 0 in UTC: no datetime can show it.
    return _in_range(seconds, name, value)


def parse_millis(value: object, name: str) -> float:
    """Seconds since the epoch of a time in milliseconds, or ValueError saying why it is none."""
    if value is None:
        raise ValueError(f"{name} is missing")
    if isinstance(value, bool) or not isinstance(value, int | float):
        # A ValueError like every other bad time: callers report them all the same way.
        raise ValueError(f"{name} must be milliseconds since 1970, got {quoted(value)}")  # noqa: TRY004
    try:
        seconds = value / 1000
    except OverflowError:  # an integer of more than 308 digits
        seconds = math.inf
    return _in_range(seconds, name, value)


def _in_range(seconds: float, name: str, value: object) -> float:
    if not (math.isfinite(seconds) and _EARLIEST <= seconds <= _LATEST):
        raise ValueError(f"{name} {quoted(value)} is out of range (years 1-9999)")
    return seconds


def iso(seconds: float) -> str:
    """A record time as ISO 8601 in UTC, as the reports print it."""
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="milliseconds")


@dataclass(slots=True)
class ChatMessage:
    """One message of a recorded room, as the gateway would have received it.

    `channel` and `thread` are the ids the gateway's connector uses (so channel rules
    match as they would live); `mentions` the ids and lower-cased names it addresses.
    """

    platform: str
    channel: str
    thread: str | None
    message_id: str
    at: float
    sender_id: str
    sender_name: str
    is_bot: bool
    mentions: frozenset[str] = frozenset()
    is_direct: bool = False
    channel_name: str = ""


@dataclass(slots=True)
class RecordedCall:
    """One LLM call of a request log or a file of request bodies.

    `outcome` is the live proxy's verdict when the log has one (None for request
    bodies); tokens are None when unknown and then estimated from `request_bytes`.
    """

    at: float
    agent: str
    session: str
    circuit: str
    fingerprint: str
    model: str
    fields: dict[str, str]
    outcome: str | None = None
    status: int | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    request_bytes: int = 0


@dataclass
class Skipped:
    """Records skipped because they are unusual, not broken: a count per reason."""

    counts: Counter[str] = field(default_factory=Counter)

    def add(self, reason: str) -> None:
        """Count one skipped record."""
        self.counts[reason] += 1
