"""The console's Calls and Rules data: `/admin/calls`, `/admin/calls.csv`, `/admin/calls/series`,
`/admin/rules`, on the gateway's HTTP server and the proxy's.

- `GET /admin/calls?agent=&session=&customer=&user=&feature=&model=&outcome=&since=&until=
  &limit=&cursor=`: a page of the request log, newest first, with the totals of the
  filter: `{calls: [...], next_cursor, totals: {calls, refused, input_tokens,
  output_tokens, cost, cost_saved, unpriced}}` (`gateway.calls.query` defines each).
- `GET /admin/calls.csv?<the same filters>`: every call the filter matches as CSV
  (`gateway.calls.export`'s columns), streamed a page at a time.
- `GET /admin/calls/series?span=hour|day&<filters>&until=`: cost, cost saved and calls per
  minute over the hour (or per hour over the day) ending at `until` (default now).
- `GET /admin/rules`: each uniqueness rule with its 7-day preview (`gateway.calls.preview`).
Every route is an admin route (`gateway.app.http.admin_route`: token or console session,
audit-logged).

Decisions where DESIGN.md is silent:
- Query values are read strictly: times are seconds since the epoch in ASCII digits (at
  most 12 before the point and 9 after, up to the year 9999), `limit` 1 to 1,000 (default
  50) in ASCII digits, text filters 1 to 256 characters without control characters, an
  outcome exactly one of `gateway.calls.entry.OUTCOMES`, `since` before `until`; anything
  else (inf, 1e308, 5,000 digits, a negative limit, full-width digits, NUL) is a 400
  naming the field. A text filter matches exactly (a look-alike letter matches nothing).
- Each call answers its time as `at` (seconds) and `iso` (UTC, milliseconds), its cost as
  a number or null when the model has no price (`priced: false`), `estimated` when the
  tokens (and so the cost) were estimated, and `refused` for a refusal. Text comes back
  as logged (a `<script>` in an agent's name included): escaping is the page's job.
- The gateway lists the rules of its config's `proxy:` section (a proxy run from the same
  config logs into the same state); without one it has no rules and says so. A rule's
  preview replays the calls logged in the last 7 days, with `proxy.call_loop.pause_seconds`.
- The texts answered as `result` are for people reading the admin API, not posted in
  chat, so they are written here rather than in gateway/app/messages.py.
"""

from __future__ import annotations

import csv
import io
import math
import re
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Annotated, Literal

from aiohttp import web
from pydantic import BeforeValidator, model_validator

from gateway.admin.access import AdminAccess, AdminBody
from gateway.admin.api import AdminDownload, admin_route
from gateway.admin.service import AdminAck, AdminService
from gateway.calls.codec import plain
from gateway.calls.entry import CallLogEntry, CallOutcome
from gateway.calls.export import CSV_COLUMNS, call_time, csv_row
from gateway.calls.preview import PREVIEW_SECONDS, RulePreview, preview
from gateway.calls.query import CallFilter, CallTotals, CostBucket, Cursor, is_sent
from gateway.calls.store import CallStore
from gateway.config.proxy import ProxyConfig
from gateway.state.base import AuditStore
from guards.call_loop import UniquenessRule

MAX_LIMIT = 1_000
MAX_TEXT = 256
MAX_EPOCH = 253_402_300_799.0  # 9999-12-31T23:59:59Z: the last time ISO 8601 can show
CSV_PAGE = 1_000
SPANS = {"hour": (60.0, 60), "day": (3_600.0, 24)}
_EPOCH = re.compile(r"[0-9]{1,12}(?:\.[0-9]{1,9})?", re.ASCII)
_LIMIT = re.compile(r"[0-9]{1,4}", re.ASCII)
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _epoch(value: object) -> float:
    """Seconds since the epoch, from ASCII digits only (no inf, exponent or full-width)."""
    if not isinstance(value, str) or not _EPOCH.fullmatch(value):
        raise ValueError("must be seconds since the epoch in ASCII digits, e.g. 1767225600")
    seconds = float(value)
    if seconds > MAX_EPOCH:
        raise ValueError(f"must be at most {MAX_EPOCH:.0f} (the year 9999)")
    return seconds


def _limit(value: object) -> int:
    """A page size, 1 to MAX_LIMIT, from ASCII digits only."""
    if isinstance(value, str) and _LIMIT.fullmatch(value) and 1 <= int(value) <= MAX_LIMIT:
        return int(value)
    raise ValueError(f"must be a whole number from 1 to {MAX_LIMIT} in ASCII digits")


def _text(value: object) -> str:
    """A filter value: 1 to MAX_TEXT characters, none of them a control character."""
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_TEXT:
        raise ValueError(f"must be 1 to {MAX_TEXT} characters")
    if _CONTROL.search(value):
        raise ValueError("must not contain control characters")
    return value


def _cursor(value: object) -> Cursor:
    """The `next_cursor` of an earlier page."""
    return Cursor.parse(value if isinstance(value, str) else "")


Epoch = Annotated[float, BeforeValidator(_epoch)]
Limit = Annotated[int, BeforeValidator(_limit)]
Text = Annotated[str, BeforeValidator(_text)]
CursorText = Annotated[Cursor, BeforeValidator(_cursor)]


class CallFields(AdminBody):
    """The request log's equality filters, as query parameters."""

    agent: Text | None = None
    session: Text | None = None
    customer: Text | None = None
    user: Text | None = None
    feature: Text | None = None
    model: Text | None = None
    outcome: CallOutcome | None = None

    def where(self, since: float | None = None, until: float | None = None) -> CallFilter:
        """The filter these parameters ask for, within since..until."""
        return CallFilter(
            agent=self.agent,
            session=self.session,
            customer=self.customer,
            user=self.user,
            feature=self.feature,
            model=self.model,
            outcome=self.outcome,
            since=since,
            until=until,
        )


class CallsRange(CallFields):
    """The filters with a time range (`GET /admin/calls.csv`)."""

    since: Epoch | None = None
    until: Epoch | None = None

    @model_validator(mode="after")
    def _ordered(self) -> CallsRange:
        if self.since is not None and self.until is not None and self.since >= self.until:
            raise ValueError("until: must be later than since")
        return self

    def filter(self) -> CallFilter:
        """The filter, time range included."""
        return self.where(self.since, self.until)


class CallsQuery(CallsRange):
    """A page of the request log (`GET /admin/calls`)."""

    limit: Limit = 50
    cursor: CursorText | None = None


class SeriesQuery(CallFields):
    """A cost series (`GET /admin/calls/series`): the span ending at `until` (default now)."""

    span: Literal["hour", "day"] = "hour"
    until: Epoch | None = None


class RulesQuery(AdminBody):
    """`GET /admin/rules` takes no parameters."""


def calls_admin_routes(
    admin: AdminService,
    state: AuditStore,
    access: AdminAccess,
    *,
    store: CallStore,
    proxy: ProxyConfig | None,
    clock: Callable[[], float] = time.time,
) -> list[web.RouteDef]:
    """The Calls and Rules routes over `store`, with the rules of `proxy` (None: no rules)."""
    view = _CallsView(store, proxy, clock)
    return [
        admin_route(admin, state, access, ("GET", "/admin/calls", CallsQuery, view.calls)),
        admin_route(admin, state, access, ("GET", "/admin/calls.csv", CallsRange, view.csv)),
        admin_route(admin, state, access, ("GET", "/admin/calls/series", SeriesQuery, view.series)),
        admin_route(admin, state, access, ("GET", "/admin/rules", RulesQuery, view.rules)),
    ]


class _CallsView:
    """Answers the routes from the call store."""

    def __init__(
        self, store: CallStore, proxy: ProxyConfig | None, clock: Callable[[], float]
    ) -> None:
        self._store = store
        self._rules: Sequence[UniquenessRule] = proxy.rules if proxy is not None else ()
        self._pause = proxy.call_loop.pause_seconds if proxy is not None else None
        self._clock = clock

    async def calls(self, query: CallsQuery) -> AdminAck:
        """A page and the filter's totals."""
        where = query.filter()
        page = await self._store.query_calls(where, query.limit, query.cursor)
        totals = await self._store.call_totals(where)
        cursor = page.next_cursor
        lines = [_totals_line(totals), *(_call_line(entry) for entry in page.entries)]
        return AdminAck(
            "\n".join(lines),
            data={
                "calls": [call_json(entry) for entry in page.entries],
                "next_cursor": None if cursor is None else cursor.text(),
                "totals": totals_json(totals),
            },
        )

    async def csv(self, query: CallsRange) -> AdminAck:
        """The filtered log as a CSV download."""
        return AdminDownload(
            "calls.csv",
            chunks=_csv_chunks(self._store, query.filter()),
            filename="calls.csv",
            content_type="text/csv; charset=utf-8",
        )

    async def series(self, query: SeriesQuery) -> AdminAck:
        """Cost, cost saved and calls per bucket of the span."""
        bucket, count = SPANS[query.span]
        until = self._clock() if query.until is None else query.until
        # The last bucket holds the instant just before `until` (its own when on a boundary).
        since = math.ceil(until / bucket) * bucket - count * bucket
        buckets = await self._store.cost_series(query.where(), since, until, bucket)
        cost = sum(b.cost for b in buckets)
        calls = sum(b.calls for b in buckets)
        per = "minute" if query.span == "hour" else "hour"
        return AdminAck(
            f"cost {cost:.6f} over {calls} calls in the last {query.span}, per {per}",
            data={
                "span": query.span,
                "bucket_seconds": bucket,
                "buckets": [bucket_json(b) for b in buckets],
            },
        )

    async def rules(self, query: RulesQuery) -> AdminAck:
        """The uniqueness rules, each with its preview over the last 7 days."""
        if not self._rules or self._pause is None:
            return AdminAck(
                "no uniqueness rules configured (proxy.rules)",
                data={"rules": [], "preview_seconds": PREVIEW_SECONDS},
            )
        entries = await self._store.calls_since(PREVIEW_SECONDS)
        shown = [(rule, preview(rule, entries, pause_seconds=self._pause)) for rule in self._rules]
        return AdminAck(
            "\n".join(_rule_line(rule, counts) for rule, counts in shown),
            data={
                "rules": [rule_json(rule, counts) for rule, counts in shown],
                "preview_seconds": PREVIEW_SECONDS,
            },
        )


async def _csv_chunks(store: CallStore, where: CallFilter) -> AsyncIterator[bytes]:
    """The CSV: the header, then a chunk per page of CSV_PAGE calls, newest first."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(CSV_COLUMNS)
    cursor: Cursor | None = None
    while True:
        page = await store.query_calls(where, CSV_PAGE, cursor)
        writer.writerows(csv_row(entry) for entry in page.entries)
        yield out.getvalue().encode()
        out.seek(0)
        out.truncate()
        cursor = page.next_cursor
        if cursor is None:
            return


def call_json(entry: CallLogEntry) -> dict[str, object]:
    """One logged call as the Calls page reads it: its fields, and what the page shows of them."""
    return {
        **plain(entry),
        "iso": call_time(entry.at),
        "refused": not is_sent(entry.outcome),
        "priced": entry.cost is not None,
    }


def totals_json(totals: CallTotals) -> dict[str, object]:
    """A filter's totals as the Calls page reads them."""
    return totals._asdict()


def bucket_json(bucket: CostBucket) -> dict[str, object]:
    """One bucket of the cost chart."""
    return {
        "t": bucket.t,
        "iso": call_time(bucket.t),
        "cost": bucket.cost,
        "saved": bucket.saved,
        "calls": bucket.calls,
    }


def rule_json(rule: UniquenessRule, counts: RulePreview) -> dict[str, object]:
    """A uniqueness rule and its preview, as the Rules page reads them."""
    return {
        "name": rule.name,
        "fields": list(rule.fields),
        "filters": dict(rule.filters),
        "max_calls": rule.max_calls,
        "window": rule.window_seconds,
        "action": rule.action,
        "mode": rule.mode,
        "preview": {
            "calls": counts.calls,
            "applies": counts.applies,
            "groups": counts.groups,
            "would_refuse": counts.would_refuse,
        },
    }


def _totals_line(totals: CallTotals) -> str:
    unpriced = f", {totals.unpriced} unpriced" if totals.unpriced else ""
    return (
        f"{totals.calls} calls ({totals.refused} refused{unpriced}): cost {totals.cost:.6f}, "
        f"saved {totals.cost_saved:.6f}, tokens {totals.input_tokens} in "
        f"{totals.output_tokens} out"
    )


def _call_line(entry: CallLogEntry) -> str:
    cost = "unpriced" if entry.cost is None else f"{entry.cost:.6f}"
    estimated = " (estimated)" if entry.estimated else ""
    return f"{call_time(entry.at)} {entry.agent} {entry.model} {entry.outcome} {cost}{estimated}"


def _rule_line(rule: UniquenessRule, counts: RulePreview) -> str:
    return (
        f"rule {rule.name}: would have refused {counts.would_refuse} of {counts.calls} calls "
        f"logged in the last 7 days ({counts.groups} groups)"
    )
