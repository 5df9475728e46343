"""`Config`: the whole file, its sections, and what holds across them.

A bot's `agent` names a defined agent, bot ids are unique, and every channel rule merged
over `policy` is a valid policy (so a bad rule fails at load time, naming
`channels.<n>.policy.<field>`). `resolve_policy` gives a room's effective policy: the
defaults, then the first matching channel rule, then the stored runtime overrides (one
that today's policy refuses is ignored with a warning: the room keeps the config's value).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from functools import cached_property

from pydantic import Field, ValidationError, model_validator

from gateway.config.agents import AgentConfig
from gateway.config.base import FieldError, Frozen, first_error
from gateway.config.bots import AdminsConfig, BotConfig
from gateway.config.http import HttpConfig
from gateway.config.links import Links, RoomLinks, check_links
from gateway.config.pipeline import PipelineConfig
from gateway.config.policy import ChannelRule, Policy, deep_merge, nest, with_override
from gateway.config.proxy import ProxyConfig
from gateway.config.state import StateConfig
from gateway.config.telemetry import TelemetryConfig

log = logging.getLogger("loopwarden.config")


class Config(Frozen):
    """The whole gateway configuration."""

    state: StateConfig = StateConfig()
    http: HttpConfig = HttpConfig()
    agents: dict[str, AgentConfig] = Field(default_factory=dict)
    bots: tuple[BotConfig, ...] = ()
    admins: AdminsConfig = AdminsConfig()
    policy: Policy = Policy()
    channels: tuple[ChannelRule, ...] = ()
    pipeline: PipelineConfig = PipelineConfig()
    proxy: ProxyConfig | None = None
    telemetry: TelemetryConfig = TelemetryConfig()
    links: Links = ()

    @model_validator(mode="after")
    def _cross_references(self) -> Config:
        seen: set[str] = set()
        for index, bot in enumerate(self.bots):
            if bot.id in seen:
                raise FieldError(f"bots.{index}.id", f"duplicate bot id {bot.id!r}")
            seen.add(bot.id)
            if bot.agent not in self.agents:
                known = ", ".join(sorted(self.agents)) or "none defined"
                raise FieldError(
                    f"bots.{index}.agent",
                    f"unknown agent {bot.agent!r} (agents: {known}); define it under agents:",
                )
        base = self.policy.model_dump()
        for index, rule in enumerate(self.channels):
            try:
                Policy.model_validate(deep_merge(base, rule.policy))
            except ValidationError as exc:
                path, reason = first_error(exc)
                raise FieldError(f"channels.{index}.policy.{path}", reason) from None
        check_links(self.links)
        return self

    @cached_property
    def room_links(self) -> RoomLinks:
        """Each room's scope and linked rooms, from `links:` (built once)."""
        return RoomLinks.of(self.links)

    def bot(self, bot_id: str) -> BotConfig:
        """The bot with this id (KeyError when absent)."""
        for bot in self.bots:
            if bot.id == bot_id:
                return bot
        raise KeyError(bot_id)


def resolve_policy(
    config: Config,
    platform: str,
    channel: str,
    thread: str | None = None,
    overrides: Mapping[str, object] | None = None,
) -> Policy:
    """Defaults, then the first matching channel rule, then the dotted runtime overrides.

    An override the policy refuses (stored before a bound existed, or valid only under an
    older config) is left out with a warning, so the room runs on the config's policy for
    that field instead of every message failing; `/loop set` of the field replaces it.
    """
    layer: dict[str, object] = {}
    for rule in config.channels:
        if rule.match.matches(platform, channel, thread):
            layer = rule.policy
            break
    if not layer and not overrides:
        return config.policy
    merged = deep_merge(config.policy.model_dump(), layer)
    if not overrides:
        return Policy.model_validate(merged)
    everything = merged
    for dotted, value in overrides.items():
        everything = deep_merge(everything, nest(dotted, value))
    try:
        return Policy.model_validate(everything)
    except ValidationError:
        pass
    policy = Policy.model_validate(merged)
    for dotted, value in overrides.items():
        try:
            policy = with_override(policy, dotted, value)
        except ValidationError as exc:
            log.warning(
                "ignoring the stored override %s in %s:%s, the policy refuses it (%s); "
                "set it again to replace it",
                dotted,
                platform,
                channel,
                first_error(exc)[1],
            )
    return policy
