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


TOKEN_LINE = 'access_token: "${MATRIX_TOKEN}", agent: parrot'
HOSTILE = """
agents: {{parrot: {{kind: scripted, default: "echo: {{text}}"}}}}
bots:
  - {{id: helper-mx, platform: matrix, homeserver: "https://matrix.example.org",
     user_id: "@helper:example.org", {token}, {field}: {value}}}
"""


@pytest.mark.parametrize(
    ("field", "value", "path"),
    [
        ("bot_users", '["@bot\\u202e:example.org"]', "bots.0.bot_users.0"),
        ("bot_users", '["@bot\\u0000:example.org"]', "bots.0.bot_users.0"),
        ("bot_users", '["@a bot:example.org"]', "bots.0.bot_users.0"),
        ("bot_users", f'["@{"b" * 5000}:example.org"]', "bots.0.bot_users.0"),
        ("bot_users", '[""]', "bots.0.bot_users.0"),
        ("bot_users", "{a: {b: {c: 1}}}", "bots.0.bot_users"),
        ("bot_users", f"[{', '.join(['x'] * 1001)}]", "bots.0.bot_users"),
        ("user_id", '"@help\\u200ber:example.org"', "bots.0.user_id"),
        ("reply_msgtype", '"m.n\\u043etice"', "bots.0.reply_msgtype"),
        ("reply_msgtype", "m.image", "bots.0.reply_msgtype"),
        ("sync_timeout", ".inf", "bots.0.sync_timeout"),
        ("sync_timeout", "1e308", "bots.0.sync_timeout"),
        ("sync_timeout", "9" * 5000, "too many digits"),
        ("sync_timeout", "-1", "bots.0.sync_timeout"),
    ],
)
def test_issue23_hostile_matrix_fields_are_refused_naming_the_field(
    field: str, value: str, path: str
) -> None:
    text = HOSTILE.format(token=TOKEN_LINE, field=field, value=value)
    if field == "user_id":
        text = text.replace('user_id: "@helper:example.org", ', "")
    with pytest.raises(ConfigError) as refused:
        parse_config(text, ENV)

    where = [error.path for error in refused.value.errors]
    assert path in where or (where == [""] and path in str(refused.value))
    assert "syt_secret_token_value" not in str(refused.value)
