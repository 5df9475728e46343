"""Tests for guards.call_loop: call fingerprints, circuits, uniqueness rules (issue 6)."""

from __future__ import annotations

import base64
import hashlib
import random
import re
import threading
from collections.abc import Mapping, Sequence
from types import MappingProxyType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from guards import call_loop
from guards.call_loop import (
    CallDecision,
    CallLoopGuard,
    CallLoopPolicy,
    Circuit,
    LoggedCall,
    PausedCircuit,
    UniquenessRule,
    circuit_key,
    fingerprint_call,
    is_provider_failure,
    normalise_text,
    preview_rule,
)

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
# Circuits
# ---------------------------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


A = fp("Check order 12345 at 10:00")
B = fp("Check order 12345, what is its status?")
SESSION = circuit_key("billing-bot", "run-1")


def send(guard: CallLoopGuard, fingerprint: str, at: float, circuit: str = SESSION) -> CallDecision:
    return guard.check(circuit=circuit, fingerprint=fingerprint, now=at)


def test_circuit_key_holds_agent_session_and_step() -> None:
    assert circuit_key("billing-bot", None) == "billing-bot"
    assert circuit_key("billing-bot", "") == "billing-bot"
    assert circuit_key("billing-bot", "run-1") == "billing-bot/session=run-1"
    assert circuit_key("billing-bot", "run-1", "page-3") == "billing-bot/session=run-1/step=page-3"
    # Separators inside values are escaped, so different triples never share a key.
    assert circuit_key("a/session=b", None) != circuit_key("a", "b")
    assert str(Circuit("bot", "s", "p")) == circuit_key("bot", "s", "p")
    with pytest.raises(ValueError, match="root"):
        Circuit("")


def test_issue6_sixth_identical_call_is_refused_and_pauses_the_circuit() -> None:
    guard = CallLoopGuard()
    decisions = [send(guard, A, 10.0 + i) for i in range(5)]
    assert all(d.allowed for d in decisions)
    assert [d.count for d in decisions] == [1, 2, 3, 4, 5]

    sixth = send(guard, A, 15.0)
    assert not sixth.allowed
    assert sixth.code == "loop_detected"
    assert sixth.retry_after == 300.0
    assert sixth.count == 6
    assert "billing-bot" in sixth.message
    assert "300 seconds" in sixth.message

    different = send(guard, B, 75.0)
    assert different.code == "loop_paused"
    assert different.retry_after == pytest.approx(240.0)
    assert not different.allowed

    other_session = send(guard, A, 75.0, circuit_key("billing-bot", "run-2"))
    other_key = send(guard, A, 75.0, circuit_key("support-bot", "run-1"))
    assert other_session.allowed
    assert other_key.allowed


def test_issue6_a_call_60_001_s_after_the_first_of_five_is_allowed() -> None:
    guard = CallLoopGuard()
    for i in range(5):
        assert send(guard, A, 100.0 + i * 10).allowed
    assert send(guard, A, 160.001).allowed
    assert send(guard, A, 160.002).code == "loop_detected"


def test_window_is_half_open() -> None:
    guard = CallLoopGuard(CallLoopPolicy(max_repeats=1, window_seconds=10.0))
    assert send(guard, A, 0.0).allowed
    assert send(guard, A, 10.0).allowed  # the first event counts in [0, 10)
    assert send(guard, A, 19.999).code == "loop_detected"


def test_issue6_occurrences_count_not_runs() -> None:
    guard = CallLoopGuard()
    sequence = [A, A, B, A, A, A]
    assert all(send(guard, f, 10.0 + i).allowed for i, f in enumerate(sequence))
    sixth_a = send(guard, A, 20.0)
    assert sixth_a.code == "loop_detected"


@pytest.mark.parametrize(
    ("status", "error"),
    [(429, None), (500, None), (502, None), (503, None), (529, None), (408, None)]
    + [(None, "timeout"), (None, "connection dropped")],
)
def test_issue6_provider_failures_are_not_counted(status: int | None, error: str | None) -> None:
    guard = CallLoopGuard()
    for i in range(20):
        decision = send(guard, A, 10.0 + i)
        assert decision.allowed
        assert guard.record_outcome(decision, status=status, error=error)
    assert is_provider_failure(status, error)


@pytest.mark.parametrize("status", [200, 400, 401, 404, 422])
def test_issue6_successes_and_other_4xx_are_counted(status: int) -> None:
    guard = CallLoopGuard()
    for i in range(5):
        decision = send(guard, A, 10.0 + i)
        assert decision.allowed
        assert not guard.record_outcome(decision, status=status)
    assert send(guard, A, 15.0).code == "loop_detected"


def test_concurrent_repeats_are_caught_before_their_outcome() -> None:
    guard = CallLoopGuard()
    pending = [send(guard, A, 10.0) for _ in range(5)]
    assert all(d.allowed for d in pending)
    assert send(guard, A, 10.0).code == "loop_detected"


def test_an_outcome_without_status_or_error_stays_counted() -> None:
    guard = CallLoopGuard()
    assert not is_provider_failure(None, None)
    assert not guard.record_outcome(send(guard, A, 0.0))


def test_refusals_cannot_be_uncounted() -> None:
    guard = CallLoopGuard(CallLoopPolicy(max_repeats=1))
    send(guard, A, 0.0)
    refused = send(guard, A, 1.0)
    assert not guard.record_outcome(refused, status=503)


def test_issue6_the_pause_ends_after_pause_seconds() -> None:
    guard = CallLoopGuard()
    for i in range(5):
        send(guard, A, 10.0 + i)
    assert send(guard, A, 15.0).code == "loop_detected"
    assert send(guard, A, 314.999).code == "loop_paused"
    after = send(guard, A, 315.0)
    assert after.allowed
    assert after.count == 1


def test_a_pause_shorter_than_the_window_keeps_the_counts() -> None:
    guard = CallLoopGuard(CallLoopPolicy(max_repeats=2, window_seconds=60.0, pause_seconds=5.0))
    send(guard, A, 0.0)
    send(guard, A, 1.0)
    assert send(guard, A, 2.0).code == "loop_detected"
    assert send(guard, B, 7.0).allowed
    assert send(guard, A, 7.0).code == "loop_detected"
    assert send(guard, A, 61.0).allowed


def test_issue6_reopen_lifts_the_pause_and_forgets_the_counts() -> None:
    guard = CallLoopGuard()
    for i in range(6):
        send(guard, A, 10.0 + i)
    assert guard.paused(now=20.0) == [PausedCircuit(SESSION, 295.0, "loop_detected", 1)]
    assert send(guard, B, 20.0).code == "loop_paused"
    assert guard.paused(now=20.0)[0].count == 2

    assert guard.reopen(SESSION, now=30.0)
    assert guard.paused(now=30.0) == []
    reopened = send(guard, A, 31.0)
    assert reopened.allowed
    assert reopened.count == 1
    assert not guard.reopen(SESSION, now=32.0)


def test_issue6_the_same_step_is_the_same_call() -> None:
    guard = CallLoopGuard()
    circuit = circuit_key("billing-bot", "run-1", "page-3")
    fields = {"session": "run-1", "step": "page-3", "model": MODEL}
    for attempt in range(5):
        fingerprint = fp(f"Extract the totals, attempt {attempt}")
        assert guard.check(circuit=circuit, fingerprint=fingerprint, fields=fields, now=1.0).allowed
    sixth = guard.check(circuit=circuit, fingerprint=fp("attempt 9"), fields=fields, now=2.0)
    assert sixth.code == "loop_detected"

    no_step = CallLoopGuard()
    for attempt in range(10):
        fingerprint = fp(f"Extract the totals, attempt {attempt}")
        assert no_step.check(circuit=SESSION, fingerprint=fingerprint, now=1.0).allowed


def test_idle_circuits_are_forgotten_and_the_table_is_capped() -> None:
    guard = CallLoopGuard(max_circuits=1000)
    for i in range(1000):
        send(guard, A, 0.0, circuit=f"bot/session={i}")
    assert len(guard) == 1000
    send(guard, A, 1.0, circuit="bot/session=new")
    assert len(guard) == 1000
    for i in range(300):
        send(guard, B, 100.0 + i * 0.001, circuit="bot/session=live")
    assert len(guard) == 1


def test_the_cap_forgets_the_least_recently_used_call_window() -> None:
    guard = CallLoopGuard(CallLoopPolicy(max_repeats=3), max_circuits=3)
    for circuit in ("c1", "c2", "c3", "c1"):
        send(guard, A, 1.0, circuit=circuit)
    send(guard, A, 2.0, circuit="c4")  # the table is full: c2 goes, not c1 or c3

    assert send(guard, A, 3.0, circuit="c1").count == 3
    assert send(guard, A, 3.0, circuit="c2").count == 1
    assert len(guard) == 3


def test_a_shrunken_table_is_replaced_a_few_entries_per_call() -> None:
    # 4,000 windows go idle, 300 stay live: once the idle ones are swept, the table (down
    # to a quarter of its peak) is replaced while calls go on. No call moves more than a
    # few entries (copying 25,000 at once stalled one call for ~20 ms), no count is lost
    # and the least recently used order survives.
    guard = CallLoopGuard(CallLoopPolicy(max_repeats=1_000_000, window_seconds=60.0))
    for i in range(4_000):
        send(guard, A, 0.0, circuit=f"idle/session={i}")
    live = [f"live/session={i}" for i in range(300)]
    counts = dict.fromkeys(live, 0)
    for circuit in live:
        counts[circuit] = send(guard, A, 30.0, circuit=circuit).count
    recency = list(live)  # least recently used first
    windows = guard._calls
    rng = random.Random(3)
    replaced = False
    at = 60.0
    for _ in range(3_000):
        at += 0.001
        circuit = rng.choice(live)
        before = len(windows._table)
        decision = send(guard, A, at, circuit=circuit)
        counts[circuit] += 1
        recency.remove(circuit)
        recency.append(circuit)
        assert decision.count == counts[circuit]
        if windows._draining is not None:
            replaced = True
            assert len(windows._table) <= before + call_loop._MOVE_PER_CALL + 1
    assert replaced
    assert windows._draining is None
    assert len(guard) == len(live)
    assert [key[0] for key in windows._table] == recency


def test_a_pause_after_a_reopen_ends_on_time() -> None:
    guard = CallLoopGuard(CallLoopPolicy(max_repeats=1, window_seconds=60.0, pause_seconds=5.0))
    send(guard, A, 0.0)
    assert send(guard, A, 1.0).code == "loop_detected"
    assert guard.reopen(SESSION, now=2.0)
    send(guard, A, 3.0)
    assert send(guard, A, 4.0).code == "loop_detected"  # paused until 9
    assert send(guard, B, 8.999).code == "loop_paused"
    assert send(guard, B, 9.0).allowed


def test_guard_uses_its_clock() -> None:
    clock = FakeClock()
    guard = CallLoopGuard(CallLoopPolicy(max_repeats=1, pause_seconds=30.0), clock=clock)
    assert guard.check(circuit=SESSION, fingerprint=A).allowed
    assert guard.check(circuit=SESSION, fingerprint=A).code == "loop_detected"
    clock.now += 29.0
    assert guard.check(circuit=SESSION, fingerprint=B).retry_after == pytest.approx(1.0)
    clock.now += 1.0
    assert guard.check(circuit=SESSION, fingerprint=B).allowed


def test_threads_never_admit_more_than_the_limit() -> None:
    guard = CallLoopGuard()
    allowed: list[bool] = []
    lock = threading.Lock()

    def worker() -> None:
        for _ in range(50):
            decision = send(guard, A, 5.0)
            with lock:
                allowed.append(decision.allowed)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert allowed.count(True) == 5


def test_identical_calls_never_exceed_max_repeats_in_any_window() -> None:
    seen = {"examples": 0, "loop_detected": 0, "loop_paused": 0}
    # Bursts (short gaps) trip the guard; long gaps let windows and pauses end.
    gaps = st.floats(min_value=0.0, max_value=1.0) | st.floats(min_value=0.0, max_value=30.0)

    @settings(max_examples=200, deadline=None)
    @given(
        st.lists(gaps, min_size=5, max_size=60),
        st.integers(min_value=1, max_value=6),
        st.floats(min_value=0.5, max_value=50.0),
        st.floats(min_value=0.0, max_value=40.0),
    )
    def prop(gaps: list[float], max_repeats: int, window: float, pause: float) -> None:
        guard = CallLoopGuard(CallLoopPolicy(max_repeats, window, pause))
        now, admitted, paused_until = 0.0, [], -1.0
        for gap in gaps:
            now += gap
            decision = send(guard, A, now)
            if decision.allowed:
                assert now >= paused_until  # nothing passes a running pause
                admitted.append(now)
            elif decision.code == "loop_detected":
                assert now >= paused_until
                paused_until = now + pause
            else:
                assert decision.code == "loop_paused"
                assert now < paused_until
                assert decision.retry_after == pytest.approx(paused_until - now)
            seen[decision.code] = seen.get(decision.code, 0) + 1
        for start in admitted:
            assert sum(start <= t < start + window for t in admitted) <= max_repeats
        seen["examples"] += 1

    prop()
    # Not vacuous: the guard trips and pauses in a good share of the examples.
    assert seen["loop_detected"] >= seen["examples"] // 4, seen
    assert seen["loop_paused"] >= seen["examples"] // 4, seen


def test_policy_from_dict() -> None:
    assert CallLoopPolicy.from_dict(None) == CallLoopPolicy()
    assert CallLoopPolicy.from_dict({}) == CallLoopPolicy(5, 60.0, 300.0)
    policy = CallLoopPolicy.from_dict(
        {"max_repeats": "3", "window_seconds": "2m", "pause_seconds": 10, "extra": 1}
    )
    assert policy == CallLoopPolicy(3, 120.0, 10.0)


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"max_repeats": 0}, "max_repeats"),
        ({"max_repeats": 2.5}, "max_repeats"),
        ({"max_repeats": True}, "max_repeats"),
        ({"window_seconds": 0}, "window_seconds"),
        ({"window_seconds": "soon"}, "window_seconds"),
        ({"pause_seconds": -1}, "pause_seconds"),
        ({"pause_seconds": float("nan")}, "pause_seconds"),
    ],
)
def test_policy_errors_name_the_field(data: Mapping[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        CallLoopPolicy.from_dict(data)


# ---------------------------------------------------------------------------------------
# Uniqueness rules
# ---------------------------------------------------------------------------------------


def rule(**overrides: object) -> UniquenessRule:
    data: dict[str, object] = {
        "name": "once-per-step",
        "fields": ["session", "step"],
        "max_calls": 1,
        "window_seconds": "24h",
    }
    data.update(overrides)
    return UniquenessRule.from_dict(data)


def test_rule_from_dict() -> None:
    parsed = rule(filters={"feature": "inv*"}, action="pause")
    assert parsed.fields == ("session", "step")
    assert parsed.window_seconds == 86_400.0
    assert dict(parsed.filters) == {"feature": "inv*"}
    assert parsed.action == "pause"
    assert rule(window_seconds=1).window_seconds == 1.0
    assert rule(fields="customer").fields == ("customer",)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"fields": ["session", "tenant"]}, "fields"),
        ({"fields": []}, "fields"),
        ({"fields": ["step", "step"]}, "fields"),
        ({"max_calls": 0}, "max_calls"),
        ({"max_calls": "many"}, "max_calls"),
        ({"window_seconds": 0.5}, "window_seconds"),
        ({"window_seconds": 86_401}, "window_seconds"),
        ({"window_seconds": "25h"}, "window_seconds"),
        ({"window_seconds": "a while"}, "window_seconds"),
        ({"filters": {"tenant": "x"}}, "filters"),
        ({"filters": {"feature": ""}}, "filters"),
        ({"filters": ["feature"]}, "filters"),
        ({"action": "block"}, "action"),
        ({"name": ""}, "name"),
        ({"name": None}, "name"),
        ({"max_call": 3}, "max_call"),
    ],
)
def test_rule_errors_name_the_field(overrides: Mapping[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        rule(**overrides)


def test_rule_names_are_unique_in_a_guard() -> None:
    with pytest.raises(ValueError, match="rules"):
        CallLoopGuard(rules=[rule(), rule(max_calls=2)])


def ask(
    guard: CallLoopGuard, at: float, prompt: str = "Process page", **fields: str
) -> CallDecision:
    circuit = circuit_key("billing-bot", fields.get("session"))
    return guard.check(circuit=circuit, fingerprint=fp(prompt), fields=fields, now=at)


def test_issue6_reject_rule_refuses_with_duplicate_call() -> None:
    guard = CallLoopGuard(rules=[rule(window_seconds=60)])
    assert ask(guard, 0.0, "Process page 3", session="s1", step="page-3").allowed
    again = ask(guard, 10.0, "Please process page 3 now", session="s1", step="page-3")
    assert again.code == "duplicate_call"
    assert again.rule == "once-per-step"
    assert again.retry_after == pytest.approx(50.0)
    assert ask(guard, 10.0, session="s1", step="page-4").allowed
    assert ask(guard, 10.0, session="s2", step="page-3").allowed
    # Without a step the rule does not apply; and the window slides.
    assert ask(guard, 11.0, session="s1").allowed
    assert ask(guard, 11.0, session="s1").allowed
    assert ask(guard, 60.0, session="s1", step="page-3").allowed


@pytest.mark.parametrize("limit", [64, 65, 300])
def test_large_limits_slide_like_small_ones(limit: int) -> None:
    # Above 64 the event times of a key are a deque instead of a list.
    window = float(limit)
    guard = CallLoopGuard(
        CallLoopPolicy(max_repeats=limit, window_seconds=window),
        rules=[rule(fields=["session"], max_calls=limit, window_seconds=window)],
    )
    for t in range(limit):
        assert ask(guard, float(t), session="s1").allowed
    refused = ask(guard, limit - 0.5, session="s1")
    assert (refused.code, refused.retry_after) == ("loop_detected", 300.0)
    other = CallLoopGuard(rules=[rule(fields=["session"], max_calls=limit, window_seconds=window)])
    for t in range(limit):
        assert ask(other, float(t), f"call {t}", session="s1").allowed
    duplicate = ask(other, limit - 0.5, "another call", session="s1")
    assert (duplicate.code, duplicate.retry_after) == ("duplicate_call", 0.5)
    # One call a second never exceeds `limit` per `limit` seconds: the oldest leaves.
    for t in range(limit, 3 * limit):
        assert ask(other, float(t), f"call {t}", session="s1").allowed


def test_issue6_trailing_star_filters_match_prefixes() -> None:
    guard = CallLoopGuard(rules=[rule(fields=["session", "feature"], filters={"feature": "inv*"})])
    assert ask(guard, 0.0, session="s1", feature="invoices").allowed
    assert ask(guard, 1.0, session="s1", feature="invoices").code == "duplicate_call"
    assert ask(guard, 1.0, session="s1", feature="billing").allowed
    assert ask(guard, 2.0, session="s1", feature="billing").allowed

    exact = CallLoopGuard(rules=[rule(fields=["session"], filters={"feature": "inv"})])
    assert ask(exact, 0.0, session="s1", feature="invoices").allowed
    assert ask(exact, 1.0, session="s1", feature="invoices").allowed
    assert ask(exact, 2.0, session="s1", feature="inv").allowed
    assert ask(exact, 3.0, session="s1", feature="inv").code == "duplicate_call"
    assert ask(exact, 4.0, session="s1").allowed  # no feature: the filter does not match


def test_issue6_pause_rule_pauses_the_group_even_with_a_different_prompt() -> None:
    same_prompt = rule(
        name="same-prompt-per-customer",
        fields=["customer", "prompt"],
        max_calls=3,
        window_seconds="10m",
        action="pause",
    )
    guard = CallLoopGuard(CallLoopPolicy(pause_seconds=300.0), rules=[same_prompt])
    for i in range(3):
        assert ask(guard, float(i), "Where is my refund?", session=f"s{i}", customer="c1").allowed
    tripped = ask(guard, 3.0, "Where is my refund?", session="s9", customer="c1")
    assert tripped.code == "duplicate_call"
    assert tripped.retry_after == 300.0
    later = ask(guard, 4.0, "Cancel my order", session="s10", customer="c1")
    assert later.code == "loop_paused"
    assert later.rule == "same-prompt-per-customer"
    assert ask(guard, 4.0, "Where is my refund?", customer="c2").allowed

    group = "rule=same-prompt-per-customer/customer=c1"
    assert [p.circuit for p in guard.paused(now=5.0)] == [group]
    assert guard.paused(now=5.0)[0].reason == "rule:same-prompt-per-customer"
    assert guard.reopen(group, now=6.0)
    assert ask(guard, 7.0, "Where is my refund?", customer="c1").allowed


def test_the_prompt_field_falls_back_to_the_fingerprint() -> None:
    guard = CallLoopGuard(rules=[rule(fields=["customer", "prompt"], max_calls=1)])
    assert ask(guard, 0.0, "Check order 12345 at 10:00", customer="c1").allowed
    assert ask(guard, 1.0, "Check order 67890 at 10:05", customer="c1").code == "duplicate_call"
    assert ask(guard, 1.0, "Extract page 2", customer="c1").allowed
    hashed = {"customer": "c1", "prompt": "sha:abc"}
    assert guard.check(circuit="x", fingerprint=A, fields=hashed, now=2.0).allowed
    assert guard.check(circuit="y", fingerprint=B, fields=hashed, now=3.0).code == "duplicate_call"


def test_rule_counts_are_released_on_provider_failure() -> None:
    guard = CallLoopGuard(rules=[rule()])
    first = ask(guard, 0.0, session="s1", step="p1")
    assert guard.record_outcome(first, status=503)
    assert ask(guard, 1.0, session="s1", step="p1").allowed


def test_issue6_preview_counts_the_calls_a_rule_would_have_stopped() -> None:
    calls = [
        LoggedCall(at=float(t), fingerprint=A, fields={"session": s, "step": p})
        for t, s, p in [(0, "s1", "p1"), (5, "s1", "p1"), (9, "s1", "p2"), (70, "s1", "p1")]
        + [(8, "s2", "p1"), (71, "s1", "p1"), (3, "s1", "p1")]
    ]
    assert preview_rule(rule(window_seconds=60), calls) == 3  # t=3, 5 and 71
    assert preview_rule(rule(window_seconds="24h"), calls) == 4
    assert preview_rule(rule(window_seconds=60, filters={"step": "p2"}), calls) == 0

    pausing = rule(fields=["session"], max_calls=2, window_seconds=60, action="pause")
    assert preview_rule(pausing, calls, pause_seconds=30.0) == 2  # t=5 trips, t=9 paused
    assert preview_rule(pausing, calls, pause_seconds=120.0) == 4


def test_preview_rule_is_pure() -> None:
    calls: Sequence[LoggedCall] = [LoggedCall(at=0.0, fingerprint=A, fields={"session": "s"})] * 3
    once = rule(fields=["session"])
    assert preview_rule(once, calls) == preview_rule(once, calls) == 2


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
                begin = call_loop._widen(kind, data, shape, start=start, end=end, floor=floor)
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
        content = call_loop._data_url_bytes(value) if value.startswith("data:") else None
        if content is None and payload:
            content = call_loop._decode_base64(value)
        if content is None:
            text = _ref_normalise(value.encode("utf-8", "surrogatepass"))
            out += (b"S%d:" % len(text), text)
        else:
            out.append(b"B" + call_loop._blob(content))
    elif isinstance(value, dict | Mapping):
        out.append(b"{")
        for key in sorted(value, key=str):
            name = key if isinstance(key, str) else str(key)
            if structural and name in call_loop._VOLATILE_KEYS:
                continue
            raw = name.encode("utf-8", "surrogatepass")
            out += (b"K%d:" % len(raw), raw)
            inner = structural and name in call_loop._STRUCTURAL_KEYS
            inner_payload = inner and name in call_loop._PAYLOAD_KEYS
            _ref_encode(value[key], out, structural=inner, payload=inner_payload)
        out.append(b"}")
    elif isinstance(value, bytes | bytearray | memoryview):
        out.append(b"B" + call_loop._blob(bytes(value)))
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
