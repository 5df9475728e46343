"""`platform: mattermost` bots and `admins.mattermost` in the config (issue 23)."""

from __future__ import annotations

import pytest

from gateway.app.errors import ConfigError
from gateway.config import MattermostBotConfig, parse_config

BOT = "bots:\n  - {{id: helper-mm, platform: mattermost, url: {url}, token: {token}, agent: a}}\n"
AGENTS = "agents: {a: {kind: scripted, default: hi}}\n"


def test_issue23_a_mattermost_bot_and_its_admins_are_read() -> None:
    config = parse_config(
        AGENTS
        + BOT.format(url="https://chat.example.org/", token="s3cr3t-t0ken")
        + "admins: {mattermost: [abc, 123]}\n"
    )
    bot = config.bots[0]
    assert isinstance(bot, MattermostBotConfig)
    assert bot.url == "https://chat.example.org"
    assert bot.token.get_secret_value() == "s3cr3t-t0ken"
    assert "s3cr3t" not in repr(bot)
    assert config.admins.for_platform("mattermost") == ("abc", "123")


@pytest.mark.parametrize(
    "url",
    [
        "chat.example.org",
        "ftp://chat.example.org",
        '"https://chat.example.org/?token=x"',
        '"https://chat.example.org/#x"',
        '"https://user:pw@chat.example.org"',
        '"https://chat.example.org/a b"',
        '"https://chat.example.org/\\u0000"',
        '"https://chаt.example.org"',  # a Cyrillic а
    ],
)
def test_issue23_a_url_that_is_not_a_plain_server_address_is_refused_naming_the_field(
    url: str,
) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config(AGENTS + BOT.format(url=url, token="s3cr3t-t0ken"))
    assert refused.value.path == "bots.0.url"
    assert "http(s) address" in str(refused.value)


def test_issue23_an_empty_token_is_refused_naming_the_field() -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config(AGENTS + BOT.format(url="https://chat.example.org", token='""'))
    assert refused.value.path == "bots.0.token"
