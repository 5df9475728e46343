"""OpenAI-compatible routes (`/openai/v1/...`): Bearer keys, chat completions and friends.

Guarded calls: POST `chat/completions` (`messages`), `responses` (`input`, a string or a
list of items) and `completions` (`prompt`). Every other path (`models`, `files`,
`embeddings`, …) is forwarded unguarded, still behind the proxy key. A refusal's error
`type` is `loop_guard_error` (not `rate_limit_error`, which clients tend to retry with
backoff); its `code` is the guard's code, which the SDK exposes as `e.code`.
"""

from __future__ import annotations

from collections.abc import Mapping

from multidict import MultiMapping

from gateway.proxy.provider import (
    ERROR_STATUS,
    ErrorKind,
    GuardedCall,
    Message,
    Usage,
    bearer,
    count,
    first_count,
    json_object,
    message_list,
)

_ERROR_TYPES: Mapping[ErrorKind, str] = {
    "refused": "loop_guard_error",
    "bad_request": "invalid_request_error",
    "unauthorized": "invalid_request_error",
    "not_found": "invalid_request_error",
    "unreachable": "upstream_error",
    "timeout": "upstream_error",
    "unavailable": "server_error",
}


class OpenAIProvider:
    """The OpenAI wire conventions (also those of Ollama, vLLM, llama.cpp servers)."""

    @property
    def name(self) -> str:
        """The route prefix."""
        return "openai"

    def credential(self, headers: Mapping[str, str], query: Mapping[str, str]) -> str | None:
        """`Authorization: Bearer <key>`, as the OpenAI SDKs send api_key."""
        return bearer(headers)

    def upstream_url(self, base_url: str, tail: str) -> str:
        """The base URL ends in /v1 like the route prefix: the rest of the path follows."""
        return f"{base_url}/{tail}"

    def upstream_query(self, query: MultiMapping[str]) -> list[tuple[str, str]]:
        """The query string as it came."""
        return list(query.items())

    def upstream_auth(self, api_key: str | None, headers: Mapping[str, str]) -> dict[str, str]:
        """Bearer auth with the upstream's key."""
        return {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def describe(self, method: str, tail: str, body: bytes) -> GuardedCall | None:
        """Chat completions, responses and completions are guarded LLM calls."""
        if method != "POST" or tail not in ("chat/completions", "responses", "completions"):
            return None
        data = json_object(body)
        if data is None or not isinstance(data.get("model"), str):
            return None
        messages: list[Message] | None
        if tail == "chat/completions":
            messages = message_list(data.get("messages"))
        else:
            prompt = data.get("input" if tail == "responses" else "prompt")
            messages = message_list(prompt) or [{"role": "user", "content": prompt}]
        if messages is None:
            return None
        limit = first_count(data, "max_completion_tokens", "max_tokens", "max_output_tokens")
        return GuardedCall(str(data["model"]), messages, data.get("stream") is True, limit)

    def usage(self, data: object) -> Usage | None:
        """`usage` of a completion or final stream chunk; `response.usage` of responses."""
        if not isinstance(data, dict):
            return None
        usage = data.get("usage")
        response = data.get("response")
        if not isinstance(usage, dict) and isinstance(response, dict):
            usage = response.get("usage")
        if not isinstance(usage, dict):
            return None
        prompt = count(usage.get("prompt_tokens"))
        completion = count(usage.get("completion_tokens"))
        return Usage(
            prompt if prompt is not None else count(usage.get("input_tokens")),
            completion if completion is not None else count(usage.get("output_tokens")),
        )

    def status(self, kind: ErrorKind) -> int:
        """The usual status: a refusal is a 429 (`x-should-retry: false` stops the SDK)."""
        return ERROR_STATUS[kind]

    def error_body(self, kind: ErrorKind, code: str, message: str) -> Mapping[str, object]:
        """`{"error": {"message", "type", "param", "code"}}`: the SDK exposes `e.code`."""
        return {
            "error": {"message": message, "type": _ERROR_TYPES[kind], "param": None, "code": code}
        }
