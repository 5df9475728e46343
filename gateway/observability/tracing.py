"""Traces (DESIGN.md §9): the span names and attributes in one place, and the tracer in use.

Spans follow OpenTelemetry's GenAI semantic conventions at the version pinned in
`gateway.observability.semconv` (1.38.0, still "Development" status), whose names this module
re-exports; the names that are loopwarden's own (`loopwarden.*`) are here:
one trace per message a hosted bot receives (`message <platform>`: platform, room, bot),
`invoke_agent` per turn, `chat` per model call (`gen_ai.request.model`,
`gen_ai.provider.name`, token usage), `execute_tool` per tool call and `apply_guardrail`
per guard decision. 1.38.0 names no guardrail span yet: `apply_guardrail` and the
`gen_ai.guardrail.*` attributes follow the GenAI group's proposal, and `loopwarden.*` are
our own. Message text goes into spans (`gen_ai.input.messages`, `gen_ai.output.messages`)
only with `telemetry.capture_content: true`; no secret ever does.

With `telemetry.otlp_endpoint` unset the tracer is `NO_TRACER`, this module's own no-op,
and nothing of OpenTelemetry is imported: `gateway.observability.telemetry.setup_tracing`
imports the SDK (`gateway.observability.otel`, the `[otel]` extra) only when an endpoint
is set. Hot paths
test `tracer().enabled` before they build attributes, so tracing off costs an attribute
read. (redis-py 8 imports `opentelemetry-api` by itself when that is installed; the API
alone records nothing, and the SDK stays unimported.)
"""

from __future__ import annotations

import json
from collections.abc import Mapping, MutableMapping
from types import TracebackType
from typing import Literal, Protocol

from gateway.observability.semconv import (
    AGENT_NAME,
    ALLOWED,
    APPLY_GUARDRAIL,
    CHAT,
    CONVERSATION_ID,
    ERROR_TYPE,
    EXECUTE_TOOL,
    GUARDRAIL_CODE,
    GUARDRAIL_NAME,
    GUARDRAIL_RESULT,
    GUARDRAIL_SHADOW,
    HTTP_STATUS,
    INPUT_MESSAGES,
    INVOKE_AGENT,
    OPERATION_NAME,
    OUTPUT_MESSAGES,
    PROVIDER_NAME,
    REFUSED,
    REQUEST_MODEL,
    SCHEMA_URL,
    SEMCONV_VERSION,
    SHADOW_REFUSED,
    TOOL_CALL_ID,
    TOOL_NAME,
    TOOL_TYPE,
    USAGE_INPUT_TOKENS,
    USAGE_OUTPUT_TOKENS,
)
from gateway.observability.visible import visible

# The semantic-convention names are re-exported: spans are written as `tracing.CHAT`.
__all__ = [
    "SEMCONV_VERSION",
    "SCHEMA_URL",
    "INVOKE_AGENT",
    "CHAT",
    "EXECUTE_TOOL",
    "APPLY_GUARDRAIL",
    "OPERATION_NAME",
    "PROVIDER_NAME",
    "REQUEST_MODEL",
    "AGENT_NAME",
    "CONVERSATION_ID",
    "TOOL_NAME",
    "TOOL_CALL_ID",
    "TOOL_TYPE",
    "USAGE_INPUT_TOKENS",
    "USAGE_OUTPUT_TOKENS",
    "INPUT_MESSAGES",
    "OUTPUT_MESSAGES",
    "ERROR_TYPE",
    "HTTP_STATUS",
    "GUARDRAIL_NAME",
    "GUARDRAIL_RESULT",
    "GUARDRAIL_CODE",
    "GUARDRAIL_SHADOW",
    "ALLOWED",
    "REFUSED",
    "SHADOW_REFUSED",
    "MESSAGE",
    "PLATFORM",
    "ROOM",
    "BOT",
    "MESSAGE_ID",
    "SENDER_IS_BOT",
    "STAGE",
    "DETAIL",
    "CIRCUIT",
    "CALL_OUTCOME",
    "TOOL_ACTION",
    "TOOL_CODE",
    "AttributeValue",
    "Attributes",
    "SpanKind",
    "Span",
    "OpenSpan",
    "Tracer",
    "NO_SPAN",
    "NO_TRACER",
    "tracer",
    "install",
    "TokenUsage",
    "call_outcome",
    "text_messages",
]

MESSAGE = "message"
"""The root span of a message's trace (not a GenAI operation)."""

# loopwarden's own.
PLATFORM = "loopwarden.platform"
ROOM = "loopwarden.room"
BOT = "loopwarden.bot"
MESSAGE_ID = "loopwarden.message.id"
SENDER_IS_BOT = "loopwarden.sender.is_bot"
STAGE = "loopwarden.stage"
DETAIL = "loopwarden.detail"
CIRCUIT = "loopwarden.circuit"
CALL_OUTCOME = "loopwarden.call.outcome"
TOOL_ACTION = "loopwarden.tool.action"
TOOL_CODE = "loopwarden.tool.code"

AttributeValue = str | bool | int | float
Attributes = Mapping[str, AttributeValue]
SpanKind = Literal["internal", "server", "client"]


class Span(Protocol):
    """What loopwarden sets on a span: attributes, and the error that ended it."""

    def set_attribute(self, key: str, value: AttributeValue) -> None:
        """Set one attribute."""

    def set_error(self, error_type: str) -> None:
        """Mark the span failed with `error.type` (a code, never an exception's message)."""


class OpenSpan(Span, Protocol):
    """A span as `Tracer.span` starts it: current until it ends, by `end` or by leaving
    the `with` block it opens (which marks it failed by an exception that leaves it)."""

    def end(self) -> None:
        """End the span now and make its parent current again."""

    def __enter__(self) -> Span:
        """The span itself (it is current already)."""

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """`set_error` with the exception's type, if one leaves the block, then `end`."""


class Tracer(Protocol):
    """Starts spans; `enabled` False means every call is a no-op (`NO_TRACER`)."""

    enabled: bool
    capture_content: bool

    def span(
        self,
        name: str,
        attributes: Attributes,
        *,
        kind: SpanKind = "internal",
        parent: Mapping[str, str] | None = None,
        root: bool = False,
    ) -> OpenSpan:
        """A span started now and current until it ends: `with tracer.span(...)`, or, on
        a per-message path, `end()` called in a `finally` (no `with` to enter or leave).

        Its parent is the current span, or the W3C `traceparent` in `parent` (the headers
        of a request from a traced caller), or none with `root`.
        """

    def instant(self, name: str, attributes: Attributes) -> None:
        """A span that takes no time, under the current span: where a verdict fell.

        What `with span(name, attributes): pass` records, without making it current.
        """

    def current(self) -> Span:
        """The span current in this task (a no-op span outside any)."""

    def inject(self, headers: MutableMapping[str, str]) -> None:
        """Write the current span's `traceparent` (and `tracestate`) into outbound headers."""

    def force_flush(self) -> bool:
        """Send every finished span now; False when the exporter did not finish in time."""

    def shutdown(self) -> None:
        """Flush and stop exporting."""


class _NoSpan:
    """A span that records nothing; also its own context manager."""

    __slots__ = ()

    def set_attribute(self, key: str, value: AttributeValue) -> None:
        """Nothing to set."""

    def set_error(self, error_type: str) -> None:
        """Nothing to mark."""

    def end(self) -> None:
        """Nothing to end."""

    def __enter__(self) -> _NoSpan:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


NO_SPAN = _NoSpan()


class _NoTracer:
    """The tracer when telemetry is off: every span is `NO_SPAN`."""

    enabled = False
    capture_content = False

    def span(
        self,
        name: str,
        attributes: Attributes,
        *,
        kind: SpanKind = "internal",
        parent: Mapping[str, str] | None = None,
        root: bool = False,
    ) -> OpenSpan:
        """`NO_SPAN`."""
        return NO_SPAN

    def instant(self, name: str, attributes: Attributes) -> None:
        """Records nothing."""

    def current(self) -> Span:
        """`NO_SPAN`."""
        return NO_SPAN

    def inject(self, headers: MutableMapping[str, str]) -> None:
        """Writes nothing: a caller's own `traceparent`, if forwarded, passes unchanged."""

    def force_flush(self) -> bool:
        """Nothing to flush."""
        return True

    def shutdown(self) -> None:
        """Nothing to stop."""


NO_TRACER: Tracer = _NoTracer()

_active: Tracer = NO_TRACER


def tracer() -> Tracer:
    """The tracer this process exports with (`NO_TRACER` until `setup_tracing` sets one)."""
    return _active


def install(active: Tracer) -> None:
    """Make `active` the process's tracer (`gateway.observability.telemetry` calls this)."""
    global _active  # noqa: PLW0603 - one tracer per process, as OpenTelemetry's own provider
    _active = active


class TokenUsage(Protocol):
    """The tokens a model call reported (None: not reported)."""

    @property
    def input_tokens(self) -> int | None: ...
    @property
    def output_tokens(self) -> int | None: ...


def call_outcome(outcome: str, status: int | None, usage: TokenUsage | None) -> None:
    """A model call's outcome, HTTP status and token usage on its current `chat` span.

    Called where each call's request-log entry is made; an outcome but `forwarded` marks
    the span failed with the outcome as `error.type` (`loop_detected`, `upstream_error`).
    """
    tracer = _active
    if not tracer.enabled:
        return
    span = tracer.current()
    span.set_attribute(CALL_OUTCOME, outcome)
    if status is not None:
        span.set_attribute(HTTP_STATUS, status)
    if usage is not None and usage.input_tokens is not None:
        span.set_attribute(USAGE_INPUT_TOKENS, usage.input_tokens)
    if usage is not None and usage.output_tokens is not None:
        span.set_attribute(USAGE_OUTPUT_TOKENS, usage.output_tokens)
    if outcome != "forwarded":
        span.set_error(outcome)


def guardrail(guard: str, code: str, result: str, *, shadow: bool, detail: str = "") -> None:
    """One guard's verdict as an `apply_guardrail <guard>` span under the current span.

    The span takes no time (`Tracer.instant`): it marks where in the turn or call the
    verdict fell. `detail`, the verdict in words, is written on one line (`visible`) and
    left out when empty. A verdict seen before (most are: an admitted pair, a halt, a
    refusal whose words carry no count) reuses its span's name and attributes, which no
    one changes once made (a span's later attributes are kept apart from them).
    """
    tracer = _active
    if not tracer.enabled:
        return
    made = _GUARDRAILS.get((guard, code, result, shadow, detail))
    if made is None:
        made = _guardrail_span(guard, code, result, shadow, detail)
    tracer.instant(made[0], made[1])


_GUARDRAILS: dict[tuple[str, str, str, bool, str], tuple[str, Attributes]] = {}
"""The name and attributes of each verdict's span, by its arguments to `guardrail`."""
_GUARDRAILS_KEPT = 1024
"""Verdicts kept at most; the table starts over when full (counts in words make new ones)."""


def _guardrail_span(
    guard: str, code: str, result: str, shadow: bool, detail: str
) -> tuple[str, Attributes]:
    """A verdict's span name and attributes, kept for the next same verdict."""
    attributes: dict[str, AttributeValue] = {
        OPERATION_NAME: APPLY_GUARDRAIL,
        GUARDRAIL_NAME: guard,
        GUARDRAIL_CODE: code,
        GUARDRAIL_RESULT: result,
        GUARDRAIL_SHADOW: shadow,
    }
    if detail:
        attributes[DETAIL] = visible(detail)
    made = (f"{APPLY_GUARDRAIL} {guard}", attributes)
    if len(_GUARDRAILS) >= _GUARDRAILS_KEPT:
        _GUARDRAILS.clear()
    _GUARDRAILS[guard, code, result, shadow, detail] = made
    return made


def text_messages(role: str, text: str) -> str:
    """`gen_ai.input.messages` / `gen_ai.output.messages` for one text message, as JSON."""
    return json.dumps([{"role": role, "parts": [{"type": "text", "content": text}]}])
