"""Log redaction: configured secrets and Telegram bot-token URLs never reach the output."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest

from gateway.config import parse_config
from gateway.observability.logs import (
    RedactingFilter,
    configure_logging,
    resolve_level,
    secret_values,
)

TG_TOKEN = "123456:ABC-def_ghi"
CONFIG = """
state: {backend: redis, url: 'redis://:r3dis-pass@cache.internal:6379/0'}
http: {admin_token: adm-token-1-0123456789}
agents:
  helper: {kind: openai, model: m, api_key: sk-openai-key}
  quiet: {kind: openai, model: m, api_key: '${UNSET:-}'}
bots:
  - {id: tg, platform: telegram, token: 'TG_TOKEN', agent: helper}
  - {id: dc, platform: discord, token: discord-token.xyz, agent: helper}
  - {id: sl, platform: slack, bot_token: xoxb-bot, signing_secret: slack-signing,
     app_token: xapp-app, agent: helper}
""".replace("TG_TOKEN", TG_TOKEN)


@pytest.fixture
def output() -> Iterator[io.StringIO]:
    """Install the CLI's logging into a buffer; put the root logger back afterwards."""
    root = logging.getLogger()
    saved = root.level, {name: logging.getLogger(name).level for name in ("httpx", "httpcore")}
    stream = io.StringIO()
    config = parse_config(CONFIG, env={})
    handler = configure_logging("DEBUG", secret_values(config), stream=stream)
    yield stream
    root.removeHandler(handler)
    root.setLevel(saved[0])
    for name, level in saved[1].items():
        logging.getLogger(name).setLevel(level)


def test_secret_values_cover_every_secret_in_the_config() -> None:
    secrets = secret_values(parse_config(CONFIG, env={}))
    assert set(secrets) == {
        TG_TOKEN,
        "discord-token.xyz",
        "xoxb-bot",
        "slack-signing",
        "xapp-app",
        "sk-openai-key",
        "adm-token-1-0123456789",
        "r3dis-pass",
    }


def test_a_redis_url_without_password_hides_nothing() -> None:
    assert secret_values(parse_config("state: {backend: redis}\n", env={})) == []


def test_third_party_logger_url_with_bot_token_is_redacted(output: io.StringIO) -> None:
    logging.getLogger("httpx").warning("GET https://api.telegram.org/bot123:ABC/getMe")
    logging.getLogger("telegram.ext").warning(
        "POST https://tg.example/bot987654:Zyx-W_v/sendMessage 200"
    )
    text = output.getvalue()
    assert "123:ABC" not in text
    assert "987654:Zyx-W_v" not in text
    assert "https://api.telegram.org/bot***/getMe" in text
    assert "/bot***/sendMessage" in text


def test_secret_in_args_is_redacted(output: io.StringIO) -> None:
    logging.getLogger("discord.http").warning("token %s rejected by %s", "discord-token.xyz", "api")
    logging.getLogger("loopwarden").warning("connect %r", {"app_token": "xapp-app"})
    text = output.getvalue()
    assert "discord-token.xyz" not in text
    assert "xapp-app" not in text
    assert "token *** rejected by api" in text


def fail(message: str) -> None:
    """Raise with a message, as a library deep in a call would."""
    raise RuntimeError(message)


def test_secret_in_exception_text_is_redacted(output: io.StringIO) -> None:
    log = logging.getLogger("slack_bolt")
    try:
        fail(f"auth failed for xoxb-bot at https://x/bot{TG_TOKEN}/getUpdates")
    except RuntimeError:
        log.exception("request failed")
    text = output.getvalue()
    assert "RuntimeError: auth failed for *** at https://x/bot***/getUpdates" in text
    assert "xoxb-bot" not in text
    assert TG_TOKEN not in text


def test_percent_encoded_secret_and_url_password_are_redacted(output: io.StringIO) -> None:
    logging.getLogger("redis").error("cannot reach redis://:r3dis-pass@cache.internal:6379/0")
    logging.getLogger("httpx").warning("GET https://x/path?token=123456%3AABC-def_ghi")
    text = output.getvalue()
    assert "r3dis-pass" not in text
    assert "redis://:***@cache.internal:6379/0" in text
    assert "123456%3AABC" not in text


def test_httpx_info_lines_are_held_back(output: io.StringIO) -> None:
    assert logging.getLogger("httpx").level == logging.WARNING
    logging.getLogger("httpx").info("HTTP Request: GET https://api.telegram.org/bot1:A/getMe")
    logging.getLogger("loopwarden").debug("debug lines pass at DEBUG")
    text = output.getvalue()
    assert "getMe" not in text
    assert "debug lines pass at DEBUG" in text


def test_bad_format_arguments_are_still_redacted() -> None:
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "%d items", ("xoxb-bot",), None)
    RedactingFilter(["xoxb-bot"]).filter(record)
    assert "xoxb-bot" not in record.getMessage()


def test_level_from_flag_then_environment_then_info(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LOOPWARDEN_LOG_LEVEL", raising=False)
    assert resolve_level(None) == logging.INFO
    monkeypatch.setenv("LOOPWARDEN_LOG_LEVEL", "debug")
    assert resolve_level(None) == logging.DEBUG
    assert resolve_level("ERROR") == logging.ERROR
    monkeypatch.setenv("LOOPWARDEN_LOG_LEVEL", "chatty")
    with pytest.raises(ValueError, match="CHATTY"):
        resolve_level(None)
