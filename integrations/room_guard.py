"""Deprecated alias of `loopwarden_integrations.room_guard` (issue 22): the same module object."""

import sys
from typing import TYPE_CHECKING

from loopwarden_integrations import room_guard

if TYPE_CHECKING:  # the names, for type checkers reading the old path
    from loopwarden_integrations.room_guard import *  # noqa: F403

sys.modules[__name__] = room_guard
