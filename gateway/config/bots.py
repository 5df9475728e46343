"""The `bots:` section (one model per platform, told apart by `platform`) and `admins:`.

Decisions where DESIGN.md is silent: a Telegram `webhook_secret` is at least 16
characters (`gateway.config.limits`) and required with `mode: webhook`; a Slack bot
needs `signing_secret` unless `app_token` (Socket Mode) is set. A Matrix bot's
`user_id` is a full Matrix id (`@name:server`), its `homeserver` an http(s) URL, and its
`bot_users` are ids or globs (`@telegram_*:example.org`) matched case-sensitively, as
Matrix ids are.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, field_validator, model_validator

from gateway.config.base import ChosenSecret, FieldError, Frozen, OptionalSecret, Token
from gateway.config.limits import Duration

# A scheme, a host (name, IPv4 or [IPv6], optional port) and an optional path: no user
# info, query, fragment, spaces or control characters (printed in logs, joined to paths).
_SERVER_URL = re.compile(r"^https?://[A-Za-z0-9.\-\[\]:]+(?:/[A-Za-z0-9._~%!$&'()*+,;=:@/-]*)?$")


class _BotBase(Frozen):
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
            raise FieldError(
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
            raise FieldError(
                "signing_secret",
                "required unless app_token is set (Events API requests "
                "are verified with it; Socket Mode needs app_token instead)",
            )
        return self


class MattermostBotConfig(_BotBase):
    """A Mattermost bot account: the server's URL and the bot's access token (REST v4)."""

    platform: Literal["mattermost"]
    url: str
    token: Token

    @field_validator("url")
    @classmethod
    def _server_url(cls, value: str) -> str:
        if not _SERVER_URL.match(value):
            raise ValueError(
                "must be the server's http(s) address without query or spaces, "
                "e.g. https://chat.example.org (the API is under /api/v4)"
            )
        return value.rstrip("/")


def _matrix_id(value: str) -> str:
    """A Matrix user id or glob: visible characters only (a control or bidi character, or
    a space, would make an id that never matches anyone)."""
    if any(char.isspace() or not char.isprintable() for char in value):
        raise ValueError("must be a Matrix user id or glob of visible characters, no spaces")
    return value


MatrixId = Annotated[str, Field(min_length=1, max_length=255), AfterValidator(_matrix_id)]


class MatrixBotConfig(_BotBase):
    """A Matrix bot: a user's access token on a homeserver, syncing its joined rooms."""

    platform: Literal["matrix"]
    homeserver: str = Field(max_length=2048)
    user_id: Annotated[MatrixId, Field(pattern=r"^@[^:\s]+:[^\s]+$")]
    access_token: Token
    bot_users: tuple[MatrixId, ...] = Field(default=(), max_length=1_000)
    reply_msgtype: Literal["m.notice", "m.text"] = "m.notice"
    sync_timeout: Duration = Field(default=30.0, ge=0, le=300)

    @field_validator("homeserver")
    @classmethod
    def _homeserver_url(cls, value: str) -> str:
        if not _SERVER_URL.match(value):
            raise ValueError(
                "must be the homeserver's http(s) address without query or spaces, "
                "e.g. https://matrix.example.org (the client API is under /_matrix)"
            )
        return value.rstrip("/")


class RoomBotConfig(_BotBase):
    """A bot in the embedded local web room (the demo platform)."""

    platform: Literal["room"]
    name: str | None = None

    @property
    def display_name(self) -> str:
        """Its name in the room when it has one, else its config id."""
        return self.name or self.id


BotConfig = Annotated[
    DiscordBotConfig
    | TelegramBotConfig
    | SlackBotConfig
    | MattermostBotConfig
    | MatrixBotConfig
    | RoomBotConfig,
    Field(discriminator="platform"),
]


class AdminsConfig(Frozen):
    """Platform user ids allowed to run `/loop` commands, per platform."""

    discord: tuple[str, ...] = ()
    telegram: tuple[str, ...] = ()
    slack: tuple[str, ...] = ()
    mattermost: tuple[str, ...] = ()
    matrix: tuple[str, ...] = ()
    room: tuple[str, ...] = ()

    @field_validator("discord", "telegram", "slack", "mattermost", "matrix", "room", mode="before")
    @classmethod
    def _ids_as_text(cls, value: object) -> object:
        if isinstance(value, list | tuple):
            return tuple(str(v) for v in value)
        return value

    def for_platform(self, platform: str) -> tuple[str, ...]:
        """The admin ids of one platform (none for an unknown platform)."""
        ids: tuple[str, ...] = getattr(self, platform, ())
        return ids
