"""The `agents:` section: scripted, python, openai (with MCP servers) and http agents.

Decisions where DESIGN.md is silent: every agent's `history` (`max_messages` 0: no
history) is bounded by `gateway.config.limits` (DESIGN.md §3); an `http` agent's
`secret` is at least 16 characters and its `max_attempts` at most `MAX_HTTP_ATTEMPTS`.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, Field, SecretStr, field_validator, model_validator

from gateway.config.base import FieldError, Frozen, OptionalSecret, Token
from gateway.config.limits import MAX_TOKENS, MAX_TRANSCRIPT_MESSAGES, Duration, long_enough
from gateway.config.urls import http_url


class HistoryConfig(Frozen):
    """How much of the room's transcript an agent's turn gets: the newest, within both."""

    max_messages: int = Field(default=40, ge=0, le=MAX_TRANSCRIPT_MESSAGES)
    max_tokens: int = Field(default=6_000, ge=0, le=MAX_TOKENS)


class ScriptedRule(Frozen):
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


class ScriptedAgentConfig(Frozen):
    """Deterministic regex rules; first match wins, else `default` (None: stay silent)."""

    kind: Literal["scripted"]
    rules: tuple[ScriptedRule, ...] = ()
    default: str | None = None
    delay: Duration = Field(default=0.0, ge=0)
    history: HistoryConfig = HistoryConfig()


class PythonAgentConfig(Frozen):
    """`function` is `module:function`, called with the turn, returning text (or None)."""

    kind: Literal["python"]
    function: str = Field(pattern=r"^[\w.]+:[\w]+$")
    history: HistoryConfig = HistoryConfig()


MCP_SERVER_NAME_MAX = 32
"""Leaves at least 30 of an OpenAI function name's 64 characters for the tool's own name."""

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


class McpServerConfig(Frozen):
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
            raise FieldError(
                "command", "give command (a stdio server to start) or url (a streamable-HTTP one)"
            )
        if self.command is not None and self.url is not None:
            raise FieldError("url", "give either command (stdio) or url (HTTP), not both")
        if self.env and self.command is None:
            raise FieldError("env", "env is for stdio servers (command); send headers to a url")
        if self.headers and self.url is None:
            raise FieldError("headers", "headers are for HTTP servers (url); give a command env")
        return self


class OpenAIAgentConfig(Frozen):
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
                raise FieldError(
                    f"mcp_servers.{index}.name", f"duplicate MCP server name {server.name!r}"
                )
            seen.add(server.name)
            for tool_index, ref in enumerate(self.tools):
                if ref.partition(":")[2].startswith(f"{server.name}__"):
                    raise FieldError(
                        f"tools.{tool_index}",
                        f"the name is taken by MCP server {server.name!r}'s tools; rename it",
                    )
        return self


MAX_HTTP_ATTEMPTS = 10
"""The most `max_attempts` an `http` agent takes: every attempt may wait `timeout`, in one turn."""


class HttpAgentConfig(Frozen):
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
