"""Deprecated alias of `loopwarden_integrations.extras` (issue 22): the same module object."""

import sys
from typing import TYPE_CHECKING

from loopwarden_integrations import extras

if TYPE_CHECKING:  # the names, for type checkers reading the old path
    from loopwarden_integrations.extras import *  # noqa: F403

sys.modules[__name__] = extras
