"""Deprecated alias of `loopwarden_integrations.openai_agents` (issue 22): the same module."""

import sys
from typing import TYPE_CHECKING

from loopwarden_integrations import openai_agents

if TYPE_CHECKING:  # the names, for type checkers reading the old path
    from loopwarden_integrations.openai_agents import *  # noqa: F403

sys.modules[__name__] = openai_agents
