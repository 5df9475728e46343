"""Deprecated alias of `loopwarden_integrations.discord_py` (issue 22): the same module object."""

import sys
from typing import TYPE_CHECKING

from loopwarden_integrations import discord_py

if TYPE_CHECKING:  # the names, for type checkers reading the old path
    from loopwarden_integrations.discord_py import *  # noqa: F403

sys.modules[__name__] = discord_py
