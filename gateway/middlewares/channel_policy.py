"""Channel policy: resolve the effective policy of the message's room, from a cache.

`ctx.policy` is `resolve_policy(config, platform, channel, thread, overrides)` with the
global (`*`) runtime overrides under the room's. Resolving validates a pydantic model, so
results are cached twice: per room (a bounded LRU keyed by platform, channel, thread and
the overrides, so the common case is one dict lookup) and per policy source (which
channel rule matched, and the overrides), so a million rooms under one rule share one
`Policy`. Each cache entry also holds the guard policies derived from it (BotLoopPolicy,
SilencePolicy), computed once; later stages find them with `PolicyCache.derived(ctx.policy)`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass

from gateway.config import Config, Policy, resolve_policy
from gateway.context import TurnContext
from gateway.pipeline import Handler
from gateway.state.base import GLOBAL_SCOPE
from gateway.types import Reply
from guards.bot_loop import BotLoopPolicy
from guards.silence import SilencePolicy

OverridesKey = tuple[tuple[str, object], ...]
_NO_RULE = -1


@dataclass(frozen=True, slots=True)
class ResolvedPolicy:
    """A channel's Policy with the guard policies derived from it."""

    policy: Policy
    bot_loop: BotLoopPolicy
    silence: SilencePolicy


def derive(policy: Policy) -> ResolvedPolicy:
    """Build the guards' policies from a validated Policy (validation built them once too)."""
    return ResolvedPolicy(
        policy=policy,
        bot_loop=policy.bot_loop.guard_policy(),
        silence=policy.silence.guard_policy(),
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
        self._by_policy: dict[int, ResolvedPolicy] = {}

    def resolve(
        self,
        platform: str,
        channel: str,
        thread: str | None,
        overrides: Mapping[str, object],
    ) -> ResolvedPolicy:
        """The room's effective policy, resolving and deriving only on a cache miss."""
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

    def derived(self, policy: Policy) -> ResolvedPolicy:
        """The guard policies of `policy` (cached when it came from `resolve`)."""
        entry = self._by_policy.get(id(policy))
        if entry is not None and entry.policy is policy:
            return entry
        return derive(policy)

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
        entry = derive(policy)
        if len(sources) >= self._max_sources:
            _, evicted = sources.popitem(last=False)
            self._by_policy.pop(id(evicted.policy), None)
        sources[source] = entry
        self._by_policy[id(policy)] = entry
        return entry

    def _rule_index(self, platform: str, channel: str, thread: str | None) -> int:
        """Which channel rule `resolve_policy` applies: the first match, as it does."""
        for index, rule in enumerate(self._config.channels):
            if rule.match.matches(platform, channel, thread):
                return index if rule.policy else _NO_RULE
        return _NO_RULE


def _overrides_key(overrides: Mapping[str, object]) -> OverridesKey:
    """A hashable, order-independent form of the overrides (lists become tuples)."""
    return tuple(sorted((field, _frozen(value)) for field, value in overrides.items()))


def _frozen(value: object) -> object:
    if isinstance(value, list | tuple):
        return tuple(_frozen(item) for item in value)
    if isinstance(value, Mapping):
        return tuple(sorted((str(k), _frozen(v)) for k, v in value.items()))
    return value


class ChannelPolicyMiddleware:
    """Sets `ctx.policy` to the room's effective policy."""

    def __init__(self, policies: PolicyCache) -> None:
        self._policies = policies

    async def __call__(self, ctx: TurnContext, call_next: Handler) -> Reply | None:
        msg = ctx.message
        state = ctx.state
        everywhere = await state.get_overrides(GLOBAL_SCOPE)
        here = await state.get_overrides(msg.room)
        overrides = {**everywhere, **here} if everywhere else here
        ctx.policy = self._policies.resolve(
            msg.platform, msg.channel_id, msg.thread_id, overrides
        ).policy
        return await call_next(ctx)
