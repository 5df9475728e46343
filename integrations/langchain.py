"""Deprecated alias of `loopwarden_integrations.langchain` (issue 22): the same module object."""

import sys
from typing import TYPE_CHECKING

from loopwarden_integrations import langchain

if TYPE_CHECKING:  # the names, for type checkers reading the old path
    from loopwarden_integrations.langchain import *  # noqa: F403

sys.modules[__name__] = langchain
