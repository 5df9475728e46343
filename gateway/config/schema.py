"""The configuration contract: one YAML file, `${VAR}` interpolation, validated once.

`load_config(path)` returns a frozen `Config` or raises `ConfigError` whose path names
the field (`bots.0.token`) and whose reason says how to fix it. Secrets are `SecretStr`
and never printed. Channel rules are deep-merged over `policy` when a channel's
effective policy is resolved (`resolve_policy`); the merge is validated at load time so
a bad rule fails before anything connects.

Decisions where DESIGN.md is silent:
- A policy is valid only when the guards can run with it: validating `bot_loop`,
  `silence`, `tool_loop` and `call_loop` builds their BotLoopPolicy, SilencePolicy,
  LoopGuardConfig and CallLoopPolicy (the stages and agents use the same `guard_policy()`
  / `guard_config()`), so the config, a channel rule, `/loop set` and the admin API all
  refuse the same values. `tool_loop` refuses unknown keys like every other section.
  The guards' counts (`bot_loop.max_events_per_window`, `max_consecutive_bot_turns`,
  `room_max_events_per_window`, `call_loop.max_repeats`) are at most a million
  (`gateway.config.limits.MAX_COUNT`); `room_max_events_per_window` 0 turns the room budget off.
- No number is inf or nan; every duration is at most 366 days and chosen secrets
  (`http.admin_token`, a Telegram `webhook_secret`, an `http` agent's `secret`) at least
  16 characters (`gateway.config.limits`). The file must be UTF-8 and stay within
  `gateway.config.safeyaml`'s bounds (nesting, alias expansion, digits); such errors name the file.
- A stored runtime override that today's policy refuses is ignored with a warning by
  `resolve_policy`: the room keeps working on the config's value for that field.
- `bot_loop`, `tool_loop` and `call_loop` take `mode: enforce | shadow` (DESIGN.md §5),
  exactly those words (`gateway.config.limits.Mode`), in the config, a channel rule or `/loop set`.
- `http.console_session_hours` (default 12) is more than 0 and at most 366 days of hours;
  it is the proxy's console's too. `http.public_url` (and `proxy.public_url`) is where
  browsers reach the server (`gateway.config.urls`); https there makes the console's
  cookie Secure.
- `http.trusted_proxies` (the gateway's and the proxy's) lists the reverse proxies whose
  `X-Forwarded-For` names the client the console's sign-in limiter counts
  (`gateway.admin.console.clients`).
- `pipeline.transcript` (`max_messages` 0 switches room memory off, `ttl` in seconds or
  `7d`) and every agent's `history` (`max_messages` 0: no history) are bounded by
  `gateway.config.limits` (DESIGN.md §3; `gateway.app.middlewares.transcript`).
- `state.max_transcript_bytes` (default 32 MiB, from 64 KiB to 64 GiB, a whole number)
  is what the memory backend's transcripts may hold in all (`gateway.state.memory_transcripts`);
  sqlite and redis keep theirs outside the process and ignore it.
- `policy.spend` (`gateway.agents.spend`) is optional: without it the `openai` agents' calls
  have no limit. Its limits are bounded as `proxy.budgets`' are (`gateway.config.limits`), it
  needs `limit_usd`, `limit_tokens` or both, and `per` lists `room` and/or `bot` once each.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from gateway.app.errors import ConfigError
from gateway.calls.budgets import Budget, Period
from gateway.config.limits import (
    DEFAULT_SESSION_HOURS,
    DEFAULT_TRANSCRIPT_BYTES,
    MAX_COUNT,
    MAX_TOKENS,
    MAX_TRANSCRIPT_BYTES,
    MAX_TRANSCRIPT_MESSAGES,
    MAX_USD,
    MIN_TRANSCRIPT_BYTES,
    Duration,
    DurationText,
    Mode,
    long_enough,
)
from gateway.config.proxy import ProxyConfig, TimeZone, budget_limits, distinct
from gateway.config.safeyaml import YamlLimitError, load_yaml
from gateway.config.urls import PublicUrl, TrustedProxies, http_url
from guards.bot_loop import BotLoopPolicy
from guards.call_loop import CallLoopPolicy
from guards.loop_guard import LoopGuardConfig
from guards.silence import SilencePolicy

log = logging.getLogger("loopwarden.config")

Respond = Literal["all", "mentions", "none"]


def _required_secret(value: SecretStr) -> SecretStr:
    if not value.get_secret_value():
        raise ValueError("must not be empty (is its environment variable set?)")
    return value


def _empty_is_none(value: object) -> object:
    return None if value in ("", None) else value


Token = Annotated[SecretStr, AfterValidator(_required_secret)]
"""A secret that must be given: an empty value (`${VAR:-}` unset) is an error."""

OptionalSecret = Annotated[SecretStr | None, BeforeValidator(_empty_is_none)]
"""A secret that may be left out: an empty value (`${VAR:-}` unset) means not set."""

ChosenSecret = Annotated[OptionalSecret, AfterValidator(long_enough)]
"""An optional secret the operator makes up (not a platform's token): 16 characters or more."""


class _Frozen(BaseModel):
    # No float field anywhere takes inf or nan: a guard cannot run with either.
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class StateConfig(_Frozen):
    """Where budgets, cooldowns and receipts live; `max_transcript_bytes` is memory's only."""

    backend: Literal["memory", "sqlite", "redis"] = "memory"
    path: str = "loopwarden.sqlite3"
    url: SecretStr = SecretStr("redis://127.0.0.1:6379/0")
    on_error: Literal["allow", "deny"] = "allow"
    key_prefix: str = "lw:"
    max_transcript_bytes: int = Field(
        default=DEFAULT_TRANSCRIPT_BYTES, ge=MIN_TRANSCRIPT_BYTES, le=MAX_TRANSCRIPT_BYTES
    )


MAX_SESSION_HOURS = 366 * 24
"""The longest console session: the bound every other duration has (`gateway.config.limits`)."""


class HttpConfig(_Frozen):
    """The gateway's own aiohttp server: health, metrics, webhooks, admin API, console, room."""

    host: str = "127.0.0.1"
    port: int = Field(default=8787, ge=0, le=65535)
    admin_token: ChosenSecret = None
    console_session_hours: float = Field(default=DEFAULT_SESSION_HOURS, gt=0, le=MAX_SESSION_HOURS)
    public_url: PublicUrl = None
    trusted_proxies: TrustedProxies = ()


class HistoryConfig(_Frozen):
    """How much of the room's transcript an agent's turn gets: the newest, within both."""

    max_messages: int = Field(default=40, ge=0, le=MAX_TRANSCRIPT_MESSAGES)
    max_tokens: int = Field(default=6_000, ge=0, le=MAX_TOKENS)


class ScriptedRule(_Frozen):
    """`match` is a regex tried with `re.search`; `reply` a template with {text} and {sender}."""

    match: str
    reply: str

    @field_validator("match")
    @classmethod
    def _compiles(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a valid regular expression ({exc})") from exc
        return value


class ScriptedAgentConfig(_Frozen):
    """Deterministic regex rules; first match wins, else `default` (None: stay silent)."""

    kind: Literal["scripted"]
    rules: tuple[ScriptedRule, ...] = ()
    default: str | None = None
    delay: Duration = Field(default=0.0, ge=0)
    history: HistoryConfig = HistoryConfig()


class PythonAgentConfig(_Frozen):
    """`function` is `module:function`, called with the turn, returning text (or None)."""

    kind: Literal["python"]
    function: str = Field(pattern=r"^[\w.]+:[\w]+$")
    history: HistoryConfig = HistoryConfig()


MCP_SERVER_NAME_MAX = 32
"""Leaves at least 30 of an OpenAI function name's 64 characters for the tool's own name."""

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


class McpServerConfig(_Frozen):
    """An MCP server of an `openai` agent: a stdio `command` to start or a streamable-HTTP `url`."""

    name: str
    command: tuple[str, ...] | None = None
    env: dict[str, SecretStr] = Field(default_factory=dict)
    url: str | None = None
    headers: dict[str, SecretStr] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _prefix(cls, value: str) -> str:
        if not re.fullmatch(rf"[A-Za-z0-9_-]{{1,{MCP_SERVER_NAME_MAX}}}", value):
            raise ValueError(
                f"must be 1 to {MCP_SERVER_NAME_MAX} ASCII letters, digits, '-' or '_' "
                "(it prefixes the tool names offered to the model)"
            )
        if "__" in value or value.startswith("_") or value.endswith("_"):
            raise ValueError(
                "must not contain '__' nor start or end with '_' "
                "('__' separates server and tool in <server>__<tool>)"
            )
        return value

    @field_validator("command")
    @classmethod
    def _program(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if value is not None and (not value or not value[0].strip()):
            raise ValueError("must start with the program to run, e.g. [uvx, mcp-server-time]")
        if value is not None and any("\x00" in part for part in value):
            raise ValueError("must not contain NUL characters")
        return value

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, SecretStr]) -> dict[str, SecretStr]:
        for key, secret in value.items():
            if not _ENV_NAME.fullmatch(key):
                raise ValueError(f"{key[:40]!r} is not an environment variable name")
            if "\x00" in secret.get_secret_value():
                raise ValueError(f"the value of {key} must not contain NUL characters")
        return value

    @field_validator("url")
    @classmethod
    def _endpoint(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if urlsplit(http_url(value)).username is not None:
            raise ValueError("must not carry credentials: send them in headers")
        return value

    @field_validator("headers")
    @classmethod
    def _header_lines(cls, value: dict[str, SecretStr]) -> dict[str, SecretStr]:
        for key, secret in value.items():
            if not _HEADER_NAME.fullmatch(key):
                raise ValueError(f"{key[:40]!r} is not an HTTP header name")
            if any(char in secret.get_secret_value() for char in "\r\n\x00"):
                raise ValueError(f"the value of {key} must not contain line breaks or NUL")
        return value

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerConfig:
        if self.command is None and self.url is None:
            raise _FieldError(
                "command", "give command (a stdio server to start) or url (a streamable-HTTP one)"
            )
        if self.command is not None and self.url is not None:
            raise _FieldError("url", "give either command (stdio) or url (HTTP), not both")
        if self.env and self.command is None:
            raise _FieldError("env", "env is for stdio servers (command); send headers to a url")
        if self.headers and self.url is None:
            raise _FieldError("headers", "headers are for HTTP servers (url); give a command env")
        return self


class OpenAIAgentConfig(_Frozen):
    """Any OpenAI-compatible chat-completions endpoint, with tools as `module:function`."""

    kind: Literal["openai"]
    base_url: str = "https://api.openai.com/v1"
    model: str
    api_key: OptionalSecret = None
    system_prompt: str | None = None
    tools: tuple[str, ...] = ()
    max_tool_rounds: int = Field(default=8, ge=1)
    timeout: Duration = Field(default=60.0, gt=0)
    temperature: float | None = None
    mcp_servers: tuple[McpServerConfig, ...] = ()
    stream: bool = False
    stream_edit_seconds: Duration = Field(default=1.0, gt=0)
    history: HistoryConfig = HistoryConfig()

    @field_validator("tools")
    @classmethod
    def _tool_refs(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for ref in value:
            if not re.fullmatch(r"[\w.]+:[\w]+", ref):
                raise ValueError(f"tool {ref!r} must be written module:function")
        return value

    @model_validator(mode="after")
    def _mcp_names_apart(self) -> OpenAIAgentConfig:
        seen: set[str] = set()
        for index, server in enumerate(self.mcp_servers):
            if server.name in seen:
                raise _FieldError(
                    f"mcp_servers.{index}.name", f"duplicate MCP server name {server.name!r}"
                )
            seen.add(server.name)
            for tool_index, ref in enumerate(self.tools):
                if ref.partition(":")[2].startswith(f"{server.name}__"):
                    raise _FieldError(
                        f"tools.{tool_index}",
                        f"the name is taken by MCP server {server.name!r}'s tools; rename it",
                    )
        return self


MAX_HTTP_ATTEMPTS = 10
"""The most `max_attempts` an `http` agent takes: every attempt may wait `timeout`, in one turn."""


class HttpAgentConfig(_Frozen):
    """Any service that answers a signed JSON POST of the turn (`gateway.agents.http`)."""

    kind: Literal["http"]
    url: Annotated[str, AfterValidator(http_url)]
    secret: Annotated[Token, AfterValidator(long_enough)]
    timeout: Duration = Field(default=30.0, gt=0)
    max_attempts: int = Field(default=3, ge=1, le=MAX_HTTP_ATTEMPTS)
    history: HistoryConfig = HistoryConfig()


AgentConfig = Annotated[
    ScriptedAgentConfig | PythonAgentConfig | OpenAIAgentConfig | HttpAgentConfig,
    Field(discriminator="kind"),
]


class _BotBase(_Frozen):
    id: str = Field(min_length=1, pattern=r"^[\w.-]+$")
    agent: str

    @property
    def display_name(self) -> str:
        """How the gateway's notices name this bot: its config id."""
        return self.id


class DiscordBotConfig(_BotBase):
    """A Discord bot: a bot token, the REST base and (optionally) the gateway URL."""

    platform: Literal["discord"]
    token: Token
    api_base_url: str = "https://discord.com/api/v10"
    gateway_url: str | None = None
    reply_in_thread: bool = False


class TelegramBotConfig(_BotBase):
    """A Telegram bot: long polling by default, or a webhook on the gateway's server."""

    platform: Literal["telegram"]
    token: Token
    api_base_url: str = "https://api.telegram.org"
    mode: Literal["polling", "webhook"] = "polling"
    webhook_url: str | None = None
    webhook_secret: ChosenSecret = None
    poll_timeout: Duration = Field(default=10.0, ge=0)

    @model_validator(mode="after")
    def _webhook_needs_secret(self) -> TelegramBotConfig:
        if self.mode == "webhook" and self.webhook_secret is None:
            raise _FieldError(
                "webhook_secret",
                "required with mode: webhook (Telegram sends it back in "
                "X-Telegram-Bot-Api-Secret-Token so forged updates can be refused)",
            )
        return self


class SlackBotConfig(_BotBase):
    """A Slack app: Socket Mode with `app_token`, else the Events API on our HTTP server."""

    platform: Literal["slack"]
    bot_token: Token
    signing_secret: OptionalSecret = None
    app_token: OptionalSecret = None
    api_base_url: str = "https://slack.com/api/"

    @model_validator(mode="after")
    def _one_mode(self) -> SlackBotConfig:
        if self.app_token is None and self.signing_secret is None:
            raise _FieldError(
                "signing_secret",
                "required unless app_token is set (Events API requests "
                "are verified with it; Socket Mode needs app_token instead)",
            )
        return self


class RoomBotConfig(_BotBase):
    """A bot in the embedded local web room (the demo platform)."""

    platform: Literal["room"]
    name: str | None = None

    @property
    def display_name(self) -> str:
        """Its name in the room when it has one, else its config id."""
        return self.name or self.id


BotConfig = Annotated[
    DiscordBotConfig | TelegramBotConfig | SlackBotConfig | RoomBotConfig,
    Field(discriminator="platform"),
]


class AdminsConfig(_Frozen):
    """Platform user ids allowed to run `/loop` commands, per platform."""

    discord: tuple[str, ...] = ()
    telegram: tuple[str, ...] = ()
    slack: tuple[str, ...] = ()
    room: tuple[str, ...] = ()

    @field_validator("discord", "telegram", "slack", "room", mode="before")
    @classmethod
    def _ids_as_text(cls, value: object) -> object:
        if isinstance(value, list | tuple):
            return tuple(str(v) for v in value)
        return value

    def for_platform(self, platform: str) -> tuple[str, ...]:
        """The admin ids of one platform (none for an unknown platform)."""
        ids: tuple[str, ...] = getattr(self, platform, ())
        return ids


class RespondToPolicy(_Frozen):
    """Who a bot answers: `all`, only when addressed (`mentions`), or `none`."""

    humans: Respond = "all"
    bots: Respond = "all"


class BotLoopSettings(_Frozen):
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


class SilenceSettings(_Frozen):
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
            raise _FieldError("tokens", str(exc)) from None
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
_UNKNOWN_FIELD = "unknown field (check the spelling; see the README's config reference)"


class ToolLoopSettings(_Frozen):
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
                raise _FieldError(str(key), _UNKNOWN_FIELD)
            try:
                typed[str(key)] = adapter.validate_python(value)
            except ValidationError as exc:
                raise _FieldError(str(key), first_error(exc)[1]) from None
        return typed

    @model_validator(mode="after")
    def _guard_runs(self) -> ToolLoopSettings:
        self.guard_config()
        return self

    def guard_config(self) -> LoopGuardConfig:
        """The tool-call guard's config, as the agents run it."""
        return LoopGuardConfig.from_dict(self.model_extra)


class CallLoopSettings(_Frozen):
    """Identical LLM calls an `openai` agent may send per window in a room, and the pause after."""

    max_repeats: int = Field(default=5, ge=1, le=MAX_COUNT)
    window_seconds: Duration = Field(default=60.0, gt=0)
    pause_seconds: Duration = Field(default=300.0, ge=0)
    mode: Mode = "enforce"

    @model_validator(mode="after")
    def _guard_runs(self) -> CallLoopSettings:
        self.guard_policy()
        return self

    def guard_policy(self) -> CallLoopPolicy:
        """The call-loop guard's policy, as the `openai` agents run it."""
        return CallLoopPolicy(self.max_repeats, self.window_seconds, self.pause_seconds)


SpendPer = Literal["room", "bot"]
"""What a `policy.spend` budget counts apart: each room (`platform:channel`), each bot."""


class SpendSettings(_Frozen):
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


class Policy(_Frozen):
    """The effective policy of a channel (`spend`: None, the agents' calls have no limit)."""

    respond_to: RespondToPolicy = RespondToPolicy()
    bot_loop: BotLoopSettings = BotLoopSettings()
    silence: SilenceSettings = SilenceSettings()
    tool_loop: ToolLoopSettings = ToolLoopSettings()
    call_loop: CallLoopSettings = CallLoopSettings()
    spend: SpendSettings | None = None


class ChannelMatch(_Frozen):
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


class ChannelRule(_Frozen):
    """A per-channel policy: a partial policy deep-merged over the defaults."""

    match: ChannelMatch = ChannelMatch()
    policy: dict[str, object] = Field(default_factory=dict)


class TranscriptConfig(_Frozen):
    """Room memory: the messages kept per room and thread (0: none), forgotten `ttl` idle."""

    max_messages: int = Field(default=200, ge=0, le=MAX_TRANSCRIPT_MESSAGES)
    ttl: DurationText = Field(default=7 * 86_400.0, gt=0)


class PipelineConfig(_Frozen):
    """Stages that can be switched off, dedupe receipt lifetime, and room memory."""

    dedupe: bool = True
    dedupe_ttl_seconds: Duration = Field(default=600.0, gt=0)
    admin_commands: bool = True
    typing_indicator: bool = True
    turn_timeout_seconds: Duration = Field(default=120.0, gt=0)
    drain_seconds: Duration = Field(default=10.0, gt=0)
    transcript: TranscriptConfig = TranscriptConfig()


class Config(_Frozen):
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

    @model_validator(mode="after")
    def _cross_references(self) -> Config:
        seen: set[str] = set()
        for index, bot in enumerate(self.bots):
            if bot.id in seen:
                raise _FieldError(f"bots.{index}.id", f"duplicate bot id {bot.id!r}")
            seen.add(bot.id)
            if bot.agent not in self.agents:
                known = ", ".join(sorted(self.agents)) or "none defined"
                raise _FieldError(
                    f"bots.{index}.agent",
                    f"unknown agent {bot.agent!r} (agents: {known}); define it under agents:",
                )
        base = self.policy.model_dump()
        for index, rule in enumerate(self.channels):
            try:
                Policy.model_validate(deep_merge(base, rule.policy))
            except ValidationError as exc:
                path, reason = first_error(exc)
                raise _FieldError(f"channels.{index}.policy.{path}", reason) from None
        return self

    def bot(self, bot_id: str) -> BotConfig:
        """The bot with this id (KeyError when absent)."""
        for bot in self.bots:
            if bot.id == bot_id:
                return bot
        raise KeyError(bot_id)


class _FieldError(ValueError):
    """A cross-field error that knows its path, relative to the model whose validator raised it."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: {reason}")


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
        everything = deep_merge(everything, _nest(dotted, value))
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


def with_override(policy: Policy, dotted: str, value: object) -> Policy:
    """`policy` with one dotted field set, validated (ValidationError when refused)."""
    return Policy.model_validate(deep_merge(policy.model_dump(), _nest(dotted, value)))


def _nest(dotted: str, value: object) -> dict[str, object]:
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


_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_PLACEHOLDER = re.compile(r"lwvar(\d+)lw")


def _shield(text: str) -> tuple[str, list[re.Match[str]]]:
    """Swap each `${...}` for a YAML-safe placeholder so `{a: ${X:-}}` still parses."""
    found: list[re.Match[str]] = []

    def swap(match: re.Match[str]) -> str:
        found.append(match)
        return f"lwvar{len(found) - 1}lw"

    return _VAR.sub(swap, text), found


def interpolate(
    value: object, env: Mapping[str, str], refs: list[re.Match[str]], path: str = ""
) -> object:
    """Fill the placeholders of a parsed YAML tree from the environment, by field path."""
    if isinstance(value, str):

        def substitute(placeholder: re.Match[str]) -> str:
            match = refs[int(placeholder.group(1))]
            name, default = match.group(1), match.group(2)
            found = env.get(name)
            if found:
                return found
            if default is not None:
                return default
            raise ConfigError(
                path,
                f"environment variable {name} is not set (export it, or write "
                f"${{{name}:-default}} to give a default)",
            )

        return _PLACEHOLDER.sub(substitute, value)
    if isinstance(value, Mapping):
        return {
            k: interpolate(v, env, refs, f"{path}.{k}" if path else str(k))
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [
            interpolate(v, env, refs, f"{path}.{i}" if path else str(i))
            for i, v in enumerate(value)
        ]
    return value


def first_error(exc: ValidationError) -> tuple[str, str]:
    """The dotted location and message of a pydantic error, without echoing input values."""
    error = exc.errors(include_url=False, include_input=False)[0]
    loc = [str(part) for part in error["loc"]]
    # Discriminated unions put the tag in the location (bots.0.discord.token): drop it. The
    # unions are `bots.<n>` and `agents.<name>`, so the tag is the third part; anywhere else
    # a part spelled like a tag is a real field (admins.discord, an agent named openai).
    if len(loc) > 2 and loc[0] in _UNIONS:
        del loc[2]
    ctx = error.get("ctx") or {}
    ctx_error = ctx.get("error")
    if isinstance(ctx_error, _FieldError):
        return ".".join([*loc, ctx_error.path]), ctx_error.reason
    message = str(error["msg"]).removeprefix("Value error, ")
    if error["type"] == "missing":
        message = "required field is missing"
    elif error["type"] == "extra_forbidden":
        message = _UNKNOWN_FIELD
    elif error["type"] in ("union_tag_invalid", "union_tag_not_found"):
        field = str(ctx["discriminator"]).strip("'")
        expected = ctx.get("expected_tags") or _UNIONS[loc[0]]
        found = f"unknown {field} {ctx['tag']!r}" if "tag" in ctx else "required field is missing"
        message = f"{found} (one of {expected})"
        loc.append(field)
    return ".".join(loc), message


_UNIONS = {
    "bots": "'discord', 'telegram', 'slack', 'room'",
    "agents": "'scripted', 'python', 'openai', 'http'",
}


def parse_config(
    text: str, env: Mapping[str, str] | None = None, *, source: str = "the config"
) -> Config:
    """Parse, interpolate and validate the text of a YAML config (`source` names it in errors)."""
    shielded, refs = _shield(text)
    try:
        data = load_yaml(shielded)
    except YamlLimitError as exc:
        raise ConfigError("", f"{source} is refused: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(
            "", f"{source} is not valid YAML{where}: {getattr(exc, 'problem', exc)}"
        ) from None
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError("", "the config file must be a YAML mapping at the top level")
    resolved = interpolate(data, os.environ if env is None else env, refs)
    try:
        return Config.model_validate(resolved)
    except ValidationError as exc:
        path, reason = first_error(exc)
        raise ConfigError(path, reason) from None


def load_config(path: str | Path, env: Mapping[str, str] | None = None) -> Config:
    """Read, interpolate and validate a YAML config file."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError("", f"cannot read config file {file}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            "", f"config file {file} is not UTF-8 text (byte {exc.start}); save it as UTF-8"
        ) from None
    return parse_config(text, env, source=f"config file {file}")
