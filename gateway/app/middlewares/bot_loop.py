"""Bot loop guard: pair and room budgets, a cap on consecutive bot turns, a notice per cooldown.

Two stages, both this module's. `bot_turns` (before admission) keeps the room's
consecutive-bot-turn count, and is its only writer in the pipeline: every message that
reaches it updates `state.bot_turn` (a bot message adds one, a human message resets it to
0), answered or not, so a human message admission refuses still resets the count, and
bot messages no hosted bot answers (a paused room, `respond_to`) still count as bot turns
in the room. The update is keyed by the message, so a message that several hosted bots
see counts once and every one of them gets the same count (`ctx.bot_turns`). Each bot
message is counted by the hosted bots that receive it, so a bot's own posts count through
the other hosted bots (the self filter runs earlier); with a single hosted bot, only the
other bots' messages count.

`bot_loop` (after admission) decides the admitted bot messages. Bot messages beyond
`max_consecutive_bot_turns` (0 turns the cap off) are dropped (`bot_turn_cap`) until a
human speaks; the pair budget is not charged for them. Otherwise `state.pair_decide`
records the exchange between the hosted bot and the sender (their platform user ids,
direction-independent, scoped to the room) and decides it atomically. The one exchange
that exceeds the budget opens the cooldown and is the only one answered
`budget_exceeded`; every later exchange of the pair until the cooldown ends is answered
`cooldown`, by whichever replica or hosted bot asks, and a reset starts the pair afresh.

A bot message its pair admitted is then charged to the room budget (guards/room_budget.py,
issue 20): `state.room_decide` records it under the room, keyed by the message (so it
counts once however many hosted bots or replicas receive it) with the sender's name (at
most 64 characters), whatever the pair. The message over `room_max_events_per_window` in
`room_window_seconds` is refused `room_budget_exceeded` and opens the room cooldown
(`room_cooldown` after it, with the seconds left as `retry_after` and the window's count
as `count`); its guard verdicts are `guard_decisions_total{guard="bot_loop"}` with those
codes (an admitted message counts once, as the pair's `ok`). Its notice is claimed like
the pair's, by the room and the cooldown's end (`RoomDecision.until`), and names the bots
of the window (`messages.room_cooldown_notice`). In shadow mode it is decided alike,
logged and counted with `shadow="true"`, and no notice is posted.

The cooldown notice (when `announce_cooldown` is on and the cooldown is longer than 0)
is posted once per cooldown: the refusal that wins the cooldown's notice claim
(`state.claim` of the pair and the cooldown's end, `PairDecision.until`, for the rest of
the cooldown) posts it. That is the `budget_exceeded` refusal that opens it, unless a
replica's `cooldown` refusal of the same cooldown claimed it first (it then posts it
instead: one notice either way), or, for a cooldown opened in shadow mode, the first
enforce-mode refusal of it. The notice names the hosted bot
by its display name and the admin command by the platform's prefix
(`capabilities.command_prefix`): this module knows no platform.

In shadow mode (`bot_loop.mode: shadow`) the stage decides exactly as in enforce (the
same `pair_decide`, so the same counts, and a cooldown opened as far as the state goes;
a message over the bot-turn cap is not charged to the pair, as in enforce), records what
it would have refused (`DecisionLog.shadow`), posts no notice and hands the message on.
A switch to enforce takes effect on the next message, with the state built in shadow: a
pair in a cooldown opened in shadow is refused at once, and that refusal posts the notice.
A reset ends a cooldown: the pair's next cooldown is another one, with a notice of its
own.

Linked rooms (`links:`, gateway/config/links.py) are one scope: both stages count, decide
and reset under `ctx.scope`, the link's key, and charge every bot exchange to the link's
one pair (`pair_ids`), so a ping-pong through a bridge is cut at the budget it would be cut
at in one room. Notices are still claimed per room (`msg.room`): each room where the cut
happened gets one notice per cooldown.

The decisions are written once, as steps both stages and `loopwarden_integrations.RoomGuard` call
(issue 21): `count_bot_turn`, `decide_bot_message`, `claim_notice` and `notice_text`.
The stages add what only a hosted bot has: the decision log, metrics, `status` and the
admin command the notice names.
"""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass

from gateway.app import messages
from gateway.app.context import TurnContext
from gateway.app.pipeline import Handler
from gateway.app.refusals import DecisionLog
from gateway.app.types import Reply
from gateway.config import BotLoopSettings
from gateway.state.base import DecisionStore
from guards.bot_loop import BotLoopPolicy, pair_key

_GUARD = "bot_loop"
# A sender's name as the room budget keeps it (and its notice shows it) is cut to this.
_LABEL_CHARS = 64
_ROOM_REASONS = frozenset({"room_budget_exceeded", "room_cooldown"})
LINK_PAIR = "link"
"""Both bot ids of the one pair linked rooms charge (`pair_ids`)."""


@dataclass(frozen=True, slots=True)
class LoopVerdict:
    """The bot-loop guard's verdict on one admitted bot message (`decide_bot_message`).

    `reason`: `ok` (or the pair's allowing reason), `bot_turn_cap`, `budget_exceeded`,
    `cooldown`, `room_budget_exceeded` or `room_cooldown`. `count` is the bot-turn count
    for the cap, the pair's or the room's events in the window otherwise; `retry_after`
    the cooldown seconds left and `until` its end (as the state reads it, the notice
    claim's key); `bots` the names the room budget's window holds (its notice names them).
    """

    allowed: bool
    reason: str
    count: int = 0
    retry_after: float = 0.0
    until: float | None = None
    bots: tuple[str, ...] = ()

    @property
    def room_budget(self) -> bool:
        """True when the room budget refused the message (its notice is the room's)."""
        return self.reason in _ROOM_REASONS


def count_bot_turn(
    state: DecisionStore,
    settings: BotLoopSettings,
    room: str,
    *,
    is_bot: bool,
    message_key: str | None,
) -> Awaitable[int]:
    """The `bot_turns` step: the room's consecutive bot turns after this message (0 if off).

    Awaited like a coroutine function; with the guard on it hands back the state's own
    call, so each message's count costs no coroutine of its own.
    """
    if not settings.enabled:
        return _no_turns()
    return state.bot_turn(room, is_bot=is_bot, message_key=message_key)


async def _no_turns() -> int:
    """The count with the guard off: none."""
    return 0


async def decide_bot_message(
    state: DecisionStore,
    settings: BotLoopSettings,
    policy: BotLoopPolicy,
    *,
    room: str,
    self_bot_id: str,
    sender_id: str,
    sender_name: str,
    message_key: str | None,
    turns: int,
) -> LoopVerdict:
    """The `bot_loop` step for one bot message: bot-turn cap, then pair, then room budget.

    `settings` gives the cap, `policy` the budgets (a room's runtime overrides included).
    Shared with `loopwarden_integrations.RoomGuard`, so a guarded bot is cut where a hosted one is.
    """
    cap = settings.max_consecutive_bot_turns
    if cap and turns > cap:
        return LoopVerdict(False, "bot_turn_cap", turns)
    pair = await state.pair_decide(
        scope=room, self_bot_id=self_bot_id, sender_bot_id=sender_id, policy=policy
    )
    if not pair.allowed:
        return LoopVerdict(False, pair.reason, pair.count, pair.retry_after, pair.until)
    budget = await state.room_decide(
        scope=room, bot=sender_name[:_LABEL_CHARS], message_key=message_key, policy=policy
    )
    if not budget.allowed:
        return LoopVerdict(
            False,
            budget.reason,
            budget.count,
            budget.retry_after,
            budget.until,
            tuple(budget.bots),
        )
    return LoopVerdict(True, pair.reason, pair.count)


async def claim_notice(
    state: DecisionStore,
    settings: BotLoopSettings,
    verdict: LoopVerdict,
    *,
    room: str,
    self_bot_id: str,
    sender_id: str,
) -> bool:
    """True when this enforced refusal posts its cooldown's notice (it won the claim).

    Only a pair's or the room's cooldown has a notice, when `announce_cooldown` is on and
    the cooldown is longer than 0; the claim makes it one per cooldown across replicas,
    hosted bots and guarded bots sharing the state.
    """
    if verdict.allowed or verdict.reason == "bot_turn_cap":
        return False
    if not (settings.announce_cooldown and settings.cooldown_seconds > 0):
        return False
    if verdict.room_budget:
        end = "unknown" if verdict.until is None else repr(verdict.until)
        key = f"room-notice:{room}:{end}"
    else:
        key = _notice_key(room, self_bot_id, sender_id, verdict.until)
    return await state.claim(key, verdict.retry_after)


def notice_text(
    settings: BotLoopSettings,
    verdict: LoopVerdict,
    *,
    bot_name: str,
    sender_name: str,
    prefix: str | None,
) -> str:
    """The notice of the cooldown `verdict` refused in; `prefix` None names no admin command."""
    if verdict.room_budget:
        return messages.room_cooldown_notice(
            verdict.bots,
            cooldown=verdict.retry_after,
            budget=settings.room_max_events_per_window,
            window=settings.room_window_seconds,
            prefix=prefix,
        )
    return messages.cooldown_notice(
        bot_name,
        sender_name,
        cooldown=verdict.retry_after,
        budget=settings.max_events_per_window,
        window=settings.window_seconds,
        prefix=prefix,
    )


def pair_ids(self_bot_id: str, sender_id: str, *, linked: bool) -> tuple[str, str]:
    """The pair a bot exchange is charged to: the two bots, or in linked rooms the link's one.

    Across a bridge the other side's bot speaks through a relay or a ghost user, so who
    answers whom cannot be told; every bot exchange of linked rooms is charged to one pair
    (`LINK_PAIR` with itself, under the link's scope), and a ping-pong through the bridge is
    cut where the same exchanges in one room would be.
    """
    return (LINK_PAIR, LINK_PAIR) if linked else (self_bot_id, sender_id)


class BotTurnsMiddleware:
    """Counts the room's consecutive bot turns for every message, into `ctx.bot_turns`."""

    name = "bot_turns"

    async def __call__(self, ctx: TurnContext, call_next: Handler) -> Reply | None:
        msg = ctx.message
        ctx.bot_turns = await count_bot_turn(
            ctx.state,
            ctx.policy.bot_loop,
            ctx.scope,
            is_bot=msg.sender_is_bot,
            message_key=msg.message_key,
        )
        return await call_next(ctx)


class BotLoopMiddleware:
    """Drops bot messages over the pair budget, in cooldown, or beyond the bot-turn cap."""

    name = "bot_loop"

    def __init__(self, decisions: DecisionLog) -> None:
        self._decisions = decisions

    async def __call__(self, ctx: TurnContext, call_next: Handler) -> Reply | None:
        msg = ctx.message
        settings = ctx.policy.bot_loop
        if not msg.sender_is_bot or not settings.enabled:
            return await call_next(ctx)
        resolved = ctx.resolved
        shadow = resolved.bot_loop_shadow
        scope = ctx.scope
        self_bot_id, sender_id = pair_ids(
            msg.bot_user_id or ctx.connector.bot_user_id,
            msg.sender_id,
            linked=bool(ctx.config.room_links.linked(msg.room)),
        )
        sender_name = msg.sender_name or msg.sender_id
        verdict = await decide_bot_message(
            ctx.state,
            settings,
            resolved.bot_loop,
            room=scope,
            self_bot_id=self_bot_id,
            sender_id=sender_id,
            sender_name=sender_name,
            message_key=msg.message_key,
            turns=ctx.bot_turns,
        )
        if verdict.allowed:
            self._decisions.guard(
                ctx,
                _GUARD,
                verdict.reason,
                "within the pair budget",
                count=verdict.count,
                shadow=shadow,
            )
            return await call_next(ctx)
        detail = _detail(verdict, settings)
        if shadow:
            self._decisions.shadow(
                ctx,
                _GUARD,
                verdict.reason,
                detail,
                who=_pair(ctx),
                retry_after=verdict.retry_after,
                count=verdict.count,
            )
            return await call_next(ctx)
        self._decisions.metrics.guard_decision(_GUARD, verdict.reason)
        self._decisions.metrics.loop_cut(_GUARD, msg.room)
        self._decisions.refuse(
            ctx,
            self.name,
            verdict.reason,
            detail,
            who=_pair(ctx),
            retry_after=verdict.retry_after,
            count=verdict.count,
            remember=True,
        )
        if not await claim_notice(
            ctx.state,
            settings,
            verdict,
            room=msg.room,
            self_bot_id=self_bot_id,
            sender_id=sender_id,
        ):
            return None
        self._decisions.note(ctx, self.name, *_noted(verdict, ctx))
        text = notice_text(
            settings,
            verdict,
            bot_name=ctx.bot.display_name,
            sender_name=sender_name,
            prefix=ctx.connector.capabilities.command_prefix,
        )
        return Reply(text, thread_id=msg.thread_id)


def _detail(verdict: LoopVerdict, settings: BotLoopSettings) -> str:
    """Why the message was refused, in words, for the decision log and `status`."""
    if verdict.reason == "bot_turn_cap":
        return messages.bot_turn_cap_detail(verdict.count, settings.max_consecutive_bot_turns)
    if verdict.reason == "budget_exceeded":
        return messages.budget_exceeded_detail(
            verdict.count + 1,
            settings.max_events_per_window,
            window=settings.window_seconds,
            cooldown=verdict.retry_after,
        )
    if verdict.reason == "room_budget_exceeded":
        return messages.room_budget_exceeded_detail(
            verdict.count + 1,
            settings.room_max_events_per_window,
            window=settings.room_window_seconds,
            cooldown=verdict.retry_after,
            bots=verdict.bots,
        )
    if verdict.room_budget:
        return messages.room_cooling_down_detail(verdict.retry_after)
    return messages.cooling_down_detail(verdict.retry_after)


def _notice_key(room: str, self_bot_id: str, sender_bot_id: str, until: float | None) -> str:
    """The claim of one pair cooldown's notice: the pair (direction-independent) and its end.

    The end is read from the state, so it is the same on every replica. Two cooldowns of
    a pair ending at the same instant (a reset and a new cooldown with no time passing,
    as under a frozen clock) share one notice.
    """
    a, b = pair_key(self_bot_id, sender_bot_id)
    end = "unknown" if until is None else repr(until)
    return f"cooldown-notice:{room}:{a}:{b}:{end}"


def _noted(verdict: LoopVerdict, ctx: TurnContext) -> tuple[str, str]:
    """The decision log's (code, text) for a notice being posted."""
    cooldown = messages.format_duration(verdict.retry_after)
    if verdict.room_budget:
        names = messages.bot_names(verdict.bots)
        return (
            "room_cooldown_notice",
            f"room cooldown opened for {cooldown}, notice posted, bots={names}",
        )
    return "cooldown_notice", f"cooldown opened for {cooldown}, notice posted " + _pair(ctx)


def _pair(ctx: TurnContext) -> str:
    """`pair=parrot↔echo`: the hosted bot and the sender, for decision log lines."""
    msg = ctx.message
    return f"pair={msg.bot_id}↔{msg.sender_name or msg.sender_id}"
