"""Key masking and usage reading on relayed bodies, chunk by chunk."""

from __future__ import annotations

import base64
import binascii
import gzip
import json
import zlib
from itertools import zip_longest
from urllib.parse import quote

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.proxy.anthropic import AnthropicProvider
from gateway.proxy.gemini import GeminiProvider
from gateway.proxy.openai import OpenAIProvider
from gateway.proxy.provider import Usage
from gateway.proxy.relay import (
    MAX_INFLATED_CHUNK,
    BodyDecoder,
    EncodedBodyError,
    KeyMasker,
    UsageScanner,
    body_usage,
    masked_forms,
)

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


@given(
    st.lists(st.sampled_from([b"", b"x", b"\\/", b"%2F", b"s", b"sk-", b"=="]), max_size=8),
    st.lists(st.integers(min_value=0, max_value=300), max_size=6),
)
def test_issue10_a_whole_body_is_masked_as_its_chunks_are(
    fillers: list[bytes], cuts: list[int]
) -> None:
    odd = "sk-up/stream+5ecret=0123/456789abcdef"
    forms = [form.encode() for form in masked_forms(odd)]
    # Every form, at the start, between fillers and at the end, and two side by side.
    body = b"".join(form + filler for form, filler in zip_longest(forms, fillers, fillvalue=b""))
    body += forms[0] + forms[-1]
    points = sorted({min(c, len(body)) for c in cuts})
    chunks = [body[a:b] for a, b in zip([0, *points], [*points, len(body)], strict=True)]
    whole = KeyMasker(masked_forms(odd)).whole(body)
    assert whole == relay(KeyMasker(masked_forms(odd)), chunks)
    assert len(whole) == len(body)
    assert not [form for form in forms if form in whole]


def test_issue10_a_whole_body_without_secrets_is_passed_as_it_is() -> None:
    body = b'{"id": "chatcmpl-1"}'
    assert KeyMasker([]).whole(body) is body


def test_issue10_a_whole_json_body_reports_its_usage() -> None:
    openai_usage = OpenAIProvider().usage
    completion = {"usage": {"prompt_tokens": 3, "completion_tokens": 4}}
    assert body_usage(openai_usage, json.dumps(completion).encode()) == Usage(3, 4)
    assert body_usage(openai_usage, b"not json") is None
    assert body_usage(openai_usage, b"\xff\xfe") is None
    assert body_usage(openai_usage, b'[{"usage": {"prompt_tokens": 3}}, 7]') == Usage(3, None)


ODD_KEY = "sk-up/stream+5ecret=0123/456789abcdef"


@given(st.binary(max_size=20), st.binary(max_size=5), st.booleans(), st.integers(0, 200))
def test_issue9_a_key_inside_base64_is_masked_at_any_alignment(
    before: bytes, after: bytes, urlsafe: bool, cut: int
) -> None:
    plain = before + ODD_KEY.encode() + after
    encoded = (base64.urlsafe_b64encode if urlsafe else base64.b64encode)(plain)
    point = min(cut, len(encoded))
    masked = relay(KeyMasker(masked_forms(ODD_KEY)), [encoded[:point], encoded[point:]])
    assert len(masked) == len(encoded)
    assert b"*" in masked
    # Whatever the masked text decodes to, the key is not in it.
    standard = masked.replace(b"-", b"+").replace(b"_", b"/").replace(b"*", b"A")
    try:
        recovered = base64.b64decode(standard)
    except binascii.Error:
        return
    assert ODD_KEY.encode() not in recovered


def test_issue9_escaped_and_percent_encoded_keys_are_masked() -> None:
    escaped = ODD_KEY.replace("/", "\\/")
    percent = quote(ODD_KEY, safe="")
    body = f'{{"a": "{escaped}", "b": "{percent}", "c": "{percent.lower()}"}}'.encode()
    masked = relay(KeyMasker(masked_forms(ODD_KEY)), [body[:30], body[30:]])
    assert (
        masked
        == (
            f'{{"a": "{"*" * len(escaped)}", "b": "{"*" * len(percent)}", '
            f'"c": "{"*" * len(percent)}"}}'
        ).encode()
    )
    assert masked_forms("") == []


def decode(encoding: str, data: bytes, cuts: int = 7) -> bytes:
    decoder = BodyDecoder(encoding)
    size = max(1, len(data) // cuts)
    pieces = [decoder.feed(data[i : i + size]) for i in range(0, len(data), size)]
    return b"".join(pieces) + decoder.finish()


def test_issue9_gzip_and_both_deflates_are_decoded_chunk_by_chunk() -> None:
    body = json.dumps({"key": KEY, "filler": "x" * 5000}).encode()
    raw = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    assert decode("gzip", gzip.compress(body)) == body
    assert decode("X-GZIP", gzip.compress(body)) == body
    assert decode("deflate", zlib.compress(body)) == body
    assert decode("deflate", raw.compress(body) + raw.flush()) == body
    assert decode("identity", body) == body
    assert decode("", body) == body
    assert BodyDecoder("").encoding is None


@pytest.mark.parametrize("encoding", ["br", "zstd", "gzip, br", "compress", "x-custom"])
def test_issue9_other_encodings_are_refused(encoding: str) -> None:
    with pytest.raises(EncodedBodyError, match="content-encoding"):
        BodyDecoder(encoding)


def test_issue9_corrupt_truncated_and_bomb_bodies_are_errors() -> None:
    body = gzip.compress(b"x" * 1000)
    with pytest.raises(EncodedBodyError, match="corrupt"):
        decode("gzip", b"\x1f\x8b" + b"\x00" * 40)
    with pytest.raises(EncodedBodyError, match="truncated"):
        decode("gzip", body[: len(body) // 2], cuts=1)
    bomb = gzip.compress(b"\x00" * (MAX_INFLATED_CHUNK + 1))
    with pytest.raises(EncodedBodyError, match="limit"):
        BodyDecoder("gzip").feed(bomb)


def test_nothing_is_held_back_when_no_key_could_start() -> None:
    masker = KeyMasker([KEY])
    assert masker.feed(b"data: {}\n\n") == b"data: {}\n\n"
    assert masker.feed(b"ends with sk-li") == b"ends with "
    assert masker.feed(b"ght") == b"sk-light"
    assert KeyMasker([]).feed(b"sk-li") == b"sk-li"


def test_an_empty_chunk_keeps_what_could_start_a_key() -> None:
    masker = KeyMasker([KEY])
    assert masker.feed(b"") == b""
    assert masker.feed(b"ends with sk-li") == b"ends with "
    assert masker.feed(b"") == b""
    assert masker.flush() == b"sk-li"


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
