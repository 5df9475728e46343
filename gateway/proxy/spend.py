"""What budgets have spent, and the admin's levers: `loopwarden spend` and `/admin/spend*`.

`spend_rows` reads the call store's groups of the current periods; `loopwarden spend
--config FILE [--by FIELD] [--period PERIOD]` prints them as a table (budget, group,
spent, held, limit, percent spent, period end; plain numbers), and so does `GET
/admin/spend` (`?by=&period=`; beside the table as `result`, the data the console's
Spend page draws: `groups: [{budget, group, spent, held, limit, percent, ends}]` and
`budgets: [{name, per, period}]`). Held is the estimates of the calls in flight, which a
call must fit beside (`gateway.calls.budgets`), and of a killed proxy's calls until its
lease lapses (`gateway.calls.owners`; issue 20: before, a group refusing every call
showed only its spend). `POST /admin/spend/limit {"budget", "limit_usd", "limit_tokens"}` sets
a budget's limit for the current period (the next call is held to it; the config's limit
is back when the period ends; a kind not given keeps the config's), and
`POST /admin/spend/reset {"budget", "group"}` forgets one group's spend this period
(`group` as the table shows it). Both are audit-logged like every admin call.

Decisions where DESIGN.md is silent: `--by FIELD` shows the budgets that group by that
field, `--period` those of that period; a group appears once a call was charged or held
in it this period. With memory state the spend lives inside the running proxy, so the
command says so and points at the admin API.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, TextIO
from zoneinfo import ZoneInfo

from aiohttp import web
from pydantic import Field, model_validator

from gateway.admin.access import AdminAccess, AdminBody
from gateway.admin.api import admin_route
from gateway.admin.service import AdminAck, AdminService
from gateway.calls.budgets import (
    Budget,
    Limits,
    limit_key,
    nano,
    parse_group_key,
    percent,
    usd,
)
from gateway.calls.factory import build_call_store
from gateway.calls.store import CallStore
from gateway.cli.shared_state import NoSharedState
from gateway.config import Config
from gateway.config.limits import MAX_TOKENS, MAX_USD
from gateway.config.proxy import PerField
from gateway.proxy import messages
from gateway.proxy.budgets import Periods, ProxyBudgets
from gateway.state.base import AuditStore

PeriodName = Literal["day", "week", "month"]
HEADINGS = ("BUDGET", "GROUP", "SPENT", "HELD", "LIMIT", "%", "PERIOD END")


@dataclass(frozen=True, slots=True)
class SpendRow:
    """One group's line: its budget and group, spend, held and limit (as text), share, end.

    `spent_usd` and `limit_usd` (None: no dollar limit) are the figures the proxy's
    `budget_spend_usd` and `budget_limit_usd` gauges show.
    """

    budget: str
    group: str
    spent: str
    held: str
    limit: str
    percent: float
    ends: str
    key: str
    spent_usd: float
    limit_usd: float | None

    def as_json(self) -> dict[str, object]:
        """The row as the console's Spend page reads it (a zero limit's share is null)."""
        return {
            "budget": self.budget,
            "group": self.group,
            "spent": self.spent,
            "held": self.held,
            "limit": self.limit,
            "percent": self.percent if math.isfinite(self.percent) else None,
            "ends": self.ends,
        }


async def spend_rows(
    store: CallStore,
    budgets: Sequence[Budget],
    periods: Periods,
    now: float,
    *,
    by: str | None = None,
    period: str | None = None,
) -> list[SpendRow]:
    """The live groups of the chosen budgets in their current periods, by budget and group."""
    chosen = {
        budget.name: budget
        for budget in budgets
        if (by is None or by in budget.per) and (period is None or budget.period == period)
    }
    if not chosen:
        return []
    overrides = await store.spend_limits()
    rows = []
    for key, spend in await store.spend_groups():
        parts = parse_group_key(key)
        budget = chosen.get(parts.budget) if parts is not None else None
        if parts is None or budget is None:
            continue
        span = periods.span(budget.period, now)
        if parts.label != span.label or len(parts.values) != len(budget.per):
            continue
        limits = overrides.get(limit_key(budget.name, span.label), budget.limits)
        group = " ".join(f"{n}={v}" for n, v in zip(budget.per, parts.values, strict=True))
        rows.append(
            SpendRow(
                budget.name,
                group or "all",
                _shown(limits, spend.spent.nano_usd, spend.spent.tokens),
                _shown(limits, spend.held.nano_usd, spend.held.tokens),
                messages.money(limits.nano_usd, limits.tokens),
                percent(limits, spend.spent),
                periods.show(span.ends_at),
                key,
                usd(spend.spent.nano_usd),
                None if limits.nano_usd is None else usd(limits.nano_usd),
            )
        )
    return sorted(rows, key=lambda row: (row.budget, row.group))


def _shown(limits: Limits, nano_usd: int, tokens: int) -> str:
    """A spend in the kinds its limits have."""
    return messages.money(
        nano_usd if limits.nano_usd is not None else None,
        tokens if limits.tokens is not None else None,
    )


def spend_table(rows: Sequence[SpendRow]) -> str:
    """The rows as an aligned plain-text table (no 10.2k abbreviations)."""
    if not rows:
        return "no budget has spent anything this period"
    lines = [
        (row.budget, row.group, row.spent, row.held, row.limit, f"{row.percent:.1f}", row.ends)
        for row in rows
    ]
    widths = [max(len(cells[i]) for cells in [HEADINGS, *lines]) for i in range(len(HEADINGS))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True)).rstrip()
        for cells in [HEADINGS, *lines]
    )


async def spend_command(config: Config, by: str | None, period: str | None, out: TextIO) -> int:
    """`loopwarden spend`: print the table of the config's budgets from the shared store."""
    proxy = config.proxy
    if proxy is None or not proxy.budgets:
        print("no budgets configured (proxy.budgets)", file=out)
        return 0
    if config.state.backend == "memory":
        raise NoSharedState
    store = build_call_store(config.state)
    await store.start()
    try:
        periods = Periods(ZoneInfo(proxy.budget_timezone))
        budgets = [settings.budget() for settings in proxy.budgets]
        rows = await spend_rows(store, budgets, periods, time.time(), by=by, period=period)
    finally:
        await store.aclose()
    print(spend_table(rows), file=out)
    return 0


class SpendQuery(AdminBody):
    """`GET /admin/spend`: optionally one field's budgets, one period's."""

    by: PerField | None = None
    period: PeriodName | None = None


class SpendLimitBody(AdminBody):
    """`POST /admin/spend/limit`: a budget's limit for the current period."""

    budget: str = Field(min_length=1, max_length=64)
    limit_usd: float | None = Field(default=None, ge=0, le=MAX_USD, allow_inf_nan=False)
    limit_tokens: int | None = Field(default=None, ge=0, le=MAX_TOKENS)

    @model_validator(mode="after")
    def _has_a_limit(self) -> SpendLimitBody:
        if self.limit_usd is None and self.limit_tokens is None:
            raise ValueError("give limit_usd, limit_tokens or both")
        return self


class SpendResetBody(AdminBody):
    """`POST /admin/spend/reset`: forget one group's spend this period."""

    budget: str = Field(min_length=1, max_length=64)
    group: str = Field(min_length=1, max_length=4096)


class SpendAdmin:
    """The spend routes' actions on the proxy's budgets and call store."""

    def __init__(self, budgets: ProxyBudgets, store: CallStore, clock: Callable[[], float]):
        self._budgets = budgets
        self._store = store
        self._clock = clock

    def _budget(self, name: str) -> Budget | None:
        return next((b for b in self._budgets.budgets if b.name == name), None)

    def _unknown(self, name: str) -> AdminAck:
        known = ", ".join(b.name for b in self._budgets.budgets) or "none configured"
        return AdminAck(f"no budget named {name[:64]!r} (budgets: {known})", ok=False)

    async def show(self, query: SpendQuery) -> AdminAck:
        """The spend table."""
        rows = await spend_rows(
            self._store,
            self._budgets.budgets,
            self._budgets.periods,
            self._clock(),
            by=query.by,
            period=query.period,
        )
        budgets = [
            {"name": b.name, "per": list(b.per), "period": b.period} for b in self._budgets.budgets
        ]
        return AdminAck(
            spend_table(rows), data={"groups": [row.as_json() for row in rows], "budgets": budgets}
        )

    async def set_limit(self, body: SpendLimitBody) -> AdminAck:
        """Set a budget's limits until its period ends."""
        budget = self._budget(body.budget)
        if budget is None:
            return self._unknown(body.budget)
        span = self._budgets.periods.span(budget.period, self._clock())
        current = budget.limits
        limits = Limits(
            current.nano_usd if body.limit_usd is None else nano(body.limit_usd),
            current.tokens if body.limit_tokens is None else body.limit_tokens,
        )
        await self._store.set_spend_limit(limit_key(budget.name, span.label), limits, span.ends_at)
        ends = self._budgets.periods.show(span.ends_at)
        return AdminAck(
            messages.spend_limit(budget.name, messages.money(limits.nano_usd, limits.tokens), ends)
        )

    async def reset(self, body: SpendResetBody) -> AdminAck:
        """Forget one group's spend this period."""
        budget = self._budget(body.budget)
        if budget is None:
            return self._unknown(body.budget)
        rows = await spend_rows(self._store, [budget], self._budgets.periods, self._clock())
        found = next((row for row in rows if row.group == body.group), None)
        done = found is not None and await self._store.reset_spend(found.key)
        return AdminAck(messages.spend_reset(budget.name, body.group, done))


def spend_admin_routes(
    admin: AdminService,
    state: AuditStore,
    access: AdminAccess,
    *,
    budgets: ProxyBudgets,
    store: CallStore,
    clock: Callable[[], float],
) -> list[web.RouteDef]:
    """`GET /admin/spend`, `POST /admin/spend/limit` and `POST /admin/spend/reset`."""
    actions = SpendAdmin(budgets, store, clock)
    return [
        admin_route(admin, state, access, ("GET", "/admin/spend", SpendQuery, actions.show)),
        admin_route(
            admin, state, access, ("POST", "/admin/spend/limit", SpendLimitBody, actions.set_limit)
        ),
        admin_route(
            admin, state, access, ("POST", "/admin/spend/reset", SpendResetBody, actions.reset)
        ),
    ]
