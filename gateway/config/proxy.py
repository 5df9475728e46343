"""The `proxy:` section of the config: keys, upstreams, the call guard, rules, prices, alerts.

Validated with the rest of the file by `gateway.config.loader.load_config` (so errors name the
field, e.g. `proxy.rules.0: window_seconds must be ...`). Secrets (proxy keys, upstream
keys, the alert webhook, bot token and SMTP password) are `SecretStr` and never printed.

Decisions where DESIGN.md is silent:
- `keys` is written as DESIGN.md shows (`{lw-demo-key: {agent: billing-bot}}`) or as a
  list (`[{key: ${LW_KEY}, agent: billing-bot}]`), the form to use when the key comes from
  the environment: `${VAR}` is filled in values, not in mapping keys. A key may also set
  `customer`, `user` and `feature`: its calls carry those values whatever the headers
  say (`gateway.proxy.calls`).
- `prices` maps model globs (fnmatch, first match wins, in the order written) to prices
  per 1,000 tokens in dollars; they override or add to `genai-prices` (`pricing`).
- `budgets` (`gateway.proxy.budgets`): `per` fields among agent, session, customer, user,
  feature, model (each once); `limit_usd` and/or `limit_tokens` (0 up to `gateway.config.limits`'
  bounds); `period` day, week or month in `budget_timezone` (an IANA name); `filters`
  on the same fields, a trailing `*` a prefix. Names are unique.
- `anomaly` (`gateway.calls.anomaly`): off unless given; `window` a duration (`1h`,
  `30m` or seconds) from a minute to a day, `factor` 1 to 1,000, `min_usd` 0 up to
  `gateway.config.limits`' bound, `action` alert or pause.
- `alerts.webhook` is a URL or `{url: ...}`; it is a secret (Slack and Discord webhook
  URLs carry their token in the path).
- `admin_token` is at least 16 characters, durations at most 366 days, and no number is
  inf or nan (`gateway.config.limits`); `call_loop` is the gateway's own model
  (`gateway.config.call_loop`), checked by building its `CallLoopPolicy`.
- `public_url` is where browsers reach the proxy's console (`gateway.config.urls`;
  https makes its cookie Secure); its sessions last `http.console_session_hours`.
- `call_loop.mode` and each rule's `mode` are `enforce` (default) or `shadow`, exactly
  (`guards.mode`); a call refused in shadow mode is forwarded with `x-loopwarden-shadow`
  (`gateway.proxy.shadow`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import (
    AfterValidator,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    field_validator,
    model_validator,
)

from gateway.calls.anomaly import (
    MAX_WINDOW_SECONDS,
    MIN_WINDOW_SECONDS,
    AnomalyAction,
    AnomalyPolicy,
)
from gateway.calls.budgets import Budget, Limits, Period, nano
from gateway.config.base import Frozen, OptionalSecret, Token
from gateway.config.call_loop import CallLoopSettings
from gateway.config.limits import MAX_TOKENS, MAX_USD, Duration, DurationText, long_enough
from gateway.config.urls import PublicUrl
from guards.call_loop import UniquenessRule

MIN_KEY_LENGTH = 8

KeyField = Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[\w.@-]+$")]
"""A value a proxy key binds its calls to (agent, customer, user, feature)."""


class ProxyKey(Frozen):
    """A key clients use as their SDK's api_key; it names the agent (the circuit's root).

    `customer`, `user` and `feature`, when set, bind every call made with the key to that
    value: the `X-Loopwarden-*` header may only fill a field the key leaves open.
    """

    key: Token
    agent: str = Field(min_length=1, pattern=r"^[\w.@-]+$")
    customer: KeyField | None = None
    user: KeyField | None = None
    feature: KeyField | None = None

    def bound(self) -> tuple[tuple[str, str], ...]:
        """The fields beside the agent this key sets, as (name, value)."""
        named = (("customer", self.customer), ("user", self.user), ("feature", self.feature))
        return tuple((name, value) for name, value in named if value is not None)

    @field_validator("key")
    @classmethod
    def _long_enough(cls, value: SecretStr) -> SecretStr:
        # A short key is guessable, and the log filter would mask its text everywhere.
        if 0 < len(value.get_secret_value()) < MIN_KEY_LENGTH:
            raise ValueError(f"must be at least {MIN_KEY_LENGTH} characters long")
        return value


class Upstream(Frozen):
    """One provider the proxy forwards to; `api_key` None sends no credentials (Ollama)."""

    base_url: str
    api_key: OptionalSecret = None

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL")
        return value.rstrip("/")


class Upstreams(Frozen):
    """The upstream of each provider route; a route without an upstream answers 404."""

    openai: Upstream | None = None
    anthropic: Upstream | None = None
    gemini: Upstream | None = None


class Price(Frozen):
    """What 1,000 input and 1,000 output tokens of a model cost."""

    input_per_1k: float = Field(ge=0, le=MAX_USD)
    output_per_1k: float = Field(ge=0, le=MAX_USD)


PerField = Literal["agent", "session", "customer", "user", "feature", "model"]
"""`gateway.calls.budgets.PER_FIELDS` as a type (a test holds the two together)."""


def distinct(per: tuple[str, ...]) -> tuple[str, ...]:
    """A budget's `per` fields, each named once (here and in the gateway's `policy.spend`)."""
    if len(set(per)) != len(per):
        raise ValueError("lists a field twice")
    return per


def budget_limits(limit_usd: float | None, limit_tokens: int | None) -> Limits:
    """A budget's limits (money in nano-dollars); ValueError when it sets neither."""
    if limit_usd is None and limit_tokens is None:
        raise ValueError("needs limit_usd, limit_tokens or both")
    return Limits(None if limit_usd is None else nano(limit_usd), limit_tokens)


class BudgetSettings(Frozen):
    """One entry of `proxy.budgets`: a limit per group of calls per period."""

    name: str = Field(min_length=1, max_length=64, pattern=r"^[\w.@-]+$")
    per: Annotated[tuple[PerField, ...], AfterValidator(distinct)] = ()
    limit_usd: float | None = Field(default=None, ge=0, le=MAX_USD)
    limit_tokens: int | None = Field(default=None, ge=0, le=MAX_TOKENS)
    period: Period = "day"
    filters: dict[PerField, Annotated[str, Field(min_length=1, max_length=256)]] = Field(
        default_factory=dict
    )

    @model_validator(mode="after")
    def _has_a_limit(self) -> BudgetSettings:
        budget_limits(self.limit_usd, self.limit_tokens)
        return self

    def budget(self) -> Budget:
        """The budget the call store steps over (money in nano-dollars)."""
        return Budget(
            self.name,
            tuple(self.per),
            budget_limits(self.limit_usd, self.limit_tokens),
            self.period,
            tuple(sorted(self.filters.items())),
        )


def _time_zone(value: str) -> str:
    """An IANA time zone name `zoneinfo` knows (e.g. UTC, Europe/Berlin)."""
    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ValueError(
            f"unknown time zone {value[:60]!r} (an IANA name, e.g. UTC or Europe/Berlin)"
        ) from None
    return value


TimeZone = Annotated[str, Field(max_length=64), AfterValidator(_time_zone)]
"""An IANA time zone name (`proxy.budget_timezone`, the gateway's `policy.spend.timezone`)."""


MAX_ANOMALY_FACTOR = 1_000.0


class AnomalySettings(Frozen):
    """`proxy.anomaly`: alert (or pause) when an agent's window spends far above its median."""

    enabled: bool = True
    window: DurationText = Field(default=3_600.0, ge=MIN_WINDOW_SECONDS, le=MAX_WINDOW_SECONDS)
    factor: float = Field(default=3.0, ge=1.0, le=MAX_ANOMALY_FACTOR)
    min_usd: float = Field(default=1.0, ge=0, le=MAX_USD)
    action: AnomalyAction = "alert"

    def policy(self) -> AnomalyPolicy | None:
        """The detector's policy (money in nano-dollars); None when it is off."""
        if not self.enabled:
            return None
        return AnomalyPolicy(self.window, self.factor, nano(self.min_usd), self.action)


def _budget_names(value: tuple[BudgetSettings, ...]) -> tuple[BudgetSettings, ...]:
    names = [budget.name for budget in value]
    duplicate = next((name for name in names if names.count(name) > 1), None)
    if duplicate is not None:
        raise ValueError(f"the budget name {duplicate!r} is used twice")
    return value


class WebhookAlert(Frozen):
    """A Slack or Discord incoming webhook (or anything taking `{"text", "content"}`)."""

    url: Token


class TelegramAlert(Frozen):
    """A Telegram chat the alert bot posts to with sendMessage."""

    bot_token: Token
    chat_id: str
    api_base_url: str = "https://api.telegram.org"

    @field_validator("chat_id", mode="before")
    @classmethod
    def _id_as_text(cls, value: object) -> object:
        return str(value) if isinstance(value, int) else value


class EmailAlert(Frozen):
    """An SMTP server and the addresses of alert mails."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    host: str
    port: int = Field(default=587, ge=1, le=65535)
    sender: str = Field(alias="from", min_length=3)
    to: tuple[str, ...] = Field(min_length=1)
    username: str | None = None
    password: OptionalSecret = None
    starttls: bool = True
    timeout: Duration = Field(default=10.0, gt=0)

    @field_validator("to", mode="before")
    @classmethod
    def _one_or_many(cls, value: object) -> object:
        return (value,) if isinstance(value, str) else value


class AlertsConfig(Frozen):
    """Where an alert goes when a circuit pauses; deliveries are retried `attempts` times."""

    webhook: WebhookAlert | None = None
    telegram: TelegramAlert | None = None
    email: EmailAlert | None = None
    attempts: int = Field(default=5, ge=1)

    @field_validator("webhook", mode="before")
    @classmethod
    def _url_shorthand(cls, value: object) -> object:
        return {"url": value} if isinstance(value, str) else value


def _keys_as_list(value: object) -> object:
    """`{key: {agent: ...}}` → `[{key: key, agent: ...}]`; a list is taken as it is."""
    if isinstance(value, Mapping):
        return [
            {"key": key, **item} if isinstance(item, Mapping) else {"key": key, "agent": item}
            for key, item in value.items()
        ]
    return value


def _rules(value: object) -> object:
    """Each rule mapping validated by the guard itself (its errors name the rule's field)."""
    if not isinstance(value, list | tuple):
        return value
    rules: list[UniquenessRule] = []
    for index, item in enumerate(value):
        if isinstance(item, UniquenessRule):
            rules.append(item)
            continue
        if not isinstance(item, Mapping):
            # pydantic turns only ValueError into a validation error naming the field.
            raise ValueError(f"rule {index} must be a mapping (name, fields, max_calls, ...)")  # noqa: TRY004
        try:
            rules.append(UniquenessRule.from_dict(item))
        except ValueError as exc:
            raise ValueError(f"rule {index}: {exc}") from None
    names = [rule.name for rule in rules]
    duplicate = next((name for name in names if names.count(name) > 1), None)
    if duplicate is not None:
        raise ValueError(f"the rule name {duplicate!r} is used twice")
    return tuple(rules)


class ProxyConfig(Frozen):
    """`loopwarden proxy`: where it listens, who may call, where calls go, what stops them."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    host: str = "127.0.0.1"
    port: int = Field(default=8788, ge=0, le=65535)
    keys: Annotated[tuple[ProxyKey, ...], BeforeValidator(_keys_as_list)] = ()
    upstreams: Upstreams = Upstreams()
    call_loop: CallLoopSettings = CallLoopSettings()
    rules: Annotated[tuple[UniquenessRule, ...], BeforeValidator(_rules)] = ()
    alerts: AlertsConfig = AlertsConfig()
    prices: dict[str, Price] = Field(default_factory=dict)
    default_output_tokens: int = Field(default=500, ge=0, le=MAX_TOKENS)
    budgets: Annotated[tuple[BudgetSettings, ...], AfterValidator(_budget_names)] = ()
    budget_timezone: TimeZone = "UTC"
    unpriced: Literal["allow", "refuse"] = "allow"
    anomaly: AnomalySettings = AnomalySettings(enabled=False)
    admin_token: Annotated[OptionalSecret, AfterValidator(long_enough)] = None
    public_url: PublicUrl = None
    connect_timeout: Duration = Field(default=10.0, gt=0)
    read_timeout: Duration = Field(default=300.0, gt=0)
    log_keep: int = Field(default=100_000, ge=1)
    drain_seconds: Duration = Field(default=10.0, gt=0)

    @field_validator("keys")
    @classmethod
    def _distinct_keys(cls, value: tuple[ProxyKey, ...]) -> tuple[ProxyKey, ...]:
        secrets = [key.key.get_secret_value() for key in value]
        if len(set(secrets)) != len(secrets):
            raise ValueError("a proxy key is listed twice")
        return value
