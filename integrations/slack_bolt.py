"""Deprecated alias of `loopwarden_integrations.slack_bolt` (issue 22): the same module object."""

import sys
from typing import TYPE_CHECKING

from loopwarden_integrations import slack_bolt

if TYPE_CHECKING:  # the names, for type checkers reading the old path
    from loopwarden_integrations.slack_bolt import *  # noqa: F403

sys.modules[__name__] = slack_bolt
