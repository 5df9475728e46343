"""Key masking and usage reading on relayed bodies, chunk by chunk."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from gateway.proxy.anthropic import AnthropicProvider
from gateway.proxy.gemini import GeminiProvider
from gateway.proxy.openai import OpenAIProvider
from gateway.proxy.provider import Usage
from gateway.proxy.relay import KeyMasker, UsageScanner

KEY = "sk-live-abcdef0123456789"


def relay(masker: KeyMasker, chunks: list[bytes]) -> bytes:
    return b"".join(masker.feed(chunk) for chunk in chunks) + masker.flush()


@given(
    st.binary(max_size=40),
    st.binary(max_size=40),
    st.lists(st.integers(min_value=0, max_value=200), max_size=6),
)
def test_a_key_is_masked_wherever_the_chunks_split_it(
    before: bytes, after: bytes, cuts: list[int]
) -> None:
    body = before + KEY.encode() + after + KEY.encode()
    points = sorted({min(c, len(body)) for c in cuts})
    chunks = [body[a:b] for a, b in zip([0, *points], [*points, len(body)], strict=True)]
    masked = relay(KeyMasker([KEY]), chunks)
    assert KEY.encode() not in masked
    assert len(masked) == len(body)
    assert masked == body.replace(KEY.encode(), b"*" * len(KEY))


def test_nothing_is_held_back_when_no_key_could_start() -> None:
    masker = KeyMasker([KEY])
    assert masker.feed(b"data: {}\n\n") == b"data: {}\n\n"
    assert masker.feed(b"ends with sk-li") == b"ends with "
    assert masker.feed(b"ght") == b"sk-light"
    assert KeyMasker([]).feed(b"sk-li") == b"sk-li"


def test_openai_usage_from_the_final_stream_chunk() -> None:
    scanner = UsageScanner(OpenAIProvider().usage, sse=True)
    chunk = {"choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 30}}
    stream = f'data: {{"choices": [{{"delta": {{"content": "hi"}}}}]}}\n\ndata: {json.dumps(chunk)}'
    for piece in (stream[:25].encode(), stream[25:].encode(), b"\n\ndata: [DONE]\n\n"):
        scanner.feed(piece)
    assert scanner.finish() == Usage(12, 30)


def test_a_stream_without_usage_reports_none() -> None:
    scanner = UsageScanner(OpenAIProvider().usage, sse=True)
    scanner.feed(b'data: {"choices": []}\n\ndata: [DONE]\n\n')
    assert scanner.finish() is None


def test_anthropic_usage_merges_message_start_and_delta() -> None:
    scanner = UsageScanner(AnthropicProvider().usage, sse=True)
    start = {
        "type": "message_start",
        "message": {
            "usage": {"input_tokens": 40, "cache_read_input_tokens": 60, "output_tokens": 1}
        },
    }
    delta = {"type": "message_delta", "usage": {"output_tokens": 25}}
    scanner.feed(f"event: message_start\ndata: {json.dumps(start)}\n\n".encode())
    scanner.feed(f"event: message_delta\ndata: {json.dumps(delta)}\n\n".encode())
    assert scanner.finish() == Usage(100, 25)


def test_gemini_usage_from_a_json_array_with_thinking_tokens() -> None:
    scanner = UsageScanner(GeminiProvider().usage, sse=False)
    chunks = [
        {"usageMetadata": {"promptTokenCount": 5, "candidatesTokenCount": 1}},
        {
            "usageMetadata": {
                "promptTokenCount": 5,
                "candidatesTokenCount": 9,
                "thoughtsTokenCount": 4,
            }
        },
    ]
    body = json.dumps(chunks).encode()
    scanner.feed(body[:10])
    scanner.feed(body[10:])
    assert scanner.finish() == Usage(5, 13)


def test_a_body_over_the_limit_is_not_held() -> None:
    scanner = UsageScanner(OpenAIProvider().usage, sse=False, max_body=16)
    scanner.feed(b'{"usage": {"prompt_tokens": 1, "completion_tokens": 2}}')
    assert scanner.finish() is None


def test_responses_api_usage() -> None:
    event = {
        "type": "response.completed",
        "response": {"usage": {"input_tokens": 3, "output_tokens": 4}},
    }
    assert OpenAIProvider().usage(event) == Usage(3, 4)
    assert OpenAIProvider().usage({"usage": {"prompt_tokens": True}}) == Usage(None, None)
