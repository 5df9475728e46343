"""The `/loop` admin commands: one method per command, each returning its acknowledgement.

The chat middleware (`gateway/app/middlewares/admin.py`) parses, authorises, claims and audits
a command and then calls `run`; the HTTP admin API calls the methods directly. Rooms are
room keys, `platform:channel`, exactly as `InboundMessage.room` writes them. Runtime
changes go through the `StateStore`, so every replica sees them.

Decisions where DESIGN.md is silent:
- `reset` clears the room's bot pairs, its room budget (guards/room_budget.py) and its
  consecutive-bot-turn count; `reset all` clears every pair and room budget (turn counts
  of other rooms are left to the next human message);
  `reset <bot>` takes a hosted bot's config id, a platform user id or a Discord mention
  (`<@123>`) and clears that bot's pairs in every room.
- `pause` takes `30s`, `10m`, `2h`, `1d` or a bare number of seconds (ASCII digits), at
  most 366 days (`gateway.config.limits`); no duration pauses until `resume`. `set` accepts a
  leaf field of the policy (`bot_loop.window_seconds`, `tool_loop.<LoopGuardConfig
  field>`); its value (at most 500 characters) is read as bounded YAML (`gateway.config.safeyaml`:
  no alias bombs, deep nesting or 5,000-digit numbers) and validated with the room's
  effective policy, guard policies included, before anything is stored. A number written
  in look-alike digits (full-width `５`), inf, nan, a negative or over-long duration are
  refused. A refused `set` or `pause` answers "Can't …" with the reason and changes
  nothing.
- A stored override the policy refuses today is ignored with a logged warning
  (`gateway.config.resolve_policy`) and does not stop a `set` of another field.
- `set` and `pause` apply to the room (`platform:channel`), across its threads.
- A room linked with others (`links:`, gateway/config/links.py) is one scope with them:
  `status`, `reset`, `pause`, `resume` and `set` in (or on) any of the rooms read and
  change the link's pairs, bot-turn count, pause and overrides (`RoomLinks.scope`), and
  `status` names the linked rooms. `forget` and `spend` stay the room's own.
- `set bot_loop.mode shadow` (also `tool_loop.mode`, `call_loop.mode`) takes exactly
  `enforce` or `shadow`; `status` then says "<guard>: shadow: would have refused N" for
  each guard in shadow mode (N counted in this process since it started).
- `forget` empties the transcript (DESIGN.md §3) of the thread it is typed in, or of the
  room and all its threads when typed outside one, for every hosted bot; the chat stage
  names a DM's transcript (`gateway.app.middlewares.transcript.conversation_room`).
- `circuits` and `reopen <circuit>` act on the LLM-call circuits of the CallStore given
  (the gateway's own agents, and the proxy's when both share a sqlite or redis state);
  they are not tied to the room the command is typed in.
- `spend` lists the budget groups of the room's `policy.spend` (`gateway.agents.spend`), and
  `status` adds a `Spend:` line per group; `set spend.limit_usd 5` gives a room without
  `policy.spend` a budget (the other fields at their defaults).
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import yaml
from pydantic import BaseModel, ValidationError

from gateway.admin.views import PairView, RoomView, circuit_json, room_json, status_text
from gateway.app import messages
from gateway.app.errors import LoopwardenError
from gateway.app.policies import PolicyCache, merged
from gateway.app.refusals import RecentRefusals
from gateway.calls.store import CallStore
from gateway.config import (
    Config,
    Policy,
    SpendSettings,
    ToolLoopSettings,
    first_error,
    with_override,
)
from gateway.config.limits import parse_duration
from gateway.config.safeyaml import YamlLimitError, load_yaml
from gateway.observability.metrics import ReportsOutages
from gateway.state import transcripts
from gateway.state.base import GLOBAL_SCOPE, ControlStore, DecisionStore, TranscriptStore
from guards.bot_loop import PairSnapshot
from guards.lookalike import fold
from guards.loop_guard import LoopGuardConfig

if TYPE_CHECKING:
    from gateway.agents.spend import AgentBudgets

_MENTION = re.compile(r"<@!?(\w+)>")
_JSON_SCALARS = (str, int, float, bool, type(None))
MAX_VALUE_CHARS = 500


class _RefusedValue(LoopwardenError):
    """A `set` value that cannot be read; the message is the reason shown to the admin."""


@dataclass(frozen=True, slots=True)
class AdminAck:
    """What a command answered, and whether it did what was asked (for the audit log)."""

    text: str
    ok: bool = True
    data: Mapping[str, object] | None = None
    """Structured fields answered beside `text` by the JSON admin API (the console reads them)."""


class AdminState(DecisionStore, ControlStore, TranscriptStore, Protocol):
    """What admin commands read and change: pairs, counters, overrides, pauses, transcripts."""


class AdminService:
    """Runs admin commands against the state store; shared by chat and the HTTP API."""

    def __init__(
        self,
        config: Config,
        state: AdminState,
        *,
        recent: RecentRefusals | None = None,
        calls: CallStore | None = None,
        policies: PolicyCache | None = None,
        spend: AgentBudgets | None = None,
    ) -> None:
        self.policies = policies or PolicyCache(config)
        self._links = config.room_links
        self._state = state
        self._calls = calls
        self._spend = spend
        self._recent = recent or RecentRefusals()
        self._bot_users: dict[str, str] = {}
        self._hosted_users: frozenset[str] = frozenset()

    def register_bot(self, bot_id: str, user_id: str) -> None:
        """Learn a hosted bot's platform user id, so `reset <bot>` and `status` can use names."""
        if user_id and self._bot_users.get(bot_id) != user_id:
            self._bot_users[bot_id] = user_id
            self._hosted_users = frozenset(self._bot_users.values())

    def is_hosted_bot(self, user_id: str) -> bool:
        """Whether `user_id` is the platform user of a hosted bot registered so far."""
        return user_id in self._hosted_users

    async def run(
        self, room: str, args: Sequence[str], *, thread_id: str | None = None, prefix: str = "/loop"
    ) -> AdminAck:
        """Dispatch one parsed chat command (`args` after the prefix); unknown ones get help."""
        name = args[0].lower() if args else "help"
        rest = list(args[1:])
        if name == "status":
            return await self.status_ack(room, thread_id=thread_id)
        if name == "policy":
            return AdminAck(await self.policy(room, thread_id=thread_id))
        if name == "reset":
            if not rest:
                return AdminAck(await self.reset(room))
            if [word.lower() for word in rest] == ["all"]:
                return AdminAck(await self.reset_all())
            return AdminAck(await self.reset_bot(" ".join(rest)))
        if name == "pause":
            seconds = parse_duration(rest[0]) if rest else None
            if rest and seconds is None:
                return AdminAck(messages.bad_duration(" ".join(rest)), ok=False)
            return AdminAck(await self.pause(room, seconds, prefix=prefix))
        if name == "resume":
            return AdminAck(await self.resume(room))
        if name == "set":
            if len(rest) < 2:
                return AdminAck(messages.set_usage(prefix), ok=False)
            return await self._set(room, rest[0], " ".join(rest[1:]), thread_id)
        if name == "forget":
            return AdminAck(await self.forget(room, thread_id=thread_id))
        if name == "circuits":
            return await self.circuits()
        if name == "spend":
            return await self.spend(room, thread_id=thread_id)
        if name == "reopen":
            if len(rest) != 1:
                return AdminAck(messages.reopen_usage(prefix), ok=False)
            return await self.reopen_circuit(rest[0])
        return AdminAck(messages.help_text(prefix), ok=name == "help")

    async def status(self, room: str, *, thread_id: str | None = None) -> str:
        """The room's policy summary, shadow guards, pause, pairs held and recent refusals."""
        view = await self.room_view(room, thread_id=thread_id)
        return status_text(view) + await self._status_spend(room, view.policy.spend)

    async def status_ack(self, room: str, *, thread_id: str | None = None) -> AdminAck:
        """`status`, with the room object the console reads (`adminviews.room_json`) as data."""
        view = await self.room_view(room, thread_id=thread_id)
        spend = await self._status_spend(room, view.policy.spend)
        return AdminAck(status_text(view) + spend, data=room_json(view))

    async def room_view(
        self,
        room: str,
        *,
        thread_id: str | None = None,
        pairs: Sequence[PairSnapshot] | None = None,
    ) -> RoomView:
        """What `status` and the console's Rooms page show of a room, read once.

        `pairs` are the room's live pairs when the caller has read them already (the Rooms
        page reads every room's pairs in one call).
        """
        state = self._state
        platform, channel = split_room(room)
        scope = self._links.scope(room)
        overrides = merged(
            await state.get_overrides(GLOBAL_SCOPE), await state.get_overrides(scope)
        )
        resolved = self.policies.resolve(platform, channel, thread_id, overrides)
        if pairs is None:
            pairs = await state.pair_snapshot(scope)
        names = {user: bot for bot, user in self._bot_users.items()}
        now = self._recent.clock()
        return RoomView(
            room=room,
            policy=resolved.policy,
            overrides=overrides,
            paused=await state.pause_remaining(scope),
            pairs=tuple(
                PairView(snap, names.get(snap.bot_a, snap.bot_a), names.get(snap.bot_b, snap.bot_b))
                for snap in pairs
            ),
            bot_turns=await state.bot_turns_peek(scope),
            shadowed=self._recent.shadowed(room),
            refusals=tuple(
                messages.RefusalLine(age=now - r.at, stage=r.stage, code=r.code, detail=r.detail)
                for r in self._recent.recent(room)
            ),
            degraded=isinstance(state, ReportsOutages) and state.degraded,
            linked=tuple(other for other in self._links.linked(room) if other != room),
        )

    async def policy(self, room: str, *, thread_id: str | None = None) -> str:
        """The room's effective policy as compact YAML."""
        return messages.policy_text(room, await self.effective_policy(room, thread_id=thread_id))

    async def reset(self, room: str) -> str:
        """Clear the room's (its link's) pairs, room budget and consecutive-bot-turn count."""
        scope = self._links.scope(room)
        dropped = await self._state.pair_reset(scope=scope)
        await self._state.room_reset(scope)
        await self._state.bot_turn(scope, is_bot=False)
        return messages.reset_room_ack(dropped)

    async def reset_all(self) -> str:
        """Clear every bot pair and room budget in every room."""
        dropped = await self._state.pair_reset()
        await self._state.room_reset()
        return messages.reset_all_ack(dropped)

    async def reset_bot(self, bot: str) -> str:
        """Clear one bot's pairs everywhere (hosted bot id, platform user id or mention)."""
        name = bot.strip().removeprefix("@")
        mention = _MENTION.fullmatch(name)
        user_id = mention.group(1) if mention else self._bot_users.get(name, name)
        dropped = await self._state.pair_reset(bot_id=user_id)
        return messages.reset_bot_ack(name, dropped)

    async def pause(self, room: str, seconds: float | None, *, prefix: str = "/loop") -> str:
        """Pause the room (and the rooms linked with it) for `seconds`, or until resumed."""
        await self._state.pause(self._links.scope(room), seconds)
        return messages.pause_ack(seconds, prefix)

    async def resume(self, room: str) -> str:
        """Lift the room's (its link's) pause."""
        scope = self._links.scope(room)
        was_paused = await self._state.pause_remaining(scope) is not None
        await self._state.resume(scope)
        return messages.resume_ack(was_paused)

    async def forget(self, room: str, *, thread_id: str | None = None) -> str:
        """Empty the thread's transcript, or the room's and its threads' when not in one."""
        dropped = await self._state.transcript_forget(
            transcripts.scope(room, thread_id), threads=thread_id is None
        )
        return messages.forget_ack(dropped, thread=thread_id is not None)

    async def circuits(self) -> AdminAck:
        """The LLM-call circuits (and rule groups) paused now, as text and as data."""
        if self._calls is None:
            return AdminAck(messages.NO_CALL_GUARD, data={"circuits": []})
        paused = await self._calls.paused()
        return AdminAck(
            messages.circuits_text(paused), data={"circuits": [circuit_json(p) for p in paused]}
        )

    async def spend(self, room: str, *, thread_id: str | None = None) -> AdminAck:
        """Each budget group the room's agents are charged to: spent, limit, period end."""
        settings = (await self.effective_policy(room, thread_id=thread_id)).spend
        if settings is None:
            return AdminAck(messages.NO_SPEND_LIMIT, data={"room": room, "groups": []})
        if self._spend is None or self._calls is None:
            return AdminAck(messages.NO_SPEND_KEPT, ok=False)
        lines = await self._spend.lines(self._calls, settings, room)
        text = messages.spend_text(room, self._spend.figures(settings, lines))
        return AdminAck(text, data={"room": room, "groups": [line.as_json() for line in lines]})

    async def _status_spend(self, room: str, settings: SpendSettings | None) -> str:
        """The `status` lines of the room's spend (none without `policy.spend`)."""
        if settings is None or self._spend is None or self._calls is None:
            return ""
        lines = await self._spend.lines(self._calls, settings, room)
        return "\n" + messages.status_spend(self._spend.figures(settings, lines))

    async def reopen_circuit(self, circuit: str) -> AdminAck:
        """Lift a circuit's (or rule group's) pause and start its counts afresh."""
        if self._calls is None:
            return AdminAck(messages.NO_CALL_GUARD, ok=False)
        return AdminAck(messages.reopen_ack(circuit, await self._calls.reopen(circuit)))

    async def set(self, room: str, field: str, value: str, *, thread_id: str | None = None) -> str:
        """Store one runtime override for the room once the resulting policy validates."""
        return (await self._set(room, field, value, thread_id)).text

    async def _set(self, room: str, field: str, raw: str, thread_id: str | None) -> AdminAck:
        problem = _field_problem(field)
        if problem is not None:
            return AdminAck(messages.set_refused(field, problem), ok=False)
        try:
            value = _parse_value(raw)
        except _RefusedValue as exc:
            return AdminAck(messages.set_refused(field, str(exc)), ok=False)
        current = await self.effective_policy(room, thread_id=thread_id)
        try:
            with_override(current, field, value)
        except ValidationError as exc:
            return AdminAck(messages.set_refused(field, first_error(exc)[1]), ok=False)
        await self._state.set_override(self._links.scope(room), field, value)
        return AdminAck(messages.set_ack(field, value))

    async def effective_policy(self, room: str, *, thread_id: str | None = None) -> Policy:
        """Defaults, channel rule, then global and room overrides: the pipeline's resolution."""
        platform, channel = split_room(room)
        resolved = await self.policies.room(self._state, platform, channel, thread_id)
        return resolved.policy


def split_room(room: str) -> tuple[str, str]:
    """`discord:1100123` → ("discord", "1100123")."""
    platform, _, channel = room.partition(":")
    return platform, channel


def _field_problem(dotted: str) -> str | None:
    """Why `dotted` is not a settable leaf field of Policy, or None when it is."""
    model: type[BaseModel] = Policy
    parts = dotted.split(".")
    for depth, part in enumerate(parts):
        last = depth == len(parts) - 1
        if model is ToolLoopSettings:
            known = _leaf_names(model)
            return None if last and part in known else messages.unknown_field(known)
        fields = model.model_fields
        if part not in fields:
            return messages.unknown_field(list(fields))
        nested = _model_of(fields[part].annotation)
        if nested is None:
            return None if last else messages.unknown_field(list(fields))
        if last:
            return messages.unknown_field(_leaf_names(nested))
        model = nested
    return None


def _model_of(annotation: object) -> type[BaseModel] | None:
    # An optional section (`spend: SpendSettings | None`) is set field by field too.
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        members = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        annotation = members[0] if len(members) == 1 else annotation
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def _leaf_names(model: type[BaseModel]) -> list[str]:
    if model is ToolLoopSettings:  # its declared `mode`, then the LoopGuardConfig fields
        return [*model.model_fields, *(f.name for f in dataclasses.fields(LoopGuardConfig))]
    return list(model.model_fields)


def _parse_value(raw: str) -> object:
    """The value as YAML (`6`, `true`, `[a, b]`), the raw text when that is not YAML.

    Raises `_RefusedValue` for what no field can take: an over-long text, leading or
    trailing whitespace (`" shadow"` is no mode), YAML beyond the parser's bounds, a
    non-finite number, a number written in look-alike digits.
    """
    if len(raw) > MAX_VALUE_CHARS:
        raise _RefusedValue(messages.value_too_long(MAX_VALUE_CHARS))
    if raw != raw.strip():  # only the admin API can send it: chat splits on spaces
        raise _RefusedValue(messages.VALUE_SPACES)
    try:
        value = load_yaml(raw)
    except YamlLimitError as exc:
        raise _RefusedValue(str(exc)) from None
    except yaml.YAMLError:
        return raw
    if isinstance(value, float) and not math.isfinite(value):
        raise _RefusedValue(messages.NOT_FINITE)
    if isinstance(value, str) and not value.isascii() and _reads_as_number(fold(value)):
        raise _RefusedValue(messages.LOOKALIKE_DIGITS)
    return value if _jsonable(value) else raw


def _reads_as_number(text: str) -> bool:
    """Whether `text`, once look-alikes are folded, is a YAML number (`5`, `1.5`)."""
    try:
        value = load_yaml(text)
    except (yaml.YAMLError, YamlLimitError):
        return False
    return isinstance(value, int | float) and not isinstance(value, bool)


def _jsonable(value: object) -> bool:
    if isinstance(value, _JSON_SCALARS):
        return not isinstance(value, float) or math.isfinite(value)
    if isinstance(value, list):
        return all(_jsonable(item) for item in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _jsonable(v) for k, v in value.items())
    return False
