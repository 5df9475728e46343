"""Deprecated alias of `loopwarden_integrations.praisonai` (issue 22): the same module object."""

import sys
from typing import TYPE_CHECKING

from loopwarden_integrations import praisonai

if TYPE_CHECKING:  # the names, for type checkers reading the old path
    from loopwarden_integrations.praisonai import *  # noqa: F403

sys.modules[__name__] = praisonai
