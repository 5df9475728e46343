"""Gemini-compatible routes (`/gemini/...`): x-goog-api-key or `?key=`, generateContent.

Guarded calls: POST `{version}/models/{model}:generateContent` and
`:streamGenerateContent` (`contents` are the messages). Every other path (model lists,
`countTokens`, …) is forwarded unguarded, still behind the proxy key. A `key` the client
put in the query string is never forwarded: the upstream gets its own key as
`x-goog-api-key`, so no key ever travels in a URL that a log could print.

A refusal is HTTP 400 `FAILED_PRECONDITION` (Google's status for "do not retry until the
state is fixed"), not 429 `RESOURCE_EXHAUSTED`: google-genai's retry options and the
clients built on it retry 408, 429, 500, 502, 503 and 504 whatever the body says, and
each retry of a loop would be refused as `loop_paused`, hiding `loop_detected`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from multidict import MultiMapping

from gateway.proxy.provider import (
    ERROR_STATUS,
    ErrorKind,
    GuardedCall,
    Usage,
    bearer,
    first_count,
    json_object,
    message_list,
    total,
)

_CALL = re.compile(r"v1(?:alpha|beta)?/models/([^/:]+):(generateContent|streamGenerateContent)")
_STATUS: Mapping[ErrorKind, str] = {
    "refused": "FAILED_PRECONDITION",
    "bad_request": "INVALID_ARGUMENT",
    "unauthorized": "UNAUTHENTICATED",
    "not_found": "NOT_FOUND",
    "unreachable": "UNAVAILABLE",
    "timeout": "DEADLINE_EXCEEDED",
    "unavailable": "UNAVAILABLE",
}


class GeminiProvider:
    """The Gemini API (generativelanguage) wire conventions."""

    @property
    def name(self) -> str:
        """The route prefix."""
        return "gemini"

    def credential(self, headers: Mapping[str, str], query: Mapping[str, str]) -> str | None:
        """`x-goog-api-key`, `?key=`, or `Authorization: Bearer`."""
        return headers.get("x-goog-api-key") or query.get("key") or bearer(headers)

    def upstream_url(self, base_url: str, tail: str) -> str:
        """The base URL is the host root; the path keeps its version."""
        return f"{base_url}/{tail}"

    def upstream_query(self, query: MultiMapping[str]) -> list[tuple[str, str]]:
        """The query string without the client's `key`."""
        return [(name, value) for name, value in query.items() if name != "key"]

    def upstream_auth(self, api_key: str | None, headers: Mapping[str, str]) -> dict[str, str]:
        """`x-goog-api-key` with the upstream's key."""
        return {"x-goog-api-key": api_key} if api_key else {}

    def describe(self, method: str, tail: str, body: bytes) -> GuardedCall | None:
        """generateContent and streamGenerateContent are guarded LLM calls."""
        match = _CALL.fullmatch(tail)
        if method != "POST" or match is None:
            return None
        data = json_object(body)
        messages = message_list(data.get("contents")) if data is not None else None
        if messages is None or data is None:
            return None
        generation = data.get("generationConfig")
        limit = first_count(generation, "maxOutputTokens") if isinstance(generation, dict) else None
        stream = match.group(2) == "streamGenerateContent"
        return GuardedCall(match.group(1), messages, stream, limit)

    def usage(self, data: object) -> Usage | None:
        """`usageMetadata` of a response or stream chunk (thinking tokens are output)."""
        if not isinstance(data, dict):
            return None
        usage = data.get("usageMetadata")
        if not isinstance(usage, dict):
            return None
        return Usage(
            total(usage.get("promptTokenCount")),
            total(usage.get("candidatesTokenCount"), usage.get("thoughtsTokenCount")),
        )

    def status(self, kind: ErrorKind) -> int:
        """A refusal is a 400, outside Google's retry list; the rest as usual."""
        return 400 if kind == "refused" else ERROR_STATUS[kind]

    def error_body(self, kind: ErrorKind, code: str, message: str) -> Mapping[str, object]:
        """A google.rpc.Status with an ErrorInfo detail carrying our code."""
        return {
            "error": {
                "code": self.status(kind),
                "message": message,
                "status": _STATUS[kind],
                "details": [
                    {
                        "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                        "reason": code.upper(),
                        "domain": "loopwarden",
                        "metadata": {"code": code},
                    }
                ],
            }
        }
