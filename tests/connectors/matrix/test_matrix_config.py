"""`platform: matrix` bots and `admins.matrix` in the config (DESIGN.md §8)."""

from __future__ import annotations

import pytest

from gateway.app.errors import ConfigError
from gateway.config import MatrixBotConfig, parse_config

CONFIG = """
agents: {{parrot: {{kind: scripted, default: "echo: {{text}}"}}}}
bots:
  - {{id: helper-mx, platform: matrix, homeserver: "{homeserver}", user_id: "{user_id}",
     access_token: "${{MATRIX_TOKEN}}", agent: parrot, bot_users: ["@telegram_*:example.org"]}}
admins: {{matrix: ["@alice:example.org"]}}
"""
ENV = {"MATRIX_TOKEN": "syt_secret_token_value"}


def test_issue23_a_matrix_bot_is_configured_with_notice_replies_by_default() -> None:
    text = CONFIG.format(homeserver="https://matrix.example.org/", user_id="@helper:example.org")
    config = parse_config(text, ENV)

    [bot] = config.bots
    assert isinstance(bot, MatrixBotConfig)
    assert bot.homeserver == "https://matrix.example.org"
    assert bot.reply_msgtype == "m.notice"
    assert bot.bot_users == ("@telegram_*:example.org",)
    assert config.admins.for_platform("matrix") == ("@alice:example.org",)
    assert "syt_secret_token_value" not in repr(bot)


@pytest.mark.parametrize(
    ("homeserver", "user_id", "field"),
    [
        ("https://matrix.example.org", "helper", "bots.0.user_id"),
        ("https://matrix.example.org", "@helper:exa mple.org", "bots.0.user_id"),
        ("ftp://matrix.example.org", "@helper:example.org", "bots.0.homeserver"),
        ("https://matrix.example.org/?x=1", "@helper:example.org", "bots.0.homeserver"),
        ("https://matrix.example.org\\u0000", "@helper:example.org", "bots.0.homeserver"),
    ],
)
def test_issue23_a_bad_homeserver_or_user_id_names_its_field(
    homeserver: str, user_id: str, field: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config(CONFIG.format(homeserver=homeserver, user_id=user_id), ENV)

    assert refused.value.errors[0].path == field
    assert "syt_secret_token_value" not in str(refused.value)
