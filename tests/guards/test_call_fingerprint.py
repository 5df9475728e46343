"""Tests for guards.call_loop.normalise and .fingerprint: volatile tokens, identities (issue 6)."""

from __future__ import annotations

import base64
import hashlib
import random
import re
from collections.abc import Mapping, Sequence
from types import MappingProxyType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from guards.call_loop import fingerprint as fingerprints
from guards.call_loop import fingerprint_call, normalise_text
from guards.call_loop import normalise as normalising

MODEL = "gpt-4o-mini"
Message = dict[str, object]


def user(text: str) -> Message:
    return {"role": "user", "content": text}


def fp(*texts: str, model: str = MODEL) -> str:
    return fingerprint_call(model, [user(text) for text in texts])


def data_url(content: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64,{base64.b64encode(content).decode()}"


# ---------------------------------------------------------------------------------------
# Fingerprints
# ---------------------------------------------------------------------------------------


def test_issue6_order_number_and_time_are_volatile() -> None:
    assert fp("Check order 12345 at 10:00") == fp("Check order 67890 at 10:05")


def test_issue6_small_numbers_stay() -> None:
    assert fp("Extract the data of page 2") != fp("Extract the data of page 3")


def test_issue6_the_model_is_part_of_the_call() -> None:
    assert fp("Summarise this", model="gpt-4o") != fp("Summarise this", model="claude-sonnet-4")


def test_issue6_only_the_last_two_messages_count() -> None:
    short: list[Mapping[str, object]] = [
        user("Find the invoice"),
        {"role": "assistant", "content": "Which one?"},
    ]
    history: list[Mapping[str, object]] = [
        {"role": "system", "content": "You are a billing agent."},
        user("Hello"),
        {"role": "assistant", "content": "Hi"},
        *short,
    ]
    assert fingerprint_call(MODEL, history) == fingerprint_call(MODEL, short)
    assert fingerprint_call(MODEL, history) != fingerprint_call(MODEL, history[:-1])


def test_the_role_is_part_of_a_message() -> None:
    as_user = [{"role": "user", "content": "done"}]
    as_assistant = [{"role": "assistant", "content": "done"}]
    assert fingerprint_call(MODEL, as_user) != fingerprint_call(MODEL, as_assistant)


def test_issue6_tool_results_differing_only_in_tool_call_id_are_the_same() -> None:
    def openai_round(call_id: str) -> list[Mapping[str, object]]:
        call = {"name": "search", "arguments": '{"q": "refund policy"}'}
        return [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": call_id, "type": "function", "function": call}],
            },
            {"role": "tool", "tool_call_id": call_id, "content": "no results"},
        ]

    def anthropic_round(use_id: str) -> list[Mapping[str, object]]:
        tool_use = {"type": "tool_use", "id": use_id, "name": "search", "input": {"q": "x"}}
        result = {"type": "tool_result", "tool_use_id": use_id, "content": "no results"}
        return [
            {"role": "assistant", "content": [tool_use]},
            {"role": "user", "content": [result]},
        ]

    assert fingerprint_call(MODEL, openai_round("call_Ab12")) == fingerprint_call(
        MODEL, openai_round("call_Zz98")
    )
    assert fingerprint_call(MODEL, anthropic_round("toolu_01")) == fingerprint_call(
        MODEL, anthropic_round("toolu_02")
    )


def test_tool_name_and_arguments_stay_part_of_the_call() -> None:
    def tool_use(name: str, arguments: Mapping[str, object]) -> list[Mapping[str, object]]:
        part = {"type": "tool_use", "id": "toolu_1", "name": name, "input": arguments}
        return [{"role": "assistant", "content": [part]}]

    base = fingerprint_call(MODEL, tool_use("get_user", {"id": 7}))
    assert base != fingerprint_call(MODEL, tool_use("delete_user", {"id": 7}))
    # Inside tool arguments an "id" is data, not a provider-assigned volatile id.
    assert base != fingerprint_call(MODEL, tool_use("get_user", {"id": 8}))


def test_issue6_same_attachment_bytes_under_other_names_or_wrappers_are_the_same() -> None:
    content = b"\x89PNG\r\n\x1a\n fake image bytes"
    encoded = base64.b64encode(content).decode()
    wrappers: list[bytes | str] = [
        content,
        encoded,
        data_url(content),
        data_url(content, "application/octet-stream"),
    ]
    fingerprints = {fingerprint_call(MODEL, [user("What is this?")], [w]) for w in wrappers}
    assert len(fingerprints) == 1

    def openai_file(filename: str, media_type: str) -> list[Mapping[str, object]]:
        file = {"filename": filename, "file_data": data_url(content, media_type)}
        return [{"role": "user", "content": [{"type": "file", "file": file}]}]

    assert fingerprint_call(MODEL, openai_file("a.pdf", "application/pdf")) == fingerprint_call(
        MODEL, openai_file("invoice-2.pdf", "application/octet-stream")
    )

    def anthropic_image(media_type: str) -> list[Mapping[str, object]]:
        source = {"type": "base64", "media_type": media_type, "data": encoded}
        return [{"role": "user", "content": [{"type": "image", "source": source}]}]

    assert fingerprint_call(MODEL, anthropic_image("image/png")) == fingerprint_call(
        MODEL, anthropic_image("image/jpeg")
    )

    def gemini_inline(mime_type: str) -> list[Mapping[str, object]]:
        inline = {"mime_type": mime_type, "data": encoded}
        return [{"role": "user", "parts": [{"text": "What is this?"}, {"inline_data": inline}]}]

    assert fingerprint_call(MODEL, gemini_inline("image/png")) == fingerprint_call(
        MODEL, gemini_inline("image/webp")
    )


def test_issue6_different_attachment_bytes_differ() -> None:
    question = [user("What is this?")]
    assert fingerprint_call(MODEL, question, [b"first"]) != fingerprint_call(
        MODEL, question, [b"second"]
    )

    def openai_image(content: bytes) -> list[Mapping[str, object]]:
        part = {"type": "image_url", "image_url": {"url": data_url(content)}}
        return [{"role": "user", "content": [{"type": "text", "text": "What?"}, part]}]

    assert fingerprint_call(MODEL, openai_image(b"one")) != fingerprint_call(
        MODEL, openai_image(b"two")
    )


def test_issue6_a_small_counter_differs_unless_the_same_step_is_sent() -> None:
    attempt3 = [user("Extract the totals, attempt 3")]
    attempt4 = [user("Extract the totals, attempt 4")]
    assert fingerprint_call(MODEL, attempt3) != fingerprint_call(MODEL, attempt4)
    assert fingerprint_call(MODEL, attempt3, step="page-3") == fingerprint_call(
        MODEL, attempt4, step="page-3"
    )
    assert fingerprint_call(MODEL, attempt3, step="page-3") != fingerprint_call(
        MODEL, attempt3, step="page-4"
    )


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("on 2026-11-30 we", "on 2027-01-02 we"),
        ("at 2026-11-30T10:05:33.120+01:00 ok", "at 2026-12-01T23:59:59Z ok"),
        ("due 30/11/2026.", "due 01/12/2026."),
        ("due 11/30/26.", "due 12/1/27."),
        ("due 30.11.2026 and 30-11-2026", "due 1.12.2026 and 1-12-2026"),
        ("sent Nov 30 2026", "sent Dec 1 2026"),
        ("sent Monday, November 30th, 2026!", "sent Tuesday, December 1st, 2026!"),
        ("sent 30 Nov 2026", "sent 1 Dec 2026"),
        ("sent Mon, 30 Nov 2026", "sent Tue, 1 Dec 2026"),
        ("at 10:00", "at 9:41"),
        ("at 10:05:33 am", "at 4:15:00 PM"),
        ("at 3pm", "at 11 a.m."),
        ("id 550e8400-e29b-41d4-a716-446655440000.", "id 6fa459ea-ee8a-3ca4-894e-db77e160355e."),
        ("sha a3f9c2d10b", "sha 0c4e7f81d2"),
        ("sha deadbeef12", "sha feedface9876543210"),
        ("id call_Nn8aFV3BP0qHkfOMx7OEPYzv", "id call_qZ1mKk2Lr0"),
        ("id toolu_01A09q90qw90lq917835lq9", "id toolu_02XyZabc"),
        ("id msg_01XFDUDYJgAACzvnptvVoYEL", "id msg_7Zpq81Lm"),
        ("id chatcmpl-8a7bCdEf", "id chatcmpl-9ZyXwV"),
        ("id run_abc123def", "id run_Q9w8e7r6"),
        ("order 12345", "order 9876543210"),
        ("order ORD12345", "order ORD67890"),
    ],
)
def test_issue6_volatile_tokens_are_normalised(first: str, second: str) -> None:
    assert normalise_text(first) == normalise_text(second)
    assert normalise_text(first) != first


@pytest.mark.parametrize(
    "text",
    [
        "page 2",
        "version 1.2.3",
        "run_tests",
        "deadbeef",
        "call_weather",
        "a facade",
        "page2 h1 v2",
        "cafe1",
        "1234",
        "March 3",
        "12,345",
    ],
)
def test_words_that_merely_look_like_ids_stay(text: str) -> None:
    assert normalise_text(text) == text


JSON_SCALAR = st.none() | st.booleans() | st.integers() | st.text(max_size=20)
JSON = st.recursive(
    JSON_SCALAR,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
VOLATILE_ALPHABET = st.sampled_from(
    [*"0123456789abcdefxyzADFNTMZ :-_./,\x00", "Nov", "Monday", "call_", "am", "T", "\n", "é"]
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(VOLATILE_ALPHABET, max_size=40).map("".join)
    | st.text(max_size=80)
    | st.from_regex(r"[ ]?[a-f0-9]{0,12}[-:/. ]?[0-9a-f]{0,12}[ ,]?[0-9]{0,6}", fullmatch=True)
)
def test_normalisation_is_idempotent(text: str) -> None:
    once = normalise_text(text)
    assert normalise_text(once) == once


def shuffled(value: object, rng: random.Random) -> object:
    """The same JSON value with the insertion order of every dict shuffled."""
    if isinstance(value, dict):
        keys = list(value)
        rng.shuffle(keys)
        return {key: shuffled(value[key], rng) for key in keys}
    if isinstance(value, list):
        return [shuffled(item, rng) for item in value]
    return value


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.dictionaries(st.text(max_size=8), JSON, max_size=5), min_size=1, max_size=3),
    st.randoms(),
)
def test_fingerprint_is_stable_under_dict_key_order(
    messages: list[dict[str, object]], rng: random.Random
) -> None:
    reordered = [shuffled(message, rng) for message in messages]
    assert isinstance(reordered[0], dict)
    assert fingerprint_call(MODEL, messages) == fingerprint_call(
        MODEL, [m for m in reordered if isinstance(m, dict)]
    )


# Dates and times in the shapes the normaliser knows (and near misses), "d" a digit.
TOKEN_TEMPLATES = (
    "dddd-dd-dd",
    "dddd-dd-ddTdd:dd",
    "dddd-dd-ddTdd:dd:ddZ",
    "dddd-dd-dd dd:dd:dd.ddd+dd:dd",
    "dddd-dd-ddTdd:dd:dd-dddd",
    "dddd/dd/dd",
    "dd/dd/dddd",
    "d/d/dd",
    "dd-dd-dddd",
    "dd.dd.dddd",
    "dd:dd",
    "d:dd",
    "dd:dd:dd",
    "dd:dd:dd,d",
    "dd:dd pm",
    "d:dd A.M.",
    "dpm",
    "dd a.m.",
    "Nov dd dddd",
    "nov. ddth, dddd",
    "dd Nov dddd",
    "dst December, dddd",
    "Mon, dd Nov dddd",
    "Wednesday, September ddrd, dddd",
    "Sept d dddd",
    "ddddd",
    "ORDdddddd",
    "dddddddd-dddd-dddd-dddd-dddddddddddd",
    "ddd",
    "d",
)
WORDS = (
    "page",
    "order",
    "at",
    "on",
    "ref",
    "id",
    "deadbeef",
    "cafe",
    "facade",
    "run_tests",
    "call_weather",
    "file-name",
    "v",
    "h",
    "Z",
    "T",
    "x",
    "é",
    "\x00",
)
PROVIDER_PREFIXES = ("call_", "toolu_", "msg_", "run_", "fc_", "batch_", "chatcmpl-", "file-")
SEPARATORS = ("", " ", "  ", ", ", ".", "-", "_", ":", "/", "\n", '"', "\x00", "T", "a")


@st.composite
def volatile_texts(draw: st.DrawFn) -> str:
    """Text mixing dates, times, UUIDs, hex and provider ids, long and short numbers."""
    pieces: list[str] = []
    for _ in range(draw(st.integers(min_value=0, max_value=10))):
        kind = draw(st.integers(min_value=0, max_value=5))
        if kind == 0:
            template = draw(st.sampled_from(TOKEN_TEMPLATES))
            digits = iter(draw(st.lists(st.sampled_from("0123456789"), min_size=40)))
            piece = "".join(next(digits) if c == "d" else c for c in template)
        elif kind == 1:
            piece = str(draw(st.uuids()))
        elif kind == 2:
            piece = draw(st.from_regex(r"[0-9a-fA-F]{1,20}", fullmatch=True))
        elif kind == 3:
            suffix = draw(st.from_regex(r"[A-Za-z0-9]{0,14}", fullmatch=True))
            piece = draw(st.sampled_from(PROVIDER_PREFIXES)) + suffix
        elif kind == 4:
            piece = str(draw(st.integers(min_value=0, max_value=10**14)))
        else:
            piece = draw(st.sampled_from(WORDS))
        pieces.append(piece + draw(st.sampled_from(SEPARATORS)))
    return "".join(pieces)


@settings(max_examples=400, deadline=None)
@given(
    volatile_texts() | st.lists(VOLATILE_ALPHABET, max_size=40).map("".join) | st.text(max_size=60)
)
def test_issue6_normaliser_agrees_with_the_reference(text: str) -> None:
    assert normalise_text(text) == reference_normalise_text(text)


MESSAGE_PARTS = st.sampled_from(
    [
        {"type": "text", "text": "Check order 12345 at 10:05"},
        {"type": "image", "source": {"type": "base64", "data": "aGVsbG8=", "media_type": "x"}},
        {"type": "tool_use", "id": "toolu_01AbC", "name": "get_user", "input": {"id": 7}},
        {"type": "tool_result", "tool_use_id": "toolu_01AbC", "content": "done"},
        {"inline_data": {"mime_type": "image/png", "data": "aGVsbG8="}},
        {"image_url": {"url": "data:image/png;base64,aGVsbG8="}},
    ]
)
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "tool"])},
    optional={
        "content": volatile_texts() | st.lists(MESSAGE_PARTS, max_size=3) | st.none(),
        "tool_calls": st.lists(
            st.fixed_dictionaries(
                {
                    "id": st.just("call_Nn8aFV3BP0qHkfOMx7"),
                    "type": st.just("function"),
                    "function": st.fixed_dictionaries(
                        {"name": st.sampled_from(WORDS), "arguments": volatile_texts()}
                    ),
                }
            ),
            max_size=2,
        ),
        "name": st.sampled_from(WORDS),
        "extra": JSON,
        "tool_call_id": st.text(max_size=8),
    },
)


@settings(max_examples=150, deadline=None)
@given(st.lists(MESSAGE | st.dictionaries(st.text(max_size=8), JSON, max_size=5), max_size=3))
def test_issue6_fingerprint_agrees_with_the_reference(messages: list[dict[str, object]]) -> None:
    assert fingerprint_call(MODEL, messages) == reference_fingerprint(MODEL, messages)


def test_issue6_odd_values_fingerprint_as_before() -> None:
    class Named:
        def __repr__(self) -> str:
            return "Named(20261130)"

    messages: list[Mapping[str, object]] = [
        {
            "role": "user",
            "content": ("a", 1, 2.5, True, None, b"raw", bytearray(b"x"), Named()),
            "extra": {1: {2: "two", "3": [3.0]}, "id": 12345},
        },
        {"role": "tool", "content": MappingProxyType({"data": "aGVsbG8=", "id": "x"})},
    ]
    assert fingerprint_call(MODEL, messages) == reference_fingerprint(MODEL, messages)


# ---------------------------------------------------------------------------------------
# The normaliser and encoder as they were before the speed work (issue 6), kept here only
# as the reference the faster ones must agree with, byte for byte. The patterns are the
# old ones' text; `_widen` and the payload helpers did not change and are shared.
# ---------------------------------------------------------------------------------------

_REF_TOKEN_RX = re.compile(
    rb"0(?<![0-9]0)(?:(?<![0-9A-Za-z\x00]0)(?:[0-9a-fA-F]{7}(?:-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}"
    rb"-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}(?![0-9A-Za-z\x00])|[0-9a-fA-F]*(?![0-9A-Za-z\x00]))"
    rb"|(?=[0-9]{0,3}+(?:[-/.:]|[sS][tT]|[nN][dD]|[rR][dD]|[tT][hH]| ?[aApP]\.?[mM]"
    rb"| +(?:[jJ][aAuU]|[fF][eE]|[mM][aA]|[aA][pPuU]|[sS][eE]|[oO][cC]|[nN][oO]|[dD][eE])))"
    rb"(?:[0-9]?:[0-9]{2}(?::[0-9]{2}(?:[.,][0-9]+)?)?(?: ?(?i:[ap]\.?m\.?))?"
    rb"(?![0-9A-Za-z\x00])|[0-9]{3}-[0-9]{2}-[0-9]{2}(?:[T ][0-9]{2}:[0-9]{2}(?::[0-9]{2}"
    rb"(?:[.,][0-9]+)?)?(?:Z|[+-][0-9]{2}(?::?[0-9]{2})?)?)?(?![0-9A-Za-z\x00])"
    rb"|[0-9]{3}/[0-9]{1,2}/[0-9]{1,2}(?![0-9A-Za-z\x00])|[0-9]?(?:/[0-9]{1,2}/(?:[0-9]{4}"
    rb"|[0-9]{2})|-[0-9]{1,2}-[0-9]{4}|\.[0-9]{1,2}\.[0-9]{4})(?![0-9A-Za-z\x00])"
    rb"|(?P<ddate>[0-9]?(?:st|nd|rd|th)? +(?i:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?"
    rb"|apr(?:il)?|may|june?|july?|aug(?:ust)?|sep(?:t(?:ember)?)?|oct(?:ober)?"
    rb"|nov(?:ember)?|dec(?:ember)?)\.?,? +[0-9]{4}(?![0-9A-Za-z\x00]))"
    rb"|[0-9]? ?(?i:[ap]\.?m\.?)(?![0-9A-Za-z\x00])))"
    rb"|(?<=[a-fA-F]0)(?:(?P<uuidl>[0-9a-fA-F]{0,7}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}"
    rb"-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}(?![0-9A-Za-z\x00]))"
    rb"|(?P<hexl>[0-9a-fA-F]*(?![0-9A-Za-z\x00])))"
    rb"|(?P<mdate>(?<=[A-Za-z.] 0)[0-9]?(?:st|nd|rd|th)?,? +[0-9]{4}(?![0-9A-Za-z\x00]))"
    rb"|[0-9]{4,}(?![0-9]))"
)
_REF_NUMBER_RX = re.compile(rb"0(?<![0-9]0)[0-9]{4,}(?![0-9])")
_REF_PROVIDERS = (
    (
        b"_",
        re.compile(
            rb"_(?:(?<=(?<![0-9A-Za-z\x00])(?:call|resp|file|asst|step)_)"
            rb"|(?<=(?<![0-9A-Za-z\x00])(?:toolu|batch)_)|(?<=(?<![0-9A-Za-z\x00])(?:srvtoolu)_)"
            rb"|(?<=(?<![0-9A-Za-z\x00])(?:msg|run|req)_)|(?<=(?<![0-9A-Za-z\x00])(?:fc|rs)_)"
            rb"|(?<=(?<![0-9A-Za-z\x00])(?:thread)_))(?=[a-z]*[0-9A-Z])[A-Za-z0-9]{6,}"
        ),
    ),
    (
        b"-",
        re.compile(
            rb"\-(?:(?<=(?<![0-9A-Za-z\x00])(?:chatcmpl)\-)"
            rb"|(?<=(?<![0-9A-Za-z\x00])(?:cmpl|file)\-))(?=[a-z]*[0-9A-Z])[A-Za-z0-9]{6,}"
        ),
    ),
)


def _ref_normalise(data: bytes) -> bytes:
    for separator, pattern in _REF_PROVIDERS:
        if separator in data:
            data = pattern.sub(separator + b"\x00", data)
    shape = data.translate(bytes.maketrans(b"123456789", b"000000000"))
    out: list[bytes] = []
    emitted = search_from = 0
    while b"0" in shape:
        for match in _REF_TOKEN_RX.finditer(shape, search_from):
            start, end = match.span()
            if match.lastgroup is not None:
                kind, floor = match.lastgroup, emitted
                begin = normalising._widen(kind, data, shape, start=start, end=end, floor=floor)
                if begin < 0:
                    number = _REF_NUMBER_RX.match(shape, start)
                    search_from = start + 1 if number is None else number.end()
                    if number is not None:
                        out += (data[emitted:start], b"\x00")
                        emitted = search_from
                    break
                start = begin
            out += (data[emitted:start], b"\x00")
            emitted = end
        else:
            break
    return b"".join([*out, data[emitted:]]) if out else data


def reference_normalise_text(text: str) -> str:
    """`normalise_text` as it was: the reference for the faster one."""
    raw = text.encode("utf-8", "surrogatepass")
    return _ref_normalise(raw).decode("utf-8", "surrogatepass")


def _ref_encode(value: object, out: list[bytes], *, structural: bool, payload: bool) -> None:
    if isinstance(value, str):
        content = fingerprints._data_url_bytes(value) if value.startswith("data:") else None
        if content is None and payload:
            content = fingerprints._decode_base64(value)
        if content is None:
            text = _ref_normalise(value.encode("utf-8", "surrogatepass"))
            out += (b"S%d:" % len(text), text)
        else:
            out.append(b"B" + fingerprints._blob(content))
    elif isinstance(value, dict | Mapping):
        out.append(b"{")
        for key in sorted(value, key=str):
            name = key if isinstance(key, str) else str(key)
            if structural and name in fingerprints._VOLATILE_KEYS:
                continue
            raw = name.encode("utf-8", "surrogatepass")
            out += (b"K%d:" % len(raw), raw)
            inner = structural and name in fingerprints._STRUCTURAL_KEYS
            inner_payload = inner and name in fingerprints._PAYLOAD_KEYS
            _ref_encode(value[key], out, structural=inner, payload=inner_payload)
        out.append(b"}")
    elif isinstance(value, bytes | bytearray | memoryview):
        out.append(b"B" + fingerprints._blob(bytes(value)))
    elif isinstance(value, list | tuple):
        out.append(b"[")
        for item in value:
            _ref_encode(item, out, structural=structural, payload=False)
        out.append(b"]")
    elif value is None or isinstance(value, bool):
        out.append(b"n" if value is None else b"t" if value else b"f")
    else:
        text = _ref_normalise(repr(value).encode("utf-8", "surrogatepass"))
        out += (b"V%d:" % len(text), text)


def reference_fingerprint(model: str, messages: Sequence[Mapping[str, object]]) -> str:
    """`fingerprint_call` (no attachments, no step) as it was: the reference."""
    raw = model.encode("utf-8", "surrogatepass")
    out: list[bytes] = [b"M%d:" % len(raw), raw]
    for message in messages[-2:]:
        _ref_encode(message, out, structural=True, payload=False)
    out.append(b"A")
    return hashlib.blake2b(b"".join(out), digest_size=16, person=b"lw-call").hexdigest()
