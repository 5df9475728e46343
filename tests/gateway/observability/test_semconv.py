"""One home for the semantic conventions (issue 25): traces and metrics name the same version,
and every name is the one the installed `opentelemetry-semantic-conventions` package spells."""

from __future__ import annotations

from opentelemetry.semconv._incubating.attributes import error_attributes, gen_ai_attributes
from opentelemetry.semconv._incubating.metrics import gen_ai_metrics
from opentelemetry.semconv.attributes import http_attributes
from opentelemetry.semconv.schemas import Schemas

from gateway.observability import metrics, semconv, tracing


def test_issue25_traces_and_metrics_pin_one_version() -> None:
    assert tracing.SEMCONV_VERSION == semconv.SEMCONV_VERSION == "1.38.0"
    assert tracing.SCHEMA_URL == semconv.SCHEMA_URL
    assert semconv.SCHEMA_URL in {schema.value for schema in Schemas}
    # The Prometheus names the dashboard reads come from the same names.
    assert metrics.TOKEN_USAGE_FAMILY == "gen_ai_client_token_usage"
    assert metrics.DURATION_FAMILY == "gen_ai_client_operation_duration_seconds"


def test_issue25_the_names_are_the_conventions_own() -> None:
    assert (semconv.TOKEN_USAGE, semconv.OPERATION_DURATION) == (
        gen_ai_metrics.GEN_AI_CLIENT_TOKEN_USAGE,
        gen_ai_metrics.GEN_AI_CLIENT_OPERATION_DURATION,
    )
    ours_theirs = [
        (semconv.OPERATION_NAME, gen_ai_attributes.GEN_AI_OPERATION_NAME),
        (semconv.PROVIDER_NAME, gen_ai_attributes.GEN_AI_PROVIDER_NAME),
        (semconv.REQUEST_MODEL, gen_ai_attributes.GEN_AI_REQUEST_MODEL),
        (semconv.AGENT_NAME, gen_ai_attributes.GEN_AI_AGENT_NAME),
        (semconv.CONVERSATION_ID, gen_ai_attributes.GEN_AI_CONVERSATION_ID),
        (semconv.TOOL_NAME, gen_ai_attributes.GEN_AI_TOOL_NAME),
        (semconv.TOOL_CALL_ID, gen_ai_attributes.GEN_AI_TOOL_CALL_ID),
        (semconv.TOOL_TYPE, gen_ai_attributes.GEN_AI_TOOL_TYPE),
        (semconv.USAGE_INPUT_TOKENS, gen_ai_attributes.GEN_AI_USAGE_INPUT_TOKENS),
        (semconv.USAGE_OUTPUT_TOKENS, gen_ai_attributes.GEN_AI_USAGE_OUTPUT_TOKENS),
        (semconv.INPUT_MESSAGES, gen_ai_attributes.GEN_AI_INPUT_MESSAGES),
        (semconv.OUTPUT_MESSAGES, gen_ai_attributes.GEN_AI_OUTPUT_MESSAGES),
        (semconv.TOKEN_TYPE, gen_ai_attributes.GEN_AI_TOKEN_TYPE),
        (semconv.ERROR_TYPE, error_attributes.ERROR_TYPE),
        (semconv.HTTP_STATUS, http_attributes.HTTP_RESPONSE_STATUS_CODE),
    ]
    operations = gen_ai_attributes.GenAiOperationNameValues
    tokens = gen_ai_attributes.GenAiTokenTypeValues
    ours_theirs += [
        (semconv.CHAT, operations.CHAT.value),
        (semconv.INVOKE_AGENT, operations.INVOKE_AGENT.value),
        (semconv.EXECUTE_TOOL, operations.EXECUTE_TOOL.value),
        (semconv.TOKEN_INPUT, tokens.INPUT.value),
        (semconv.TOKEN_OUTPUT, tokens.OUTPUT.value),
    ]
    assert [ours for ours, _ in ours_theirs] == [theirs for _, theirs in ours_theirs]
