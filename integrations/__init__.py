"""Deprecated: the integrations moved to `loopwarden_integrations` (issue 22).

`integrations` is a name Django projects and other applications use for their own code,
so loopwarden no longer claims it. For one release this shim keeps the old imports
working: `from integrations import RoomGuard` and `import integrations.discord_py` (each
adapter module) give the very objects of `loopwarden_integrations`, after a
DeprecationWarning on the first import. It goes in the next release.
"""

import warnings

from loopwarden_integrations import Decision, RoomGuard, RoomGuardError

warnings.warn(
    "the 'integrations' package is deprecated and goes in the next release: "
    "import loopwarden_integrations instead (same names)",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = ["Decision", "RoomGuard", "RoomGuardError"]
