"""The `scripted` agent: regex rules to reply templates, deterministic, for demos and tests.

Decisions where DESIGN.md is silent:
- Templates fill exactly `{text}` (the message text) and `{sender}` (the sender's display
  name); every other brace, including `{0}`, `{}` and `{{`, is left as written, so a
  reply containing code or JSON never crashes and never needs escaping. Filled-in values
  are not expanded again (a message text of "{sender}" is echoed as "{sender}").
- `delay` is waited only when there is something to say: a turn that stays silent
  returns at once.
- A rule whose reply is the empty string sends nothing, like a missing `default`.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from gateway.app.types import AgentResult
from gateway.config import ScriptedAgentConfig

if TYPE_CHECKING:
    from gateway.app.context import TurnContext

Sleep = Callable[[float], Awaitable[object]]

_PLACEHOLDER = re.compile(r"\{(text|sender)\}")


def fill_template(template: str, *, text: str, sender: str) -> str:
    """Replace `{text}` and `{sender}` in one pass, leaving every other brace alone."""
    values = {"text": text, "sender": sender}
    return _PLACEHOLDER.sub(lambda match: values[match.group(1)], template)


class ScriptedAgent:
    """Answers with the first rule whose regex matches the message text, else `default`."""

    def __init__(self, config: ScriptedAgentConfig, *, sleep: Sleep = asyncio.sleep) -> None:
        self._rules = tuple((re.compile(rule.match), rule.reply) for rule in config.rules)
        self._default = config.default
        self._delay = config.delay
        self._sleep = sleep

    def template_for(self, text: str) -> str | None:
        """The reply template chosen for a message text (None: stay silent)."""
        for pattern, reply in self._rules:
            if pattern.search(text):
                return reply
        return self._default

    async def respond(self, turn: TurnContext) -> AgentResult:
        """Pick the template for this turn, fill it and wait the configured delay."""
        message = turn.message
        template = self.template_for(message.text)
        if not template:
            return AgentResult(text=None)
        reply = fill_template(template, text=message.text, sender=message.sender_name)
        if self._delay > 0:
            await self._sleep(self._delay)
        return AgentResult(text=reply)

    async def aclose(self) -> None:
        """Nothing to release."""
