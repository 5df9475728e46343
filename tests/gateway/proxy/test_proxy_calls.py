"""Building a guarded call: rule fields, the retry number, hostile header bytes (issue 10)."""

from __future__ import annotations

import json

import pytest

from gateway.proxy.auth import ProxyClient
from gateway.proxy.calls import (
    CallFieldError,
    build_call,
    retry_number,
    rule_fields,
)
from gateway.proxy.openai import OpenAIProvider
from gateway.proxy.provider import GuardedCall
from guards.call_loop import fingerprint_call
from tests.gateway.proxy.proxy_helpers import MODEL, PROXY_KEY, raw_request, running_proxy

CLIENT = ProxyClient(agent="billing-bot", root="billing-bot")
CONVERSATION = [{"role": "user", "content": "hi"}]
AUTH = b"Authorization: Bearer " + PROXY_KEY.encode() + b"\r\n"


def _body(text: str, model: str = MODEL) -> bytes:
    return json.dumps({"model": model, "messages": [{"role": "user", "content": text}]}).encode()


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, 0),
        ("", 0),
        ("0", 0),
        ("3", 3),
        ("1000", 1000),
        ("1001", 0),
        ("-1", 0),
        ("+1", 0),
        (" 1", 0),
        ("1_0", 0),
        ("1e308", 0),
        ("inf", 0),
        ("NaN", 0),
        ("9" * 5000, 0),
        ("²", 0),
        ("٣", 0),
    ],
)
def test_issue10_retry_number_takes_plain_small_digits_only(
    value: str | None, expected: int
) -> None:
    assert retry_number(value) == expected


def test_issue10_rule_fields_come_from_the_headers_the_key_and_the_model() -> None:
    headers = {
        "X-Loopwarden-Session": "run-1",
        "X-Loopwarden-Step": "plan",
        "X-Loopwarden-Customer": "acme",
        "X-Loopwarden-User": "",
    }
    assert rule_fields(headers, CLIENT, MODEL) == {
        "session": "run-1",
        "step": "plan",
        "customer": "acme",
        "agent": "billing-bot",
        "model": MODEL,
    }


BOUND = ProxyClient(
    agent="billing-bot",
    root="billing-bot",
    bound=(("customer", "acme"),),
)


def test_issue20_a_key_s_fields_are_its_own_and_headers_fill_only_the_open_ones() -> None:
    headers = {"X-Loopwarden-Customer": "acme", "X-Loopwarden-User": "u-7"}
    # A header naming the key's own value is accepted; an open field takes the header.
    assert rule_fields(headers, BOUND, MODEL) == {
        "agent": "billing-bot",
        "customer": "acme",
        "user": "u-7",
        "model": MODEL,
    }
    assert rule_fields({}, BOUND, MODEL)["customer"] == "acme"


@pytest.mark.parametrize(
    ("header", "value"),
    [
        ("X-Loopwarden-Agent", "planner"),
        ("X-Loopwarden-Agent", "not-me-1"),
        ("X-Loopwarden-Agent", "billing-bot "),
        ("X-Loopwarden-Agent", "bіlling-bot"),  # a Cyrillic і
        ("X-Loopwarden-Customer", "globex"),
        ("X-Loopwarden-Customer", "acme\x00"),
        ("X-Loopwarden-Customer", "x" * 5000),
    ],
)
def test_issue20_a_header_cannot_change_a_field_the_key_sets(header: str, value: str) -> None:
    with pytest.raises(CallFieldError) as caught:
        rule_fields({header: value}, BOUND, MODEL)
    assert str(caught.value).startswith(f"{header}: this proxy key sets ")
    assert value not in str(caught.value)


def test_issue10_a_call_is_its_circuit_fields_and_fingerprint() -> None:
    described = GuardedCall(MODEL, CONVERSATION, stream=False)
    headers = {"X-Loopwarden-Session": "run-1", "x-stainless-retry-count": "2"}
    call = build_call(OpenAIProvider(), CLIENT, headers, described, size=120, started=5.0)
    assert call.circuit == "billing-bot/session=run-1"
    assert call.session == "run-1"
    assert call.fingerprint == fingerprint_call(MODEL, CONVERSATION)
    assert (call.retry, call.request_bytes, call.started, call.decision) == (2, 120, 5.0, None)


@pytest.mark.parametrize(
    ("headers", "model", "named"),
    [
        ({"X-Loopwarden-Session": "run-\udcff"}, MODEL, "X-Loopwarden-Session"),
        ({"X-Loopwarden-Customer": "\ud800"}, MODEL, "X-Loopwarden-Customer"),
        ({}, "gpt-\ud800", "the model name"),
    ],
)
def test_issue10_a_field_that_is_not_unicode_text_is_refused_by_name(
    headers: dict[str, str], model: str, named: str
) -> None:
    described = GuardedCall(model, CONVERSATION, stream=False)
    with pytest.raises(CallFieldError, match=f"^{named} is not valid UTF-8 text"):
        build_call(OpenAIProvider(), CLIENT, headers, described, size=1, started=0.0)


@pytest.mark.parametrize("state", ["memory", "sqlite"])
async def test_issue10_non_utf8_rule_headers_are_a_400_and_the_next_call_is_served(
    state: str, tmp_path: object
) -> None:
    backend = (
        "{backend: memory}"
        if state == "memory"
        else f"{{backend: sqlite, path: '{tmp_path}/s.db'}}"
    )
    async with running_proxy(state=backend) as rig:
        hostile = (
            (b"X-Loopwarden-Session: run-\xff\r\n", _body("a"), "invalid_field"),
            (b"X-Loopwarden-Step: \xed\xa0\x80\r\n", _body("b"), "invalid_field"),
            # A lone surrogate in the body is no Unicode text: the body parser refuses it.
            (b"", _body("c", model="gpt-\ud800"), "invalid_json"),
        )
        for header, body, code in hostile:
            status, answer = await raw_request(
                rig.proxy.port, "/openai/v1/chat/completions", AUTH + header, body
            )
            assert status == 400
            error = json.loads(answer)["error"]
            assert error["code"] == code
            assert ("UTF-8 text" if code == "invalid_field" else "lone surrogate") in error[
                "message"
            ]
        assert rig.upstream.calls("/v1/chat/completions") == []
        status, _ = await raw_request(
            rig.proxy.port, "/openai/v1/chat/completions", AUTH, _body("d")
        )
        assert status == 200
        assert [entry.outcome for entry in await rig.logged()] == ["forwarded"]


async def test_issue10_a_huge_retry_number_is_logged_as_0_in_sqlite(tmp_path: object) -> None:
    # Before, the int went to SQLite as is: "too large to convert", and the entry was lost.
    async with running_proxy(state=f"{{backend: sqlite, path: '{tmp_path}/s.db'}}") as rig:
        retry = b"x-stainless-retry-count: " + b"9" * 30 + b"\r\n"
        status, _ = await raw_request(
            rig.proxy.port, "/openai/v1/chat/completions", AUTH + retry, _body("hi")
        )
        assert status == 200
        assert [entry.retry for entry in await rig.logged()] == [0]
