"""`http.console_session_hours`, `http.public_url` and `proxy.public_url`: validated, named."""

from __future__ import annotations

import pytest

from gateway.app.errors import ConfigError
from gateway.config import parse_config


def refusal(text: str) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_config(text, env={})
    return str(caught.value)


def test_issue12_session_hours_default_to_twelve_and_take_a_fraction() -> None:
    assert parse_config("http: {}\n", env={}).http.console_session_hours == 12
    config = parse_config("http: {console_session_hours: 0.5}\n", env={})
    assert config.http.console_session_hours == 0.5


@pytest.mark.parametrize(
    "value",
    [".inf", ".nan", "1e308", "0", "-1", "8785", "'" + "9" * 5_000 + "'", "twelve", "[12]"],
)
def test_issue12_hostile_session_hours_are_refused_naming_the_field(value: str) -> None:
    assert refusal(f"http: {{console_session_hours: {value}}}\n").startswith(
        "http.console_session_hours"
    )


def test_issue12_a_5000_digit_session_hours_is_refused_before_it_is_read() -> None:
    assert "too many digits" in refusal("http: {console_session_hours: " + "9" * 5_000 + "}\n")


@pytest.mark.parametrize(
    "value",
    [
        "ftp://lw.example.com",
        "lw.example.com",
        "https://",
        "'https://user:pw@lw.example.com'",
        "'https://lw.example.com/?next=x'",
        "'https://lw.example.com/#x'",
        "'https://lw.example.com:99999'",
        "'https://lw.example.com\\u0000'",
        "'https://lw example.com'",
    ],
)
def test_issue12_a_bad_public_url_is_refused_naming_the_field(value: str) -> None:
    assert refusal(f'http: {{public_url: "{value.strip(chr(39))}"}}\n').startswith(
        "http.public_url"
    )
    assert refusal(f'proxy: {{public_url: "{value.strip(chr(39))}"}}\n').startswith(
        "proxy.public_url"
    )


def test_issue12_public_urls_are_kept_as_written() -> None:
    text = "http: {public_url: 'https://lw.example.com'}\nproxy: {public_url: 'http://10.0.0.5:8788'}\n"
    config = parse_config(text, env={})
    assert config.http.public_url == "https://lw.example.com"
    assert config.proxy is not None
    assert config.proxy.public_url == "http://10.0.0.5:8788"


def test_issue20_trusted_proxies_take_addresses_and_networks_in_normal_form() -> None:
    assert parse_config("http: {}\n", env={}).http.trusted_proxies == ()
    text = "http: {trusted_proxies: ['10.0.0.0/8', '192.0.2.7', '::1', '2001:DB8::/32']}\n"
    assert parse_config(text, env={}).http.trusted_proxies == (
        "10.0.0.0/8",
        "192.0.2.7/32",
        "::1/128",
        "2001:db8::/32",
    )


@pytest.mark.parametrize(
    "value",
    [
        "[junk]",
        "['10.0.0.1/8']",
        "['10.0.0.0/33']",
        "['300.1.2.3']",
        "['']",
        "['" + "9" * 5_000 + "']",
        "['10.0.0.1\\n']",
        '["10.0.0.1\\u0000"]',
        "['10.0.0.1 ']",
        "['１０.0.0.1']",
        "[[10.0.0.1]]",
        "[12]",
        "10.0.0.1",
        "[" + ", ".join(["10.0.0.1"] * 1_001) + "]",
    ],
)
def test_issue20_hostile_trusted_proxies_are_refused_naming_the_field(value: str) -> None:
    reason = refusal(f"http: {{trusted_proxies: {value}}}\n")
    assert reason.startswith("http.trusted_proxies")
    assert "9" * 100 not in reason
    assert len(reason) < 300
