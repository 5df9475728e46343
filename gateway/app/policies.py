"""A room's effective policy, resolved once per (room, overrides) with its guard policies.

`PolicyCache.room(state, platform, channel, thread)` is the one resolution: the global
(`*`) runtime overrides with the room's on top (`merged`), then `resolve_policy(config,
platform, channel, thread, overrides)`. The channel-policy stage sets its answer on the turn
(`ctx.resolved`), and `AdminService.effective_policy` answers `status`, `policy` and
`set` from the same cache, so chat commands and the pipeline never disagree.

Resolving validates a pydantic model, so results are cached twice: per room (a bounded
LRU keyed by platform, channel, thread and the overrides, so the common case is one dict
lookup) and per policy source (which channel rule matched, and the overrides), so a
million rooms under one rule share one `ResolvedPolicy`. The overrides are part of both
keys: a `/loop set` gives the room a new entry, never a stale one. Each entry holds the
guard policies derived from the Policy (BotLoopPolicy, SilencePolicy, LoopGuardConfig,
CallLoopPolicy) and which of the guards run in shadow mode, built once, so no stage or
agent derives or looks them up again.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gateway.config import Config, Policy, resolve_policy
from gateway.state.base import GLOBAL_SCOPE
from guards.bot_loop import BotLoopPolicy
from guards.call_loop import CallLoopPolicy
from guards.loop_guard import LoopGuardConfig
from guards.silence import SilencePolicy

if TYPE_CHECKING:
    from gateway.state.base import ControlStore

OverridesKey = tuple[tuple[str, object], ...]
_NO_RULE = -1


@dataclass(frozen=True, slots=True)
class ResolvedPolicy:
    """A room's Policy with the guard policies derived from it and the guards' modes.

    `*_shadow` is True when that guard runs in shadow mode: it decides as in enforce, and
    what it would refuse goes on (the silence filter has no shadow mode).
    """

    policy: Policy
    bot_loop: BotLoopPolicy
    silence: SilencePolicy
    tool_loop: LoopGuardConfig
    call_loop: CallLoopPolicy
    bot_loop_shadow: bool
    tool_loop_shadow: bool
    call_loop_shadow: bool

    @classmethod
    def derive(cls, policy: Policy) -> ResolvedPolicy:
        """Build the guards' policies from a validated Policy (validation built them once too)."""
        return cls(
            policy=policy,
            bot_loop=policy.bot_loop.guard_policy(),
            silence=policy.silence.guard_policy(),
            tool_loop=policy.tool_loop.guard_config(),
            call_loop=policy.call_loop.policy(),
            bot_loop_shadow=policy.bot_loop.mode == "shadow",
            tool_loop_shadow=policy.tool_loop.mode == "shadow",
            call_loop_shadow=policy.call_loop.mode == "shadow",
        )


class PolicyCache:
    """Effective policies by room and by source, each bounded (least recently used goes)."""

    def __init__(self, config: Config, *, max_rooms: int = 10_000, max_sources: int = 1_000):
        self._config = config
        self._max_rooms = max_rooms
        self._max_sources = max_sources
        self._rooms: OrderedDict[tuple[str, str, str | None, OverridesKey], ResolvedPolicy] = (
            OrderedDict()
        )
        self._sources: OrderedDict[tuple[int, OverridesKey], ResolvedPolicy] = OrderedDict()

    async def room(
        self, state: ControlStore, platform: str, channel: str, thread: str | None
    ) -> ResolvedPolicy:
        """The room's effective policy under the overrides stored now (global, then room's).

        A linked room's overrides are its link's (`RoomLinks.scope`).
        """
        everywhere = await state.get_overrides(GLOBAL_SCOPE)
        here = await state.get_overrides(self._config.room_links.scope(f"{platform}:{channel}"))
        return self.resolve(platform, channel, thread, merged(everywhere, here))

    def resolve(
        self,
        platform: str,
        channel: str,
        thread: str | None,
        overrides: Mapping[str, object],
    ) -> ResolvedPolicy:
        """The effective policy under `overrides`, resolving and deriving only on a cache miss."""
        okey = _overrides_key(overrides) if overrides else ()
        key = (platform, channel, thread, okey)
        rooms = self._rooms
        entry = rooms.get(key)
        if entry is not None:
            rooms.move_to_end(key)
            return entry
        entry = self._by_source(platform, channel, thread, overrides, okey)
        if len(rooms) >= self._max_rooms:
            rooms.popitem(last=False)
        rooms[key] = entry
        return entry

    def _by_source(
        self,
        platform: str,
        channel: str,
        thread: str | None,
        overrides: Mapping[str, object],
        okey: OverridesKey,
    ) -> ResolvedPolicy:
        source = (self._rule_index(platform, channel, thread), okey)
        sources = self._sources
        entry = sources.get(source)
        if entry is not None:
            sources.move_to_end(source)
            return entry
        policy = resolve_policy(self._config, platform, channel, thread, overrides or None)
        entry = ResolvedPolicy.derive(policy)
        if len(sources) >= self._max_sources:
            sources.popitem(last=False)
        sources[source] = entry
        return entry

    def _rule_index(self, platform: str, channel: str, thread: str | None) -> int:
        """Which channel rule `resolve_policy` applies: the first match, as it does."""
        for index, rule in enumerate(self._config.channels):
            if rule.match.matches(platform, channel, thread):
                return index if rule.policy else _NO_RULE
        return _NO_RULE


def merged(everywhere: Mapping[str, object], here: Mapping[str, object]) -> Mapping[str, object]:
    """The global (`*`) runtime overrides with the room's on top."""
    return {**everywhere, **here} if everywhere else here


def _overrides_key(overrides: Mapping[str, object]) -> OverridesKey:
    """A hashable, order-independent form of the overrides (lists become tuples)."""
    return tuple(sorted((field, _frozen(value)) for field, value in overrides.items()))


def _frozen(value: object) -> object:
    if isinstance(value, list | tuple):
        return tuple(_frozen(item) for item in value)
    if isinstance(value, Mapping):
        return tuple(sorted((str(k), _frozen(v)) for k, v in value.items()))
    return value
