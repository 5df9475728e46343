"""Deprecated alias of `loopwarden_integrations.telegram_ptb` (issue 22): the same module object."""

import sys
from typing import TYPE_CHECKING

from loopwarden_integrations import telegram_ptb

if TYPE_CHECKING:  # the names, for type checkers reading the old path
    from loopwarden_integrations.telegram_ptb import *  # noqa: F403

sys.modules[__name__] = telegram_ptb
