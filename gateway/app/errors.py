"""The one error hierarchy of loopwarden: every error we raise derives from LoopwardenError."""

from __future__ import annotations

from collections.abc import Sequence


class LoopwardenError(Exception):
    """Root of every loopwarden error."""


class ConfigError(LoopwardenError):
    """The configuration is invalid; `path` names the field (dotted, list indexes as numbers)."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: {reason}" if path else reason)

    @property
    def errors(self) -> tuple[ConfigError, ...]:
        """Every error found: this one (`ConfigErrors` holds several)."""
        return (self,)


class ConfigErrors(ConfigError):
    """Several errors found in one config, each naming its field; `path` and `reason` are
    the first's, so a caller that reports one error reports that one."""

    def __init__(self, errors: Sequence[ConfigError]) -> None:
        self._errors = tuple(errors)
        super().__init__(self._errors[0].path, self._errors[0].reason)
        self.args = ("\n".join(str(error) for error in self._errors),)

    @property
    def errors(self) -> tuple[ConfigError, ...]:
        """Every error found, each naming its field."""
        return self._errors


class ConnectorError(LoopwardenError):
    """A platform connector failed; `platform` names it. Messages never carry tokens."""

    def __init__(self, platform: str, message: str) -> None:
        self.platform = platform
        super().__init__(f"{platform}: {message}")


class DeliveryError(LoopwardenError):
    """A reply could not be delivered after every retry."""

    def __init__(self, message: str, *, retryable: bool = False, retry_after: float | None = None):
        self.retryable = retryable
        self.retry_after = retry_after
        super().__init__(message)


class StateError(LoopwardenError):
    """The state backend is unreachable or answered with an error."""


class GatewayStopping(LoopwardenError):
    """The gateway is shutting down and takes no new message; the connector should not
    acknowledge it, so a platform that redelivers (Telegram polling and webhooks) sends it
    again to the next run instead of losing it."""
