"""Traces (DESIGN.md §9): the span names and attributes in one place, and the tracer in use.

Spans follow OpenTelemetry's GenAI semantic conventions at version 1.38.0 (`SEMCONV_VERSION`;
still "Development" status, so every name loopwarden writes is here, to move in one edit):
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
from contextlib import AbstractContextManager
from typing import Literal, Protocol

SEMCONV_VERSION = "1.38.0"
SCHEMA_URL = f"https://opentelemetry.io/schemas/{SEMCONV_VERSION}"

# Operation names (`gen_ai.operation.name`, and the first word of each span's name).
INVOKE_AGENT = "invoke_agent"
CHAT = "chat"
EXECUTE_TOOL = "execute_tool"
APPLY_GUARDRAIL = "apply_guardrail"
MESSAGE = "message"
"""The root span of a message's trace (not a GenAI operation)."""

# GenAI attributes (semantic conventions 1.38.0).
OPERATION_NAME = "gen_ai.operation.name"
PROVIDER_NAME = "gen_ai.provider.name"
REQUEST_MODEL = "gen_ai.request.model"
AGENT_NAME = "gen_ai.agent.name"
CONVERSATION_ID = "gen_ai.conversation.id"
TOOL_NAME = "gen_ai.tool.name"
TOOL_CALL_ID = "gen_ai.tool.call.id"
TOOL_TYPE = "gen_ai.tool.type"
USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
INPUT_MESSAGES = "gen_ai.input.messages"
OUTPUT_MESSAGES = "gen_ai.output.messages"
ERROR_TYPE = "error.type"

# Guardrail attributes (the GenAI group's proposal; not in 1.38.0).
GUARDRAIL_NAME = "gen_ai.guardrail.name"
GUARDRAIL_RESULT = "gen_ai.guardrail.result"
GUARDRAIL_CODE = "gen_ai.guardrail.code"
GUARDRAIL_SHADOW = "gen_ai.guardrail.shadow"
ALLOWED = "allowed"
REFUSED = "refused"
SHADOW_REFUSED = "shadow_refused"
"""The result of a refusal a guard in shadow mode would have made: the turn went on."""

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
HTTP_STATUS = "http.response.status_code"
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
    ) -> AbstractContextManager[Span]:
        """A span, current inside the `with` block.

        Its parent is the current span, or the W3C `traceparent` in `parent` (the headers
        of a request from a traced caller), or none with `root`.
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
    ) -> AbstractContextManager[Span]:
        """`NO_SPAN`."""
        return NO_SPAN

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


def text_messages(role: str, text: str) -> str:
    """`gen_ai.input.messages` / `gen_ai.output.messages` for one text message, as JSON."""
    return json.dumps([{"role": role, "parts": [{"type": "text", "content": text}]}])
