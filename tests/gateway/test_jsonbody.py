"""The one safe JSON body parser every route uses (issue 9)."""

from __future__ import annotations

import pytest

from gateway.app.jsonbody import MAX_DEPTH, JsonBodyError, parse_json


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b"[" * 50_000 + b"]" * 50_000, "nested deeper"),
        (b'{"a":' * (MAX_DEPTH + 1) + b"1" + b"}" * (MAX_DEPTH + 1), "nested deeper"),
        (b"1" * 5_000, "digits"),
        (b"1e400", "out of range"),
        (b"[NaN]", "NaN"),
        (b'{"x": -Infinity}', "Infinity"),
        (b"\xff\xfe{}", "not UTF-8"),
        (b"{", "not JSON"),
        (b'{"text": "\\ud800"}', "lone surrogate"),
        (b'{"\\udfff": 1}', "lone surrogate"),
        (b'["ok", ["\\ud83d"]]', "lone surrogate"),
    ],
)
def test_issue9_hostile_json_is_refused_with_the_reason(body: bytes, why: str) -> None:
    with pytest.raises(JsonBodyError, match=why):
        parse_json(body)


def test_issue9_size_limit_names_the_limit() -> None:
    with pytest.raises(JsonBodyError, match="larger than 10 bytes"):
        parse_json(b'{"a": "0123456789"}', max_bytes=10)


def test_ordinary_json_parses() -> None:
    nested = b'{"a":' * MAX_DEPTH + b"1" + b"}" * MAX_DEPTH
    assert parse_json(nested) is not None
    assert parse_json(b'{"a": [1, 2.5, {"b": null}]}') == {"a": [1, 2.5, {"b": None}]}
    assert parse_json(b'{"emoji": "\\ud83d\\ude00"}') == {"emoji": "\U0001f600"}
