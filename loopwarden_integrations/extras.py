"""The ImportError an adapter raises when its library (its loopwarden extra) is missing."""

from __future__ import annotations

from gateway.app.errors import LoopwardenError


class MissingExtraError(LoopwardenError, ImportError):
    """An integration was imported without the library it adapts."""


def missing_extra(module: str, package: str, extra: str) -> MissingExtraError:
    """The error for `module` needing `package`, naming the extra that installs it."""
    return MissingExtraError(
        f"{module} needs {package}, which is not installed: pip install 'loopwarden[{extra}]'"
    )
