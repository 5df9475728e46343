"""Logging for the CLI: one format, one level, and secrets redacted from every record.

The redaction filter sits on the handler the CLI installs on the root logger, so it sees
every record that reaches the output, third-party loggers included (a logger-level filter
would miss records propagated from children). It rewrites the message, its arguments,
the exception text and the stack text of each record, replacing every configured secret
(and its percent-encoded form) and every Telegram `/bot<token>` URL segment with `***`.

Decisions where DESIGN.md is silent:
- The level comes from `--log-level`, else `LOOPWARDEN_LOG_LEVEL`, else INFO.
- httpx and httpcore log one line per request (with the URL, which carries the Telegram
  token) at INFO; they are held at WARNING unless the chosen level is stricter still.
  Redaction covers them anyway: the level only keeps the log readable.
- For a secret that is a URL with a password (the Redis URL), the password is what is
  redacted, so the host stays visible; a URL secret with no password hides nothing,
  except the proxy's alert webhook, whose whole URL and path are redacted (Slack and
  Discord webhook URLs carry their token in the path).
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Iterable, Iterator
from typing import TextIO
from urllib.parse import quote, urlsplit

from pydantic import BaseModel, SecretStr

from gateway.config import Config

LEVEL_ENV = "LOOPWARDEN_LOG_LEVEL"
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
MASK = "***"
NOISY_LOGGERS = ("httpx", "httpcore")

_BOT_TOKEN_SEGMENT = re.compile(r"(/bot)\d+:[\w-]+")


def secret_values(config: Config) -> list[str]:
    """Every secret value in the config (tokens, signing secrets, API keys, URL passwords)."""
    found: set[str] = set()
    for secret in _secrets_in(config):
        value = secret.get_secret_value()
        if "://" in value:
            password = urlsplit(value).password
            value = password or ""
        if value:
            found.add(value)
    found.update(_webhook_secrets(config))
    return sorted(found, key=len, reverse=True)


def _webhook_secrets(config: Config) -> set[str]:
    """The alert webhook URL and its path: Slack and Discord put their token in the path."""
    webhook = config.proxy.alerts.webhook if config.proxy is not None else None
    if webhook is None:
        return set()
    url = webhook.url.get_secret_value()
    parts = urlsplit(url)
    path = parts.path + (f"?{parts.query}" if parts.query else "")
    return {url, path} if path.strip("/") else {url}


def _secrets_in(node: object) -> Iterator[SecretStr]:
    """Walk a config tree and yield each SecretStr in it."""
    if isinstance(node, SecretStr):
        yield node
    elif isinstance(node, BaseModel):
        for name in type(node).model_fields:
            yield from _secrets_in(getattr(node, name))
    elif isinstance(node, dict):
        for value in node.values():
            yield from _secrets_in(value)
    elif isinstance(node, tuple | list):
        for value in node:
            yield from _secrets_in(value)


class RedactingFilter(logging.Filter):
    """Replaces secrets and Telegram `/bot<token>` segments with `***` in a whole record."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        super().__init__()
        variants = {form for secret in secrets if secret for form in (secret, quote(secret, ""))}
        # Longest first, so a secret that contains another is masked whole.
        ordered = sorted(variants, key=len, reverse=True)
        self._secrets = re.compile("|".join(map(re.escape, ordered))) if ordered else None

    def redact(self, text: str) -> str:
        """The text with every secret and bot-token URL segment masked."""
        if self._secrets is not None:
            text = self._secrets.sub(MASK, text)
        return _BOT_TOKEN_SEGMENT.sub(rf"\g<1>{MASK}", text)

    def filter(self, record: logging.LogRecord) -> bool:
        """Redact the record in place (message merged with its args) and let it through."""
        try:
            message = record.getMessage()
        except Exception:  # a bad format string must not bypass redaction via handleError
            message = f"{record.msg} {record.args!r}"
        record.msg = self.redact(message)
        record.args = None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self.redact(record.exc_text)
        if record.stack_info:
            record.stack_info = self.redact(record.stack_info)
        return True


class _RootHandler(logging.StreamHandler[TextIO]):
    """The handler `configure_logging` installs (so a second call can find and replace it)."""


def resolve_level(level: str | None) -> int:
    """The numeric level from the flag, else the environment, else INFO."""
    name = (level or os.environ.get(LEVEL_ENV) or "INFO").upper()
    numeric = logging.getLevelNamesMapping().get(name)
    if numeric is None:
        raise ValueError(f"unknown log level {name!r} (use DEBUG, INFO, WARNING or ERROR)")
    return numeric


def configure_logging(
    level: str | None, secrets: Iterable[str] = (), *, stream: TextIO | None = None
) -> logging.Handler:
    """Install the one root handler, with redaction; calling again replaces it."""
    numeric = resolve_level(level)
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _RootHandler)]:
        root.removeHandler(old)
    handler = _RootHandler(stream or sys.stderr)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    handler.addFilter(RedactingFilter(secrets))
    root.addHandler(handler)
    root.setLevel(numeric)
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(max(numeric, logging.WARNING))
    return handler
