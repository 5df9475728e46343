"""The replay itself: recorded messages and calls through the gateway's own guard steps.

Chat: every message is one turn of the rooms' policies, resolved as the gateway resolves
them (`PolicyCache.resolve`: defaults, the first matching channel rule; no runtime
overrides exist offline). What the gateway's `bot_turns`, admission and `bot_loop`
stages would do is done with their own steps: `step_bot_turns` for the room's
consecutive-bot-turn count, `step_pair` for each pair budget (scoped per room, under
the room's `BotLoopPolicy`), `step_room` for the room budget, at the record's time.

Calls: every call goes through one `CallLoopGuard` with the config's `proxy.call_loop`
policy and `proxy.rules`, at the record's time; a provider failure the log shows is
uncounted (`record_outcome`) as the proxy does it. A call the live proxy refused counts
as the refusal it was; its cost, and that of every call the replay refuses, is what the
config's prices (`PriceTable`) say it would have cost.

Decisions where DESIGN.md is silent (the issue's decided details first):
- Every bot seen in a room is hosted there from its first message; each bot message is
  one event for the pair it forms with each other bot present (its receivers), decided
  as each receiver's bot-loop stage would decide it. A message counts in the room's
  consecutive-bot-turn run when some hosted bot receives it (as in the gateway: a lone
  bot's own posts reach nobody), humans reset it, skipped records neither count nor
  reset it. A consecutive-turn cut is one refused message, whatever the receivers.
- `respond_to.bots` is honoured: `none` decides no pair, `mentions` only the receivers
  the message mentions (by id or name) or a direct message's.
- Inputs are replayed merged by time (each input is in time order, as exporters write
  them), so a thread's file and its channel's file interleave as they happened. A
  record earlier than its room's (or, for calls, the log's) latest is taken at that
  latest time: the guards' clocks never go back.
- A pair keeps the first `MAX_REFUSED_IDS` refused message ids (the count is exact).
- The room budget (guards/room_budget.py, issue 20) is stepped once per bot message that
  some receiver's pair budget admitted, as the gateway counts a message once whoever
  receives it; `room_budget_cuts` counts the messages it refused (none of them charged to
  a pair's `refused`) and `room_cooldowns_opened` its cooldowns.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter

from gateway.app.policies import PolicyCache, ResolvedPolicy
from gateway.config import Config
from gateway.config.proxy import ProxyConfig
from gateway.proxy.pricing import PriceTable
from gateway.replay.records import ChatMessage, RecordedCall
from gateway.replay.telegram import sender_id as telegram_sender_id
from guards.bot_loop import PairRecord, pair_key, step_bot_turns, step_pair
from guards.call_loop import CallLoopGuard
from guards.room_budget import RoomRecord, step_room

MAX_REFUSED_IDS = 1_000
TIMELINE_BUCKETS = 600
_NO_OVERRIDES: Mapping[str, object] = {}
_REFUSALS = ("loop_detected", "loop_paused", "duplicate_call")
_at = attrgetter("at")


class BotMarks:
    """The senders `--bot` names: a display name, a platform id or a Telegram `from_id`."""

    def __init__(self, values: Iterable[str]) -> None:
        self._ids: set[str] = set()
        self._names: set[str] = set()
        for value in values:
            text = value.strip()
            if text:
                self._ids.update((text, telegram_sender_id(text)))
                self._names.add(text.casefold())

    def __bool__(self) -> bool:
        return bool(self._ids)

    def marks(self, message: ChatMessage) -> bool:
        """Whether `--bot` names this message's sender."""
        return message.sender_id in self._ids or message.sender_name.casefold() in self._names


class Timeline:
    """Messages and refused messages per time bucket, widened (doubled) to stay few."""

    def __init__(self, width: float = 60.0) -> None:
        self.width = width
        self.buckets: dict[int, list[int]] = {}

    def add(self, at: float, refused: int) -> None:
        """Count one message at `at`, refused or not."""
        key = int(at // self.width)
        bucket = self.buckets.get(key)
        if bucket is None:
            while len(self.buckets) >= TIMELINE_BUCKETS:
                self._widen()
                key = int(at // self.width)
            bucket = self.buckets.setdefault(key, [0, 0])
        bucket[0] += 1
        bucket[1] += refused

    def _widen(self) -> None:
        self.width *= 2
        merged: dict[int, list[int]] = {}
        for key, (messages, refused) in self.buckets.items():
            into = merged.setdefault(key // 2, [0, 0])
            into[0] += messages
            into[1] += refused
        self.buckets = merged

    def points(self) -> list[tuple[float, int, int]]:
        """(bucket start, messages, refused) in time order."""
        return [(key * self.width, m, r) for key, (m, r) in sorted(self.buckets.items())]


@dataclass(slots=True)
class PairTally:
    """What one pair of bots in one room did and what the budget would have refused."""

    record: PairRecord | None = None
    events: int = 0
    refused: int = 0
    cooldowns_opened: int = 0
    first_cooldown_at: float | None = None
    refused_message_ids: list[str] = field(default_factory=list)


@dataclass(slots=True)
class RoomTally:
    """One recorded room: its bots (id → latest name), its count, cuts, pairs, timeline."""

    platform: str
    channel: str
    name: str
    scope: str
    bots: dict[str, str] = field(default_factory=dict)
    messages: int = 0
    consecutive_turn_cuts: int = 0
    room_budget_cuts: int = 0
    room_cooldowns_opened: int = 0
    budget: RoomRecord | None = None
    bot_turns: int = 0
    last: float = float("-inf")
    pairs: dict[tuple[str, str], PairTally] = field(default_factory=dict)
    timeline: Timeline = field(default_factory=Timeline)


class ChatReplay:
    """Feeds recorded messages through the rooms' policies and the bot-loop steps."""

    def __init__(self, config: Config, bots: BotMarks) -> None:
        self._policies = PolicyCache(config)
        self._marks = bots
        self.rooms: dict[tuple[str, str], RoomTally] = {}

    def feed(self, message: ChatMessage) -> None:
        """One message, as every hosted bot of its room would have received it."""
        if self._marks and not message.is_bot and self._marks.marks(message):
            message.is_bot = True
        key = (message.platform, message.channel)
        room = self.rooms.get(key)
        if room is None:
            scope = f"{message.platform}:{message.channel}"
            room = self.rooms[key] = RoomTally(
                message.platform, message.channel, message.channel_name or message.channel, scope
            )
        at = message.at if message.at >= room.last else room.last
        room.last = at
        room.messages += 1
        sender = message.sender_id
        bots = room.bots
        if message.is_bot:
            bots[sender] = message.sender_name
        refused = 0
        if len(bots) > (sender in bots):  # some hosted bot other than the sender receives it
            resolved = self._policies.resolve(
                message.platform, message.channel, message.thread, _NO_OVERRIDES
            )
            if resolved.policy.bot_loop.enabled:
                room.bot_turns = step_bot_turns(room.bot_turns, is_bot=message.is_bot)
                if message.is_bot:
                    refused = self._bot_message(room, message, at, resolved)
        room.timeline.add(at, refused)

    def _bot_message(
        self, room: RoomTally, message: ChatMessage, at: float, resolved: ResolvedPolicy
    ) -> int:
        """Admission and the bot-loop stage for each receiver; 1 when the message is refused."""
        policy = resolved.policy
        mode = policy.respond_to.bots
        if mode == "none":
            return 0
        sender = message.sender_id
        receivers = [bot for bot in room.bots if bot != sender]
        if mode == "mentions":
            receivers = [bot for bot in receivers if _addressed(message, bot, room.bots[bot])]
            if not receivers:
                return 0
        cap = policy.bot_loop.max_consecutive_bot_turns
        if cap and room.bot_turns > cap:
            room.consecutive_turn_cuts += 1
            return 1
        refused = 0
        charged = False
        for bot in receivers:
            key = pair_key(bot, sender)
            pair = room.pairs.get(key)
            if pair is None:
                pair = room.pairs[key] = PairTally()
            pair.record, decision = step_pair(pair.record, resolved.bot_loop, at)
            pair.events += 1
            if not decision.allowed:
                refused = 1
                pair.refused += 1
                if len(pair.refused_message_ids) < MAX_REFUSED_IDS:
                    pair.refused_message_ids.append(message.message_id)
                if decision.reason == "budget_exceeded":
                    pair.cooldowns_opened += 1
                    if pair.first_cooldown_at is None:
                        pair.first_cooldown_at = at
            else:
                charged = True
        if charged:
            room.budget, verdict = step_room(
                room.budget,
                resolved.bot_loop,
                at,
                bot=message.sender_name or sender,
                key=message.message_id,
            )
            if not verdict.allowed:
                refused = 1
                room.room_budget_cuts += 1
                if verdict.reason == "room_budget_exceeded":
                    room.room_cooldowns_opened += 1
        return refused


def _addressed(message: ChatMessage, bot: str, name: str) -> bool:
    """Whether a bot message addresses this receiver (as admission reads a bot's message)."""
    mentions = message.mentions
    return message.is_direct or bot in mentions or name.casefold() in mentions


@dataclass(slots=True)
class SessionTally:
    """One agent's session: its calls, the refusals by code, the cost they save."""

    calls: int = 0
    refusals: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_REFUSALS, 0))
    cost_saved: float = 0.0


class CallReplay:
    """Feeds recorded LLM calls through the config's call-loop guard and rules."""

    def __init__(self, config: Config) -> None:
        proxy = config.proxy or ProxyConfig()
        self._guard = CallLoopGuard(proxy.call_loop.policy(), proxy.rules)
        self._prices = PriceTable(proxy.prices, proxy.default_output_tokens)
        self._last = float("-inf")
        self.agents: dict[str, dict[str, SessionTally]] = {}

    def feed(self, call: RecordedCall) -> None:
        """One call at its recorded time."""
        at = call.at if call.at >= self._last else self._last
        self._last = at
        decision = self._guard.check(
            circuit=call.circuit, fingerprint=call.fingerprint, fields=call.fields, now=at
        )
        if decision.allowed and call.outcome == "upstream_error":
            self._guard.record_outcome(
                decision, status=call.status, error=None if call.status else "no answer"
            )
        sessions = self.agents.setdefault(call.agent, {})
        tally = sessions.get(call.session)
        if tally is None:
            tally = sessions[call.session] = SessionTally()
        tally.calls += 1
        code = call.outcome if call.outcome in _REFUSALS else None
        if code is None and not decision.allowed:
            code = decision.code
        if code is None:
            if call.outcome == "forwarded" and call.output_tokens is not None:
                self._prices.observe(call.model, call.output_tokens)
            return
        tally.refusals[code] += 1
        guess_in, guess_out = self._prices.estimate(call.model, call.request_bytes)
        cost = self._prices.cost(
            call.model,
            guess_in if call.input_tokens is None else call.input_tokens,
            guess_out if call.output_tokens is None else call.output_tokens,
        )
        tally.cost_saved += cost or 0.0


def merged(streams: Sequence[Iterator[ChatMessage]]) -> Iterator[ChatMessage]:
    """Several inputs' messages as one stream in time order (each input is in order)."""
    return streams[0] if len(streams) == 1 else heapq.merge(*streams, key=_at)


def merged_calls(streams: Sequence[Iterator[RecordedCall]]) -> Iterator[RecordedCall]:
    """Several inputs' calls as one stream in time order (each input is in order)."""
    return streams[0] if len(streams) == 1 else heapq.merge(*streams, key=_at)
