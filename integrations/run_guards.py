"""Deprecated alias of `loopwarden_integrations.run_guards` (issue 22): the same module object."""

import sys
from typing import TYPE_CHECKING

from loopwarden_integrations import run_guards

if TYPE_CHECKING:  # the names, for type checkers reading the old path
    from loopwarden_integrations.run_guards import *  # noqa: F403

sys.modules[__name__] = run_guards
