"""Reading the request log for the console's Calls page: filters, pages, totals, cost series.

A `CallFilter` picks entries (agent, session, customer, user, feature, model, outcome,
time); a page lists them newest first, `limit` at a time, continued by a `Cursor`; the
totals add up what the filter matches; a cost series adds it up per time bucket. Every
CallStore answers these alike: the memory and Redis stores feed their entries, newest
first, through the builders here (`PageBuilder`, `TotalsBuilder`, `SeriesBuilder`); the
SQLite store asks the same in SQL (gateway.calls.query_sqlite).

Decisions where DESIGN.md is silent:
- Time filters are `since <= at < until`, in seconds since the epoch.
- Entries with the same time come in an order fixed by each backend (SQLite: newest
  written first; memory: the same; Redis: its members' order), so a cursor is the time of
  the page's last entry and how many entries of that time were listed: the next page is
  the entries at or before that time, after skipping those. Calls logged after the first
  page never shift the pages that follow.
- Totals: `cost` and the tokens are those of the calls sent to the provider ("forwarded"
  and "upstream_error"); `cost_saved` is the estimated cost of the refused calls (every
  other outcome); `unpriced` counts the calls whose model has no price (no cost to add).
  Sums of money are rounded to nano-dollars, so every backend answers the same figure.
  `call_sums` writes one call's share; the builders and the Redis store's per-hour sums
  add those up (SQLite's SQL says the same, held to it by the conformance tests).
- A cost series' buckets are aligned to multiples of the bucket length since the epoch,
  every bucket of the range listed, empty ones with zeros.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:  # store.py imports this module for its memory backend
    from gateway.calls.entry import CallLogEntry, CallOutcome

SENT_OUTCOMES = frozenset({"forwarded", "upstream_error"})
"""The outcomes of calls that went to the provider; every other outcome is a refusal."""
FIELD_FILTERS = ("customer", "user", "feature")
"""The filters read from an entry's rule fields (`CallLogEntry.fields`)."""
MONEY_DIGITS = 9
_CURSOR = re.compile(r"([0-9]{1,17}(?:\.[0-9]{1,17})?(?:e[-+]?[0-9]{1,3})?):([0-9]{1,9})", re.ASCII)
_CURSOR_MAX_AT = 1e13


@dataclass(frozen=True, slots=True)
class CallFilter:
    """Which logged calls to read: each field given must match exactly; times bound `at`."""

    agent: str | None = None
    session: str | None = None
    customer: str | None = None
    user: str | None = None
    feature: str | None = None
    model: str | None = None
    outcome: CallOutcome | None = None
    since: float | None = None
    until: float | None = None

    def field_values(self) -> dict[str, str]:
        """The rule-field filters given (customer, user, feature), by field name."""
        chosen = {name: getattr(self, name) for name in FIELD_FILTERS}
        return {name: value for name, value in chosen.items() if value is not None}

    def matches(self, entry: CallLogEntry) -> bool:
        """True when the entry passes every filter given."""
        if self.since is not None and entry.at < self.since:
            return False
        if self.until is not None and entry.at >= self.until:
            return False
        for name in ("agent", "session", "model", "outcome"):
            wanted = getattr(self, name)
            if wanted is not None and getattr(entry, name) != wanted:
                return False
        fields = entry.fields
        return all(fields.get(name) == value for name, value in self.field_values().items())


class Cursor(NamedTuple):
    """Where a page continues: entries at or before `at`, after `skip` of those at `at`."""

    at: float
    skip: int

    def text(self) -> str:
        """The cursor as the `cursor` query parameter carries it (exact: `repr` of the time)."""
        return f"{self.at!r}:{self.skip}"

    @classmethod
    def parse(cls, text: str) -> Cursor:
        """A cursor from its text; ValueError when it is not one this module wrote."""
        match = _CURSOR.fullmatch(text)
        if match is None:
            raise ValueError("must be the next_cursor of an earlier page")
        at = float(match.group(1))
        if not math.isfinite(at) or at > _CURSOR_MAX_AT:
            raise ValueError("must be the next_cursor of an earlier page")
        return cls(at, int(match.group(2)))


class CallPage(NamedTuple):
    """A page of the log, newest first, and the cursor of the next (None: this is the last)."""

    entries: list[CallLogEntry]
    next_cursor: Cursor | None


class CallTotals(NamedTuple):
    """What calls add up to (see the module docstring for each sum): a filter's, or one call's.

    The money is summed as it comes (`plus`); `rounded` is what a store answers.
    """

    calls: int = 0
    refused: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost: float = 0.0
    cost_saved: float = 0.0
    unpriced: int = 0

    def plus(self, other: CallTotals) -> CallTotals:
        """Both added up, sum by sum."""
        return CallTotals._make(mine + theirs for mine, theirs in zip(self, other, strict=True))

    def rounded(self) -> CallTotals:
        """These totals with the money rounded to nano-dollars, as every backend answers them."""
        return self._replace(cost=nano_rounded(self.cost), cost_saved=nano_rounded(self.cost_saved))


class CostBucket(NamedTuple):
    """One bucket of a cost series: its start, the cost sent, the cost saved, the calls."""

    t: float
    cost: float
    saved: float
    calls: int


def is_sent(outcome: str) -> bool:
    """True for the outcome of a call the provider was sent."""
    return outcome in SENT_OUTCOMES


def nano_rounded(total: float) -> float:
    """A sum of costs as answered: rounded to nano-dollars (the same on every backend)."""
    return round(total, MONEY_DIGITS)


def next_cursor(entries: list[CallLogEntry], cursor: Cursor | None) -> Cursor:
    """The cursor after a page: its last entry's time, and how many of that time were listed."""
    last = entries[-1].at
    listed = sum(1 for entry in entries if entry.at == last)
    if cursor is not None and cursor.at == last:
        listed += cursor.skip
    return Cursor(last, listed)


class PageBuilder:
    """Builds one page from entries offered newest first (`offer` says when it is full)."""

    def __init__(self, where: CallFilter, limit: int, cursor: Cursor | None) -> None:
        self._where = where
        self._limit = limit
        self._cursor = cursor
        self._skip = 0 if cursor is None else cursor.skip
        self._found: list[CallLogEntry] = []

    def offer(self, entry: CallLogEntry) -> bool:
        """Take the entry if it belongs on the page; True once one beyond the page was seen."""
        cursor = self._cursor
        if (cursor is not None and entry.at > cursor.at) or not self._where.matches(entry):
            return False
        if cursor is not None and entry.at == cursor.at and self._skip:
            self._skip -= 1
            return False
        self._found.append(entry)
        return len(self._found) > self._limit

    def page(self) -> CallPage:
        """The page: at most `limit` entries, and a cursor when more were seen."""
        return page_of(self._found, self._limit, self._cursor)


def page_of(found: list[CallLogEntry], limit: int, cursor: Cursor | None) -> CallPage:
    """A page from up to `limit` + 1 entries found newest first (one more: a next page)."""
    if len(found) <= limit:
        return CallPage(found, None)
    entries = found[:limit]
    return CallPage(entries, next_cursor(entries, cursor))


def call_sums(entry: CallLogEntry) -> CallTotals:
    """One call's share of the totals: the one place each sum's meaning is written.

    Every backend adds these up (the Redis store keeps them per hour, see
    gateway.calls.redis_store); the SQLite store's SQL is held to it by the conformance
    tests (tests/gateway/calls/test_calls_query.py).
    """
    cost = entry.cost
    unpriced = 1 if cost is None else 0
    if not is_sent(entry.outcome):
        return CallTotals(calls=1, refused=1, cost_saved=cost or 0.0, unpriced=unpriced)
    return CallTotals(
        calls=1,
        input_tokens=entry.input_tokens or 0,
        output_tokens=entry.output_tokens or 0,
        cost=cost or 0.0,
        unpriced=unpriced,
    )


class TotalsBuilder:
    """Adds up the entries offered (in any order) that the filter matches, and given sums."""

    def __init__(self, where: CallFilter) -> None:
        self._where = where
        self._sums = CallTotals()

    def add(self, entry: CallLogEntry) -> None:
        """Count one entry, if the filter matches it."""
        if self._where.matches(entry):
            self.add_sums(call_sums(entry))

    def add_sums(self, sums: CallTotals) -> None:
        """Count sums already added up (calls the filter matched)."""
        self._sums = self._sums.plus(sums)

    def totals(self) -> CallTotals:
        """The sums so far."""
        return self._sums.rounded()


def series_start(since: float, bucket_seconds: float) -> float:
    """The start of the bucket `since` falls in."""
    return math.floor(since / bucket_seconds) * bucket_seconds


def bucket_index(at: float, start: float, bucket_seconds: float) -> int:
    """The bucket of a time at or after `start` (the same arithmetic as the SQL's)."""
    return int((at - start) / bucket_seconds)


def bucket_count(since: float, until: float, bucket_seconds: float) -> int:
    """How many buckets cover since..until (at least one)."""
    start = series_start(since, bucket_seconds)
    return max(1, math.ceil((until - start) / bucket_seconds))


def series_buckets(
    start: float, bucket_seconds: float, sums: list[tuple[float, float, int]]
) -> list[CostBucket]:
    """Buckets from per-bucket sums (cost, saved, calls), the money rounded."""
    return [
        CostBucket(start + index * bucket_seconds, nano_rounded(cost), nano_rounded(saved), calls)
        for index, (cost, saved, calls) in enumerate(sums)
    ]


class SeriesBuilder:
    """Adds up the entries offered (in any order) per bucket of since..until."""

    def __init__(
        self, where: CallFilter, since: float, until: float, bucket_seconds: float
    ) -> None:
        self._where = where
        self._since = since
        self._until = until
        self._bucket = bucket_seconds
        self._start = series_start(since, bucket_seconds)
        self._sums = [(0.0, 0.0, 0)] * bucket_count(since, until, bucket_seconds)

    def add(self, entry: CallLogEntry) -> None:
        """Count one entry in its bucket, if the filter matches it."""
        if self._since <= entry.at < self._until and self._where.matches(entry):
            self.add_sums(entry.at, call_sums(entry))

    def add_sums(self, at: float, sums: CallTotals) -> None:
        """Count sums already added up (matched calls of since..until) in the bucket of `at`."""
        # The last bucket also takes a time that float division puts just past it.
        index = min(bucket_index(at, self._start, self._bucket), len(self._sums) - 1)
        cost, saved, calls = self._sums[index]
        self._sums[index] = (cost + sums.cost, saved + sums.cost_saved, calls + sums.calls)

    def buckets(self) -> list[CostBucket]:
        """The series, oldest bucket first."""
        return series_buckets(self._start, self._bucket, self._sums)
