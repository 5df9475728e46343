"""The `policy:` section and `channels:` rules, and how a room's effective policy is resolved.

Channel rules are deep-merged over `policy` when a channel's effective policy is resolved
(`gateway.config.root.resolve_policy`); the merge is validated at load time so a bad
rule fails before anything connects.

Decisions where DESIGN.md is silent:
- A policy is valid only when the guards can run with it: validating `bot_loop`,
  `silence`, `tool_loop` and `call_loop` builds their BotLoopPolicy, SilencePolicy,
  LoopGuardConfig and CallLoopPolicy (the stages and agents use the same `guard_policy()`
  / `guard_config()` / `policy()`), so the config, a channel rule, `/loop set` and the
  admin API all refuse the same values. `tool_loop` refuses unknown keys like every other
  section. The guards' counts (`bot_loop.max_events_per_window`, `max_consecutive_bot_turns`,
  `room_max_events_per_window`, `call_loop.max_repeats`) are at most a million
  (`gateway.config.limits.MAX_COUNT`); `room_max_events_per_window` 0 turns the room budget off.
- A stored runtime override that today's policy refuses is ignored with a warning by
  `resolve_policy`: the room keeps working on the config's value for that field.
- `bot_loop`, `tool_loop` and `call_loop` take `mode: enforce | shadow` (DESIGN.md §5),
  exactly those words (`gateway.config.limits.Mode`), in the config, a channel rule or `/loop set`.
- `policy.spend` (`gateway.agents.spend`) is optional: without it the `openai` agents' calls
  have no limit. Its limits are bounded as `proxy.budgets`' are (`gateway.config.limits`), it
  needs `limit_usd`, `limit_tokens` or both, and `per` lists `room` and/or `bot` once each.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Mapping
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    model_validator,
)

from gateway.calls.budgets import Budget, Period
from gateway.config.base import UNKNOWN_FIELD, FieldError, Frozen, first_error
from gateway.config.call_loop import CallLoopSettings
from gateway.config.limits import MAX_COUNT, MAX_TOKENS, MAX_USD, Duration, Mode
from gateway.config.proxy import TimeZone, budget_limits, distinct
from guards.bot_loop import BotLoopPolicy
from guards.loop_guard import LoopGuardConfig
from guards.silence import SilencePolicy

Respond = Literal["all", "mentions", "none"]


class RespondToPolicy(Frozen):
    """Who a bot answers: `all`, only when addressed (`mentions`), or `none`."""

    humans: Respond = "all"
    bots: Respond = "all"


class BotLoopSettings(Frozen):
    """Pair and room budgets, cooldown, the consecutive-bot-turn cap and the cooldown notice."""

    enabled: bool = True
    max_events_per_window: int = Field(default=20, ge=1, le=MAX_COUNT)
    window_seconds: Duration = Field(default=60.0, gt=0)
    cooldown_seconds: Duration = Field(default=60.0, ge=0)
    max_consecutive_bot_turns: int = Field(default=30, ge=0, le=MAX_COUNT)
    room_max_events_per_window: int = Field(default=20, ge=0, le=MAX_COUNT)
    room_window_seconds: Duration = Field(default=90.0, gt=0)
    announce_cooldown: bool = True
    mode: Mode = "enforce"

    @model_validator(mode="after")
    def _guard_runs(self) -> BotLoopSettings:
        self.guard_policy()
        return self

    def guard_policy(self) -> BotLoopPolicy:
        """The bot-loop guard's policy, as the bot-loop stage runs it."""
        return BotLoopPolicy(
            enabled=self.enabled,
            max_events_per_window=self.max_events_per_window,
            window_seconds=self.window_seconds,
            cooldown_seconds=self.cooldown_seconds,
            room_max_events_per_window=self.room_max_events_per_window,
            room_window_seconds=self.room_window_seconds,
        )


class SilenceSettings(Frozen):
    """Silence tokens and what to do when an addressed human gets silence."""

    enabled: bool = True
    tokens: tuple[str, ...] = ("NO_REPLY",)
    strip_trailing: bool = True
    drop_narration: bool = True
    on_addressed_human_turn: Literal["notice", "silent"] = "notice"

    @model_validator(mode="after")
    def _guard_runs(self) -> SilenceSettings:
        try:
            self.guard_policy()
        except ValueError as exc:
            raise FieldError("tokens", str(exc)) from None
        return self

    def guard_policy(self) -> SilencePolicy:
        """The silence filter's policy, as the silence stage runs it."""
        return SilencePolicy(
            tokens=self.tokens,
            strip_trailing=self.strip_trailing,
            drop_narration=self.drop_narration,
        )


# Each LoopGuardConfig field is read as pydantic reads the type of its default (ASCII digits
# only; its one float, max_time_per_turn, as a bounded duration), so the guard's lenient
# parsing never sees a look-alike digit, inf or a year-long turn.
_LOOP_GUARD_FIELDS: dict[str, TypeAdapter[object]] = {
    spec.name: TypeAdapter(Duration if type(spec.default) is float else type(spec.default))
    for spec in dataclasses.fields(LoopGuardConfig)
}


class ToolLoopSettings(Frozen):
    """LoopGuardConfig fields, each typed and bounded, checked by building the guard's config.

    Besides them, `mode` (enforce or shadow), which the agents read and the guard never sees.
    """

    model_config = ConfigDict(frozen=True, extra="allow")

    mode: Mode = "enforce"

    @model_validator(mode="before")
    @classmethod
    def _known_typed_fields(cls, data: object) -> object:
        if not isinstance(data, Mapping):
            return data
        typed: dict[str, object] = {}
        for key, value in data.items():
            if key in cls.model_fields:  # `mode`: declared here, validated by pydantic
                typed[key] = value
                continue
            adapter = _LOOP_GUARD_FIELDS.get(str(key))
            if adapter is None:
                raise FieldError(str(key), UNKNOWN_FIELD)
            try:
                typed[str(key)] = adapter.validate_python(value)
            except ValidationError as exc:
                raise FieldError(str(key), first_error(exc)[1]) from None
        return typed

    @model_validator(mode="after")
    def _guard_runs(self) -> ToolLoopSettings:
        self.guard_config()
        return self

    def guard_config(self) -> LoopGuardConfig:
        """The tool-call guard's config, as the agents run it."""
        return LoopGuardConfig.from_dict(self.model_extra)


SpendPer = Literal["room", "bot"]
"""What a `policy.spend` budget counts apart: each room (`platform:channel`), each bot."""


class SpendSettings(Frozen):
    """What the `openai` agents may spend per room or per bot and period (gateway.agents.spend)."""

    limit_usd: float | None = Field(default=None, ge=0, le=MAX_USD)
    limit_tokens: int | None = Field(default=None, ge=0, le=MAX_TOKENS)
    period: Period = "day"
    per: Annotated[tuple[SpendPer, ...], AfterValidator(distinct)] = ("room",)
    timezone: TimeZone = "UTC"
    mode: Mode = "enforce"

    @model_validator(mode="after")
    def _has_a_limit(self) -> SpendSettings:
        budget_limits(self.limit_usd, self.limit_tokens)
        return self

    def budget(self) -> Budget:
        """The budget the call store steps over, named apart from every `proxy.budgets` one.

        The name holds `per`, the period and the zone (`gateway:room:day:UTC`): a `:` is in
        no proxy budget's name, and rooms whose settings agree share a bot's counter.
        """
        per = "+".join(self.per) or "all"
        return Budget(
            f"gateway:{per}:{self.period}:{self.timezone}",
            self.per,
            budget_limits(self.limit_usd, self.limit_tokens),
            self.period,
        )


class Policy(Frozen):
    """The effective policy of a channel (`spend`: None, the agents' calls have no limit)."""

    respond_to: RespondToPolicy = RespondToPolicy()
    bot_loop: BotLoopSettings = BotLoopSettings()
    silence: SilenceSettings = SilenceSettings()
    tool_loop: ToolLoopSettings = ToolLoopSettings()
    call_loop: CallLoopSettings = CallLoopSettings()
    spend: SpendSettings | None = None


class ChannelMatch(Frozen):
    """Which channels a rule applies to: platform, channel glob, optional thread glob."""

    platform: str | None = None
    channel: str = "*"
    thread: str | None = None

    def matches(self, platform: str, channel: str, thread: str | None) -> bool:
        """True when this rule covers the given room (globs with fnmatch, case-sensitive)."""
        if self.platform is not None and self.platform != platform:
            return False
        if not fnmatch.fnmatchcase(channel, self.channel):
            return False
        return self.thread is None or (
            thread is not None and fnmatch.fnmatchcase(thread, self.thread)
        )


class ChannelRule(Frozen):
    """A per-channel policy: a partial policy deep-merged over the defaults."""

    match: ChannelMatch = ChannelMatch()
    policy: dict[str, object] = Field(default_factory=dict)


def deep_merge(base: Mapping[str, object], override: Mapping[str, object]) -> dict[str, object]:
    """Merge `override` into a copy of `base`, recursing into nested mappings."""
    merged = dict(base)
    for key, value in override.items():
        current = merged.get(key)
        if isinstance(current, Mapping) and isinstance(value, Mapping):
            merged[key] = deep_merge(current, value)
        else:
            merged[key] = value
    return merged


def with_override(policy: Policy, dotted: str, value: object) -> Policy:
    """`policy` with one dotted field set, validated (ValidationError when refused)."""
    return Policy.model_validate(deep_merge(policy.model_dump(), nest(dotted, value)))


def nest(dotted: str, value: object) -> dict[str, object]:
    """`a.b.c`, v → {"a": {"b": {"c": v}}}."""
    nested: dict[str, object] = {}
    node = nested
    *parents, leaf = dotted.split(".")
    for part in parents:
        child: dict[str, object] = {}
        node[part] = child
        node = child
    node[leaf] = value
    return nested
