"""The `calls` commands' inputs: a `--rule` written inline is read within bounds (issue 9)."""

from __future__ import annotations

import pytest

from gateway.app.errors import ConfigError
from gateway.cli.calls import resolve_rule
from gateway.config import parse_config

CONFIG = parse_config("agents: {}\nbots: []\n", env={})

BOMB = "\n".join(
    ["a: &a [x, x, x, x, x, x, x, x, x]"]
    + [
        f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]"
        for i in range(9)
    ]
)


@pytest.mark.parametrize(
    "text",
    [BOMB, "[" * 10_000, "{name: r, fields: [session], max_calls: " + "9" * 5_000 + "}", "\udcff"],
)
def test_issue9_a_hostile_inline_rule_is_refused_naming_the_option(text: str) -> None:
    with pytest.raises(ConfigError, match="--rule"):
        resolve_rule(CONFIG, text)


def test_an_inline_rule_is_read() -> None:
    rule = resolve_rule(CONFIG, "{name: once, fields: [session], max_calls: 1, window_seconds: 60}")
    assert rule.name == "once"


def test_issue9_a_huge_rule_text_is_not_echoed_whole() -> None:
    with pytest.raises(ConfigError) as refused:
        resolve_rule(CONFIG, "x" * 5_000)
    assert len(str(refused.value)) < 300
