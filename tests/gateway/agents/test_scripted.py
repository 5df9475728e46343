"""The scripted agent: rules in order, default, templates, braces and the injected delay."""

from __future__ import annotations

import pytest

from gateway.agents.scripted import ScriptedAgent, fill_template
from gateway.app.types import AgentResult
from gateway.config import ScriptedAgentConfig, ScriptedRule
from tests.gateway.agents.agent_turns import make_turn


def _agent(
    *rules: tuple[str, str], default: str | None = None, delay: float = 0.0
) -> ScriptedAgent:
    config = ScriptedAgentConfig(
        kind="scripted",
        rules=tuple(ScriptedRule(match=m, reply=r) for m, r in rules),
        default=default,
        delay=delay,
    )
    return ScriptedAgent(config)


async def test_first_matching_rule_wins() -> None:
    agent = _agent(("ping", "pong"), ("p", "letter p"), default="?")
    assert (await agent.respond(make_turn("say ping please"))).text == "pong"
    assert (await agent.respond(make_turn("hop"))).text == "letter p"


async def test_rules_use_search_not_match() -> None:
    agent = _agent((r"\bstatus\b", "all good"))
    assert (await agent.respond(make_turn("what is the status now?"))).text == "all good"


async def test_default_when_no_rule_matches() -> None:
    agent = _agent(("ping", "pong"), default="echo: {text}")
    assert (await agent.respond(make_turn("hello"))).text == "echo: hello"


async def test_no_default_stays_silent() -> None:
    agent = _agent(("ping", "pong"))
    assert await agent.respond(make_turn("hello")) == AgentResult(text=None)


async def test_template_fills_text_and_sender() -> None:
    agent = _agent(("hi", "hi {sender}, you said {text}"))
    result = await agent.respond(make_turn("hi there", sender_name="Bob"))
    assert result.text == "hi Bob, you said hi there"


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ('{"json": true} {text}', '{"json": true} x'),
        ("{0} {} {{text}} {unknown}", "{0} {} {x} {unknown}"),
        ("unbalanced { brace", "unbalanced { brace"),
        ("}{", "}{"),
    ],
)
def test_other_braces_are_left_alone(template: str, expected: str) -> None:
    assert fill_template(template, text="x", sender="s") == expected


async def test_filled_values_are_not_expanded_again() -> None:
    agent = _agent(default="{sender}: {text}")
    result = await agent.respond(make_turn("{sender} {0} {", sender_name="{text}"))
    assert result.text == "{text}: {sender} {0} {"


async def test_delay_uses_injected_sleep() -> None:
    slept: list[float] = []

    async def fake_sleep(seconds: float) -> None:
        slept.append(seconds)

    config = ScriptedAgentConfig(kind="scripted", default="ok", delay=1.5)
    agent = ScriptedAgent(config, sleep=fake_sleep)
    assert (await agent.respond(make_turn("x"))).text == "ok"
    assert slept == [1.5]


async def test_no_delay_when_silent() -> None:
    slept: list[float] = []

    async def fake_sleep(seconds: float) -> None:
        slept.append(seconds)

    agent = ScriptedAgent(ScriptedAgentConfig(kind="scripted", delay=2.0), sleep=fake_sleep)
    assert (await agent.respond(make_turn("x"))).text is None
    assert slept == []


async def test_deterministic_over_repeats() -> None:
    agent = _agent(("a+", "many a"), default="none")
    texts = [(await agent.respond(make_turn(t))).text for t in ["aaa", "b", "aaa", "b"]]
    assert texts == ["many a", "none", "many a", "none"]
    assert agent.template_for("xay") == "many a"
    await agent.aclose()
