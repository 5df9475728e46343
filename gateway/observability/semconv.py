"""OpenTelemetry semantic-convention names loopwarden writes, at one pinned version.

Traces (`gateway.observability.tracing`), the Prometheus GenAI metrics
(`gateway.observability.metrics`) and their OTLP twins (`gateway.observability.otel_metrics`)
all take their names from here, so they cannot disagree. The version is 1.38.0
(`SEMCONV_VERSION`); the GenAI conventions are still "Development" status, and 1.42.0
deprecated every `gen_ai.*` name in the core conventions, moving them to the separate
semantic-conventions-genai repository, which has made no release yet. The installed
`opentelemetry-semantic-conventions` package still carries the same strings (deprecated),
and `tests/gateway/observability/test_semconv.py` holds these to it. Plain strings, not
that package's constants: nothing of OpenTelemetry is imported while telemetry is off.
"""

from __future__ import annotations

SEMCONV_VERSION = "1.38.0"
SCHEMA_URL = f"https://opentelemetry.io/schemas/{SEMCONV_VERSION}"

# Operation names (`gen_ai.operation.name`, and the first word of each span's name).
INVOKE_AGENT = "invoke_agent"
CHAT = "chat"
EXECUTE_TOOL = "execute_tool"
APPLY_GUARDRAIL = "apply_guardrail"

# GenAI attributes.
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
TOKEN_TYPE = "gen_ai.token.type"
TOKEN_INPUT = "input"
TOKEN_OUTPUT = "output"
"""`gen_ai.token.type`'s values."""

# General attributes.
ERROR_TYPE = "error.type"
HTTP_STATUS = "http.response.status_code"

# Guardrail attributes (the GenAI group's proposal; not in 1.38.0).
GUARDRAIL_NAME = "gen_ai.guardrail.name"
GUARDRAIL_RESULT = "gen_ai.guardrail.result"
GUARDRAIL_CODE = "gen_ai.guardrail.code"
GUARDRAIL_SHADOW = "gen_ai.guardrail.shadow"
ALLOWED = "allowed"
REFUSED = "refused"
SHADOW_REFUSED = "shadow_refused"
"""The result of a refusal a guard in shadow mode would have made: the turn went on."""

# GenAI client metrics: name, unit, attributes (in this order, the Prometheus labels'
# order too) and advised bucket boundaries.
TOKEN_USAGE = "gen_ai.client.token.usage"
TOKEN_USAGE_UNIT = "{token}"
TOKEN_USAGE_ATTRIBUTES = (OPERATION_NAME, PROVIDER_NAME, REQUEST_MODEL, TOKEN_TYPE)
TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304)
OPERATION_DURATION = "gen_ai.client.operation.duration"
OPERATION_DURATION_UNIT = "s"
OPERATION_DURATION_ATTRIBUTES = (OPERATION_NAME, PROVIDER_NAME, REQUEST_MODEL, ERROR_TYPE)
DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48)


def prometheus_name(name: str) -> str:
    """A convention name as Prometheus spells it (`gen_ai.token.type`: `gen_ai_token_type`)."""
    return name.replace(".", "_")
