"""Anthropic-compatible routes (`/anthropic/v1/...`): x-api-key, the Messages API.

Guarded calls: POST `v1/messages` (`messages`; `system` is not one of the last two
messages, so it is not part of the fingerprint). Every other path (`v1/models`,
`v1/messages/count_tokens`, …) is forwarded unguarded, still behind the proxy key. The
client's `anthropic-version` and `anthropic-beta` headers pass through; when the client
sends no version, the proxy sends `2023-06-01`.
"""

from __future__ import annotations

from collections.abc import Mapping

from multidict import MultiMapping

from gateway.proxy.provider import (
    ERROR_STATUS,
    ErrorKind,
    GuardedCall,
    Usage,
    bearer,
    count,
    first_count,
    json_object,
    message_list,
    total,
)

DEFAULT_VERSION = "2023-06-01"
_ERROR_TYPES: Mapping[ErrorKind, str] = {
    "refused": "rate_limit_error",
    "bad_request": "invalid_request_error",
    "unauthorized": "authentication_error",
    "not_found": "not_found_error",
    "unreachable": "api_error",
    "timeout": "api_error",
    "unavailable": "api_error",
}


class AnthropicProvider:
    """The Anthropic wire conventions."""

    @property
    def name(self) -> str:
        """The route prefix."""
        return "anthropic"

    def credential(self, headers: Mapping[str, str], query: Mapping[str, str]) -> str | None:
        """`x-api-key` (the SDK's api_key), or `Authorization: Bearer` (its auth_token)."""
        return headers.get("x-api-key") or bearer(headers)

    def upstream_url(self, base_url: str, tail: str) -> str:
        """The base URL is the host root; the path keeps its /v1."""
        return f"{base_url}/{tail}"

    def upstream_query(self, query: MultiMapping[str]) -> list[tuple[str, str]]:
        """The query string as it came."""
        return list(query.items())

    def upstream_auth(self, api_key: str | None, headers: Mapping[str, str]) -> dict[str, str]:
        """`x-api-key`, and an `anthropic-version` when the client sent none."""
        auth = {"x-api-key": api_key} if api_key else {}
        if "anthropic-version" not in headers:
            auth["anthropic-version"] = DEFAULT_VERSION
        return auth

    def describe(self, method: str, tail: str, body: bytes) -> GuardedCall | None:
        """Messages API calls are guarded LLM calls."""
        if method != "POST" or tail != "v1/messages":
            return None
        data = json_object(body)
        if data is None or not isinstance(data.get("model"), str):
            return None
        messages = message_list(data.get("messages"))
        if messages is None:
            return None
        limit = first_count(data, "max_tokens")
        return GuardedCall(str(data["model"]), messages, data.get("stream") is True, limit)

    def usage(self, data: object) -> Usage | None:
        """`usage` of a message or `message_delta`; `message.usage` of `message_start`.

        Cache writes and reads are input tokens too.
        """
        if not isinstance(data, dict):
            return None
        usage = data.get("usage")
        message = data.get("message")
        if not isinstance(usage, dict) and isinstance(message, dict):
            usage = message.get("usage")
        if not isinstance(usage, dict):
            return None
        return Usage(
            total(
                usage.get("input_tokens"),
                usage.get("cache_creation_input_tokens"),
                usage.get("cache_read_input_tokens"),
            ),
            count(usage.get("output_tokens")),
        )

    def status(self, kind: ErrorKind) -> int:
        """The usual status: a refusal is a 429 (`x-should-retry: false` stops the SDK)."""
        return ERROR_STATUS[kind]

    def error_body(self, kind: ErrorKind, code: str, message: str) -> Mapping[str, object]:
        """`{"type": "error", "error": {"type", "message"}}`, plus our code in the error.

        The code is `error.details.error_code`, where the SDK reads `e.error_code`, and
        `error.code`, where earlier releases of this proxy put it.
        """
        return {
            "type": "error",
            "error": {
                "type": _ERROR_TYPES[kind],
                "message": message,
                "code": code,
                "details": {"error_code": code},
            },
        }
