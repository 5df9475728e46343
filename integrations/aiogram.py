"""Deprecated alias of `loopwarden_integrations.aiogram` (issue 22): the same module object."""

import sys
from typing import TYPE_CHECKING

from loopwarden_integrations import aiogram

if TYPE_CHECKING:  # the names, for type checkers reading the old path
    from loopwarden_integrations.aiogram import *  # noqa: F403

sys.modules[__name__] = aiogram
