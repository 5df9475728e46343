"""Spend limits of the gateway's own `openai` agents: `policy.spend` per room or per bot.

DESIGN.md §6 in the gateway. A room's `policy.spend` (`limit_usd` and/or `limit_tokens`
per `period` in `timezone`, `per: [room]` by default; in the config's `policy`, a channel
rule, or `/loop set spend.limit_usd 5`) is one budget over the model calls of the agents
answering there. Before each call `AgentBudgets.event` gives the call's group in its
current period and its estimated cost with the proxy's estimator and prices
(`gateway.proxy.pricing`), and the call store decides it together with the call-loop
guard (`CallStore.admit`: `gateway.calls.budgets.step_spend`, the proxy's decision, one
script call on Redis). Afterwards `AgentBudgets.used` is what the call's usage block says
it cost, charged in place of the estimate (`CallStore.charge`). A refused call ends the
turn (`AgentBudgets.refusal`, `notice`): the humans of the room get one short notice per period,
bots nothing, and the refusal is recorded by the agent-dispatch stage under the `spend`
stage (`refusals_total`, the decision log, `/loop status`). `/loop spend` and
`GET /admin/spend?room=` show the room's groups (`AgentBudgets.lines`).

Decisions where DESIGN.md is silent:
- `per: [room]` is one group per room (`platform:channel`, its threads included),
  `per: [bot]` one per hosted bot (its config id) across the rooms it answers in,
  `per: [room, bot]` one per bot in each room and `per: []` one for every call under that
  policy. A group is held to the limit of the room the call is made in.
- A budget is named `gateway:<per>:<period>:<timezone>` (`SpendSettings.budget`): no
  `proxy.budgets` name holds a `:`, so the proxy's and the gateway's budgets never share
  a counter on one store, and rooms whose settings agree share a bot's counter.
- Prices are the proxy's price table: `proxy.prices` (when the config has a `proxy:`
  section) before `genai-prices` (as OpenAI's models: the agents speak its API). The
  agents send no `max_tokens`, so a call's output is estimated as the model's average so
  far in this process, else `proxy.default_output_tokens`. A model without a price is
  charged by tokens only (warned once per model): give such rooms a `limit_tokens`.
- A call is charged the tokens its usage block reports (a streamed call asks for the
  usage chunk, `stream_options.include_usage`) and their price; a count missing or
  malformed is charged by the estimate's and logged. A failed call (an error status, a
  timeout, a dropped connection, an unreadable answer) costs nothing.
- The notice is posted once per room, group and period: a claim in the state store that
  lasts until the period ends, so replicas agree; later refused turns are silent.
- A call refused because the budget could not be checked (`state.on_error: deny` while
  Redis is unreachable, or too few replicas confirmed its hold: `state.wait_replicas`)
  ends the turn with `Halt("spend", "state_unavailable")`; the humans get one sentence
  (`messages.SPEND_UNAVAILABLE`) at most once per `UNAVAILABLE_NOTICE_SECONDS` per
  room, claimed in the state store as the other notice (which, when it is the
  unreachable Redis, refuses the claim under `deny`: then the turn ends silently).
- With `mode: shadow` a call the budget would refuse is sent and charged afterwards
  (holding nothing) and counted as the `spend` guard's shadow refusal.
- `/loop spend` lists the groups a call from the room is charged to: the room's, or with
  `per: [bot]` one per hosted bot of the room's platform with an `openai` agent.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from zoneinfo import ZoneInfo

from gateway.app import messages
from gateway.app.types import Halt
from gateway.calls.budgets import (
    Amount,
    Limits,
    SpendEvent,
    SpendGroup,
    SpendHold,
    SpendVerdict,
    group_key,
    limit_key,
    nano,
    percent,
    usd,
)
from gateway.calls.store import CallStore
from gateway.config import Config, OpenAIAgentConfig, SpendSettings
from gateway.config.proxy import ProxyConfig
from gateway.proxy.budgets import CODE, Periods
from gateway.proxy.messages import money
from gateway.proxy.openai import OpenAIProvider
from gateway.proxy.pricing import PriceTable
from gateway.proxy.provider import Usage
from gateway.state.base import DecisionStore

log = logging.getLogger("loopwarden.spend")

SPEND = "spend"
"""The stage (and guard) name of budget refusals in decisions, metrics and `status`."""
UNAVAILABLE_CODE = "state_unavailable"
"""The code of a refusal because the budget's shared state could not be reached."""
UNAVAILABLE_NOTICE_SECONDS = 60.0
"""How long one `state_unavailable` notice serves a room: later refused turns are silent."""
PROVIDER = "openai"
"""The price catalogue's provider for the agents' models (they speak OpenAI's API)."""
_OPENAI = OpenAIProvider()


def reported_usage(usage: object) -> Usage | None:
    """The token counts a completion's `usage` block reports (None: no block)."""
    return _OPENAI.usage({"usage": usage})


@dataclass(frozen=True, slots=True)
class CallCharge:
    """What one sent call holds, and the estimate its charge falls back on."""

    hold: SpendHold
    model: str
    input_tokens: int
    output_tokens: int


@dataclass(frozen=True, slots=True)
class SpendLine:
    """One group a room's calls are charged to: its spend and limits this period."""

    group: str
    spent: Amount
    limits: Limits
    ends_at: float

    def as_json(self) -> dict[str, object]:
        """The group as the admin API answers it (dollars, tokens; None: no such limit)."""
        limits = self.limits
        share = percent(limits, self.spent)
        return {
            "group": self.group,
            "spent_usd": usd(self.spent.nano_usd),
            "spent_tokens": self.spent.tokens,
            "limit_usd": None if limits.nano_usd is None else usd(limits.nano_usd),
            "limit_tokens": limits.tokens,
            "percent": share if math.isfinite(share) else None,
            "ends_at": self.ends_at,
        }


class AgentBudgets:
    """The `openai` agents' budgets: each call's group and estimate, its charge, the notice.

    `bots` lists, per platform, the hosted bots with an `openai` agent (for `/loop spend`).
    """

    def __init__(
        self,
        proxy: ProxyConfig | None = None,
        *,
        bots: Mapping[str, Sequence[str]] | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._prices = PriceTable.for_config(proxy)
        self._bots = {platform: tuple(ids) for platform, ids in (bots or {}).items()}
        self._wall_clock = wall_clock
        self._periods: dict[str, Periods] = {}

    @classmethod
    def from_config(
        cls, config: Config, *, wall_clock: Callable[[], float] = time.time
    ) -> AgentBudgets:
        """The budgets of a config's agents, priced by its `proxy.prices`."""
        bots: dict[str, list[str]] = {}
        for bot in config.bots:
            if isinstance(config.agents.get(bot.agent), OpenAIAgentConfig):
                bots.setdefault(bot.platform, []).append(bot.id)
        return cls(config.proxy, bots=bots, wall_clock=wall_clock)

    def periods(self, settings: SpendSettings) -> Periods:
        """The periods of the settings' time zone (one cache per zone)."""
        periods = self._periods.get(settings.timezone)
        if periods is None:
            periods = self._periods[settings.timezone] = Periods(ZoneInfo(settings.timezone))
        return periods

    def event(
        self, settings: SpendSettings, fields: Mapping[str, str], model: str, request_bytes: int
    ) -> tuple[SpendEvent, CallCharge]:
        """The call's group in its current period and estimated cost; its charge's fallback."""
        budget = settings.budget()
        span = self.periods(settings).span(budget.period, self._wall_clock())
        group = SpendGroup(
            budget.name,
            budget.group(fields),
            group_key(budget.name, span.label, budget.values(fields)),
            limit_key(budget.name, span.label),
            budget.limits,
            span.ends_at,
        )
        tokens_in, tokens_out = self._prices.estimate(model, request_bytes)
        cost = self._prices.cost(model, tokens_in, tokens_out, PROVIDER)
        estimate = Amount(nano(cost or 0.0), tokens_in + tokens_out)
        hold = SpendHold((group,), estimate)
        return SpendEvent((group,), estimate), CallCharge(hold, model, tokens_in, tokens_out)

    def used(self, charge: CallCharge, usage: object) -> Amount:
        """What a call that answered cost: its reported tokens, the estimate's where missing."""
        reported = reported_usage(usage)
        tokens_in = reported.input_tokens if reported is not None else None
        tokens_out = reported.output_tokens if reported is not None else None
        if usage is not None and (tokens_in is None or tokens_out is None):
            log.warning(
                "model %r answered a usage block without valid token counts; "
                "the missing counts are charged by the estimate",
                charge.model[:100],
            )
        if tokens_out is not None:
            self._prices.observe(charge.model, tokens_out)
        tokens_in = charge.input_tokens if tokens_in is None else tokens_in
        tokens_out = charge.output_tokens if tokens_out is None else tokens_out
        cost = self._prices.cost(charge.model, tokens_in, tokens_out, PROVIDER)
        return Amount(nano(cost or 0.0), tokens_in + tokens_out)

    def refusal(self, verdict: SpendVerdict, group: SpendGroup, settings: SpendSettings) -> Halt:
        """The halt that ends a turn the budget refused, with the figures for the log."""
        if verdict.unavailable:
            detail = messages.spend_unavailable_detail(
                budget=group.budget, retry_after=verdict.retry_after
            )
            return Halt(SPEND, UNAVAILABLE_CODE, detail, verdict.retry_after)
        limits = verdict.limits or group.limits
        alert = verdict.alert
        detail = messages.spend_refusal_detail(
            budget=group.budget,
            group=group.group,
            spent=None if alert is None else _shown(limits, alert.spent),
            limit=money(limits.nano_usd, limits.tokens),
            ends=self.periods(settings).show(group.ends_at),
            retry_after=verdict.retry_after,
        )
        return Halt(SPEND, CODE, detail, verdict.retry_after)

    async def notice(
        self,
        verdict: SpendVerdict,
        group: SpendGroup,
        settings: SpendSettings,
        *,
        state: DecisionStore,
        room: str,
    ) -> str | None:
        """The notice for the room's humans, the first time this period (else None)."""
        if verdict.unavailable:
            claimed = await state.claim(f"spend-unavailable:{room}", UNAVAILABLE_NOTICE_SECONDS)
            return messages.SPEND_UNAVAILABLE if claimed else None
        key = f"spend-notice:{room}:{group.key}"
        if not await state.claim(key, max(verdict.retry_after, 1.0)):
            return None
        limits = verdict.limits or group.limits
        return messages.spend_notice(
            per=settings.per,
            limit=money(limits.nano_usd, limits.tokens),
            ends=self.periods(settings).show(group.ends_at),
        )

    async def lines(self, store: CallStore, settings: SpendSettings, room: str) -> list[SpendLine]:
        """The groups a call from `room` is charged to, with their spend this period."""
        budget = settings.budget()
        span = self.periods(settings).span(budget.period, self._wall_clock())
        bots = self._bots.get(room.partition(":")[0], ()) if "bot" in budget.per else ("",)
        wanted: dict[str, str] = {}
        for bot in bots:
            fields = {"room": room, "bot": bot}
            wanted[group_key(budget.name, span.label, budget.values(fields))] = budget.group(fields)
        spent = {key: group.spent for key, group in await store.spend_groups() if key in wanted}
        lines = [
            SpendLine(group, spent.get(key, Amount()), budget.limits, span.ends_at)
            for key, group in wanted.items()
        ]
        return sorted(lines, key=lambda line: line.group)

    def figures(
        self, settings: SpendSettings, lines: Sequence[SpendLine]
    ) -> list[messages.SpendFigures]:
        """The lines in plain numbers, as `/loop spend` and `status` show them."""
        periods = self.periods(settings)
        return [
            messages.SpendFigures(
                group=line.group,
                spent=_shown(line.limits, line.spent),
                limit=money(line.limits.nano_usd, line.limits.tokens),
                percent=percent(line.limits, line.spent),
                ends=periods.show(line.ends_at),
            )
            for line in lines
        ]


def _shown(limits: Limits, spent: Amount) -> str:
    """A spend in the kinds its limits have."""
    return money(
        spent.nano_usd if limits.nano_usd is not None else None,
        spent.tokens if limits.tokens is not None else None,
    )
