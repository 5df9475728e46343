"""What every platform connector does the same way: drops, the hand-over, masked secrets.

A connector keeps its platform's translation (`inbound.py`, `outbound.py`) and SDK wiring;
one `ConnectorRuntime` per hosted bot does the rest:
- `accept` turns a translation's result into a message or a counted drop; a translation
  that raises (odd values in untrusted JSON) drops that event alone, as `malformed`.
- `drop` counts an event by its `Skip` reason, on the connector (`dropped`) and at
  `/metrics` (`events_dropped_total{platform,reason}`), and logs it at DEBUG.
- `offer` awaits the gateway's sink on one message and says how it went, never raising:
  a failure of the pipeline is logged (type and message id; the traceback at DEBUG) and is
  `FAILED`; `GatewayStopping`, or no sink attached, is `REFUSED`, so a connector whose
  platform redelivers (Telegram) leaves the event unacknowledged for the next run.
  `hand_over` is the same for an event that was acknowledged already and cannot come
  again (Discord, Slack, Telegram peers): not taken is a drop, `sink_error` or `stopping`.
- `describe` renders an exception for a log line or an error message with this bot's
  secrets masked (and any Telegram `/bot<token>` URL segment), as the CLI's log filter does.
"""

from __future__ import annotations

import enum
import logging
from collections import Counter
from collections.abc import Callable, Iterable

from connectors.skips import Skip
from gateway.app.connector import ConnectorServices, Sink
from gateway.app.errors import GatewayStopping
from gateway.app.types import InboundMessage
from gateway.observability.logs import RedactingFilter


class Outcome(enum.Enum):
    """How one hand-over to the sink went."""

    TAKEN = "taken"
    FAILED = "failed"
    REFUSED = "refused"


class ConnectorRuntime:
    """The shared part of one hosted bot's connector: counts, hand-over, redaction."""

    def __init__(
        self,
        platform: str,
        bot_id: str,
        services: ConnectorServices,
        *,
        log: logging.Logger,
        secrets: Iterable[str] = (),
    ) -> None:
        self.platform = platform
        self.bot_id = bot_id
        self.dropped: Counter[str] = Counter()
        self.sink: Sink | None = None
        self._metrics = services.metrics
        self._log = log
        self._redactor = RedactingFilter(secrets)

    def accept(
        self, translate: Callable[[], InboundMessage | Skip], what: object
    ) -> InboundMessage | None:
        """The message `translate` makes of one event, or None when it is dropped (counted)."""
        try:
            result = translate()
        except Exception:  # odd values in untrusted input: drop this event alone
            self._log.debug("%s bot %s: %s failed to translate", *self._who, what, exc_info=True)
            result = Skip.MALFORMED
        if isinstance(result, Skip):
            self.drop(result, what)
            return None
        return result

    def drop(self, reason: Skip, what: object = "an event") -> None:
        """Count one dropped event, here and at `/metrics`."""
        self.dropped[reason.value] += 1
        self._metrics.event_dropped(self.platform, reason.value)
        self._log.debug("%s bot %s: dropped %s (%s)", *self._who, what, reason.value)

    async def offer(self, message: InboundMessage) -> Outcome:
        """Await the sink on `message`; how it went (logged), never an exception."""
        sink = self.sink
        if sink is None:
            return Outcome.REFUSED
        try:
            await sink(message)
        except GatewayStopping:
            return Outcome.REFUSED
        except Exception as exc:  # the pipeline must not take the connector down
            self._log.warning(
                "%s bot %s: the pipeline failed on message %s (%s)",
                *self._who,
                message.message_id,
                type(exc).__name__,
            )
            self._log.debug("pipeline failure of %s bot %s", *self._who, exc_info=True)
            return Outcome.FAILED
        return Outcome.TAKEN

    async def hand_over(self, message: InboundMessage) -> None:
        """Offer a message that cannot come again: one the sink did not take is a drop."""
        outcome = await self.offer(message)
        if outcome is Outcome.FAILED:
            self.drop(Skip.SINK_ERROR, f"message {message.message_id}")
        elif outcome is Outcome.REFUSED:
            self.drop(Skip.STOPPING, f"message {message.message_id}")

    def describe(self, exc: BaseException) -> str:
        """An exception as `Type: message`, with this bot's secrets masked."""
        return self.redact(f"{type(exc).__name__}: {exc}")

    def redact(self, text: str) -> str:
        """`text` with this bot's secrets and any `/bot<token>` URL segment masked."""
        return self._redactor.redact(text)

    @property
    def _who(self) -> tuple[str, str]:
        return self.platform, self.bot_id
