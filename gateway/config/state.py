"""The `state:` section: where budgets, cooldowns, receipts and the call log live.

Decisions where DESIGN.md is silent:
- `state.max_transcript_bytes` (default 32 MiB, from 64 KiB to 64 GiB, a whole number) is
  what the memory backend's transcripts may hold in all
  (`gateway.state.memory_transcripts`); sqlite and redis keep theirs outside the process
  and ignore it.
- `state.url` is a `redis://`, `rediss://` (TLS) or `unix://` URL without spaces or
  control characters; errors never echo it (it may hold a password). With `cluster:
  true` it names any node by host (no `unix://`) and database 0, the only one a cluster
  has. With `sentinels` its host is not used: it gives the scheme, user, password and
  database of the master the Sentinels name.
- `state.sentinels` are at most `MAX_SENTINELS` `host:port` addresses (ASCII host names
  or IP addresses, `[...]` for IPv6, a port from 1 to 65535) and need `service_name`
  (ASCII letters, digits, `.`, `_` and `-`, at most 64); `cluster` and `sentinels`
  exclude each other, and both are for `backend: redis` only.
- `state.wait_replicas` (0 to `MAX_WAIT_REPLICAS`, default 0: off) is how many replicas
  must hold each budget write (a call's reservation, its charge or refund) before the
  call goes on: the call store sends `WAIT wait_replicas wait_timeout_ms` after it on the
  same connection (`gateway.calls.redis_store`). `state.wait_timeout_ms` (1 to
  `MAX_WAIT_TIMEOUT_MS`, default 100) stays well under the client's 2 s read timeout, so
  a WAIT that times out is an answer (too few replicas), not an outage. A whole number
  of replicas, not `auto`: the operator knows how many replicas the deployment keeps,
  and a count read from the master would shrink to 0 as replicas fail, which is when
  the wait matters.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    SecretStr,
    field_validator,
    model_validator,
)

from gateway.config.base import FieldError, Frozen
from gateway.config.limits import (
    DEFAULT_TRANSCRIPT_BYTES,
    MAX_TRANSCRIPT_BYTES,
    MIN_TRANSCRIPT_BYTES,
)

MAX_SENTINELS = 16
MAX_WAIT_REPLICAS = 100
MAX_WAIT_TIMEOUT_MS = 1000
_HOST = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]{0,252}[A-Za-z0-9])?|\[[0-9A-Fa-f:.]{2,45}\]")
_PORT = re.compile(r"[0-9]{1,5}")
_SERVICE = re.compile(r"[A-Za-z0-9._-]{1,64}")
_SCHEMES = ("redis", "rediss", "unix")


def sentinel_address(value: str) -> str:
    """`value` when it is `host:port` with a plain ASCII host and a port from 1 to 65535."""
    host, colon, port = value.rpartition(":")
    if not colon or not _HOST.fullmatch(host) or not _PORT.fullmatch(port):
        raise ValueError(
            "must be host:port (ASCII letters, digits, dots and dashes, or [IPv6]), "
            "e.g. 10.0.0.7:26379"
        )
    if not 1 <= int(port) <= 65_535:
        raise ValueError("must have a port from 1 to 65535")
    return value


def _not_bool(value: object) -> object:
    """`value`, unless it is true or false: a count written as a flag is a slip, not a 1."""
    if isinstance(value, bool):
        raise ValueError("must be a whole number, not true or false")  # noqa: TRY004
    return value


def _service_name(value: str) -> str:
    if value and not _SERVICE.fullmatch(value):
        raise ValueError("must be 1 to 64 ASCII letters, digits, '.', '_' or '-'")
    return value


class StateConfig(Frozen):
    """Where budgets, cooldowns and receipts live; `max_transcript_bytes` is memory's only."""

    backend: Literal["memory", "sqlite", "redis"] = "memory"
    path: str = "loopwarden.sqlite3"
    url: SecretStr = SecretStr("redis://127.0.0.1:6379/0")
    cluster: bool = False
    sentinels: tuple[Annotated[str, AfterValidator(sentinel_address)], ...] = Field(
        default=(), max_length=MAX_SENTINELS
    )
    service_name: Annotated[str, AfterValidator(_service_name)] = ""
    on_error: Literal["allow", "deny"] = "allow"
    wait_replicas: Annotated[int, BeforeValidator(_not_bool)] = Field(
        default=0, ge=0, le=MAX_WAIT_REPLICAS
    )
    wait_timeout_ms: Annotated[int, BeforeValidator(_not_bool)] = Field(
        default=100, ge=1, le=MAX_WAIT_TIMEOUT_MS
    )
    key_prefix: str = "lw:"
    max_transcript_bytes: int = Field(
        default=DEFAULT_TRANSCRIPT_BYTES, ge=MIN_TRANSCRIPT_BYTES, le=MAX_TRANSCRIPT_BYTES
    )

    @field_validator("url")
    @classmethod
    def _redis_url(cls, value: SecretStr) -> SecretStr:
        text = value.get_secret_value()
        if any(char.isspace() or not char.isprintable() for char in text):
            raise ValueError("must not contain spaces or control characters")
        parts = urlsplit(text)
        if parts.scheme not in _SCHEMES:
            raise ValueError("must be a redis://, rediss:// (TLS) or unix:// URL")
        try:
            port_ok = parts.port is None or parts.port > 0
        except ValueError:  # not a number, or beyond 65535
            port_ok = False
        if not port_ok:
            raise ValueError("must have a port from 1 to 65535")
        if parts.hostname and not parts.hostname.isascii():
            raise ValueError("must have an ASCII host name (write an IDN host in punycode)")
        database = parts.path.lstrip("/") if parts.scheme != "unix" else ""
        if database and not (database.isascii() and database.isdigit() and len(database) < 6):
            raise ValueError("must name its database by number, e.g. /0")
        return value

    @model_validator(mode="after")
    def _topology(self) -> StateConfig:
        if (self.cluster or self.sentinels) and self.backend != "redis":
            field = "cluster" if self.cluster else "sentinels"
            raise FieldError(field, "is for backend: redis only")
        if self.wait_replicas and self.backend != "redis":
            raise FieldError("wait_replicas", "is for backend: redis only")
        if self.cluster and self.sentinels:
            raise FieldError("sentinels", "give either cluster: true or sentinels, not both")
        if self.sentinels and not self.service_name:
            raise FieldError("service_name", "is required with sentinels (the master's name)")
        if self.service_name and not self.sentinels:
            raise FieldError("sentinels", "are required with service_name")
        parts = urlsplit(self.url.get_secret_value())
        if self.cluster and (parts.scheme == "unix" or not parts.hostname):
            raise FieldError("url", "must name a cluster node by host with cluster: true")
        if self.cluster and parts.path.lstrip("/") not in ("", "0"):
            raise FieldError(
                "url", "must use database 0 with cluster: true (a cluster has no other)"
            )
        return self
