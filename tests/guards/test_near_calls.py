"""near_calls: which result fields are volatile, and when two tool calls are nearly the same."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from guards.loop_guard import canonical_args
from guards.near_calls import (
    blank_volatile_fields,
    is_target_key,
    is_volatile_field,
    near_args,
    near_text,
)


@pytest.mark.parametrize(
    "name",
    [
        "id",
        "ID",
        "messageId",
        "message_id",
        "msgID",
        "request_id",
        "ids",
        "uuid",
        "ts",
        "thread_ts",
        "timestamp",
        "date",
        "send_date",
        "created",
        "created_at",
        "createdAt",
        "date_created",
        "updated",
        "lastUpdated",
        "modified_time",
        "sent_at",
        "etag",
        "ETag",
        "nonce",
    ],
)
def test_issue20_identity_and_time_fields_are_volatile(name: str) -> None:
    assert is_volatile_field(name)


@pytest.mark.parametrize(
    "name", ["identity", "valid", "status", "text", "at", "update", "count", "path", "", "_"]
)
def test_issue20_other_fields_are_not_volatile(name: str) -> None:
    assert not is_volatile_field(name)


def test_issue20_volatile_fields_are_blanked_at_every_depth_other_values_kept() -> None:
    text = json.dumps(
        {
            "ok": True,
            "result": {"message_id": 4521, "chat": {"id": 7, "title": "ops"}, "date": 1},
            "items": [{"id": 1, "state": "sent"}],
            "created": {"by": "bob", "at": 5},
        }
    )
    blanked = json.loads(blank_volatile_fields(text))

    assert blanked["ok"] is True
    assert blanked["result"]["chat"] == {"id": "\x00", "title": "ops"}
    assert blanked["result"]["message_id"] == blanked["result"]["date"] == "\x00"
    assert blanked["items"] == [{"id": "\x00", "state": "sent"}]
    assert blanked["created"] == {"by": "bob", "at": 5}  # a dict is searched, not blanked


@pytest.mark.parametrize(
    "text", ["", "plain text", "{not json", "[1, 2", "  {", "42", '"id"', "{" * 10_000]
)
def test_issue20_text_that_is_no_json_object_or_array_is_kept_as_it_is(text: str) -> None:
    assert blank_volatile_fields(text) == text


def test_issue20_absurdly_deep_json_is_kept_as_it_is() -> None:
    deep = '{"id": ' + "[" * 100_000 + "]" * 100_000 + "}"
    assert blank_volatile_fields(deep) == deep


@pytest.mark.parametrize(
    "name", ["path", "file_path", "filePath", "sessionKey", "chat_id", "to", "url", "cwd"]
)
def test_issue20_target_keys_are_recognised(name: str) -> None:
    assert is_target_key(name)


@pytest.mark.parametrize("name", ["command", "message", "text", "query", "content", "verbose"])
def test_issue20_other_keys_are_no_targets(name: str) -> None:
    assert not is_target_key(name)


NEAR_TEXTS = [
    ("deploy attempt 3", "deploy attempt 4"),
    ("sleep 10s && check", "sleep 20s && check"),
    ("ls -la", "ls -la --all"),
    ("curl -s https://x.example/api/health", "curl -sS --retry 3 https://x.example/api/health"),
    (
        "python3 -c \"print(open('/srv/a.txt').read()[:500])\"",
        "python3 -c \"print(open('/srv/a.txt').read()[:1000])\"",
    ),
    (
        "Please reply with the build status.",
        "Could you reply with the current build status please?",
    ),
    (
        "Hi Bob, can you send me the Q3 report?",
        "Hello Bob, could you please send me the Q3 report?",
    ),
    ("retry at 2024-01-01T10:00:00Z", "retry at 2024-01-01T10:00:05Z"),
]
DIFFERENT_TEXTS = [
    ("rm -rf build", "rm -rf dist"),
    ("weather in Paris", "weather in Lima"),
    ("cat a.txt", "cat b.txt"),
    ("git add file1", "git add file2"),
    ("mkdir -p out/a", "mkdir -p out/b"),
    ("mail bob@example.com", "mail eve@example.com"),
    ("notify @alice", "notify @bob"),
    ("get https://a.example/x", "get https://b.example/x"),
    ("show 5f0c6b1e-aaaa", "show 9d2e7c4f-bbbb"),
    ("status?", "Could you please tell me the current status of everything?"),
    (
        "Can you check whether the nightly job ran and tell me the result?",
        "Can you tell me whether the database backup finished and where it is?",
    ),
]


@pytest.mark.parametrize(("a", "b"), NEAR_TEXTS)
def test_issue20_counters_flags_and_rewordings_are_near(a: str, b: str) -> None:
    assert near_text(a, b)
    assert near_text(b, a)


@pytest.mark.parametrize(("a", "b"), DIFFERENT_TEXTS)
def test_issue20_another_target_or_another_request_is_not_near(a: str, b: str) -> None:
    assert not near_text(a, b)
    assert not near_text(b, a)


def test_issue20_only_the_first_512_characters_of_a_text_are_compared() -> None:
    head = "word " * 103  # 515 characters
    assert near_text(head + "rm -rf build", head + "rm -rf dist")
    assert not near_text("rm -rf build " + head, "rm -rf dist " + head)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ({"command": "make", "attempt": 1}, {"command": "make", "attempt": 2}),
        ({"command": "make", "verbose": True}, {"command": "make", "verbose": False}),
        ({"command": "make"}, {"command": "make", "force": True}),
        ({"command": "make", "timeout": 1.5}, {"command": "make", "timeout": 3}),
        ({"q": {"text": "try 1", "n": [1, 2]}}, {"q": {"text": "try 2", "n": [3, 4]}}),
        ("run it, attempt 1", "run it, attempt 2"),
    ],
)
def test_issue20_arguments_changed_slightly_are_near(a: object, b: object) -> None:
    assert near_args(canonical_args(a), canonical_args(b))
    assert near_args(canonical_args(b), canonical_args(a))


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ({"path": "a.txt", "content": "x"}, {"path": "b.txt", "content": "x"}),
        ({"path": "a.txt", "verbose": True}, {"path": "b.txt", "verbose": True}),
        ({"sessionKey": "agent:a", "message": "hi"}, {"sessionKey": "agent:b", "message": "hi"}),
        ({"command": "make"}, {"command": "make", "target": "all"}),
        ({"command": "make"}, {"script": "make"}),
        ({"command": "make", "n": 1}, {"command": "make", "n": "1"}),
        ({"q": {"path": "a"}}, {"q": {"path": "b"}}),
        ({"n": [1, 2]}, {"n": [1, 2, 3]}),
        ({"command": "make"}, ["make"]),
    ],
)
def test_issue20_another_target_or_shape_is_not_near(a: object, b: object) -> None:
    assert not near_args(canonical_args(a), canonical_args(b))
    assert not near_args(canonical_args(b), canonical_args(a))


def test_issue20_huge_arguments_are_near_only_when_equal() -> None:
    many = {f"k{n}": n for n in range(100)}
    assert not near_args(canonical_args(many), canonical_args({**many, "k0": 1}))
    long_text = {"command": "x " * 20_000, "nested": [1]}
    assert not near_args(canonical_args(long_text), canonical_args({**long_text, "nested": [2]}))
    assert near_args(canonical_args(long_text), canonical_args(dict(long_text)))


def test_issue20_a_comparison_looks_at_a_bounded_number_of_values() -> None:
    def args(start: int) -> dict[str, object]:
        return {key: [{"n": n + start} for n in range(70)] for key in ("items", "more")}

    # Each list, dict and number compared counts: 141 per key, so one key is compared in
    # full and two (282) run out of the 256 allowed, which answers "not near".
    one = {"items": args(0)["items"]}
    assert near_args(canonical_args(one), canonical_args({"items": args(1)["items"]}))
    assert not near_args(canonical_args(args(0)), canonical_args(args(1)))


words = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=40)
flat_args = st.dictionaries(
    st.sampled_from(["command", "message", "path", "n", "flag", "to"]),
    st.one_of(words, st.integers(), st.booleans(), st.none(), st.floats(allow_nan=False)),
    max_size=4,
)


@settings(max_examples=200, deadline=None)
@given(flat_args, flat_args)
def test_issue20_near_args_is_symmetric_and_reflexive(
    a: dict[str, object], b: dict[str, object]
) -> None:
    ca, cb = canonical_args(a), canonical_args(b)
    assert near_args(ca, ca)
    assert near_args(ca, cb) == near_args(cb, ca)


@settings(max_examples=200, deadline=None)
@given(flat_args, st.sampled_from(["path", "to", "file_path", "chat_id"]), words, words)
def test_issue20_a_changed_target_is_never_near(
    args: dict[str, object], key: str, one: str, other: str
) -> None:
    if one == other:
        return
    assert not near_args(canonical_args({**args, key: one}), canonical_args({**args, key: other}))


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["id", "messageId", "chat_id", "ts", "created_at", "etag", "date"]),
        st.one_of(st.integers(), words, st.floats(allow_nan=False)),
        min_size=1,
    ),
    st.dictionaries(st.sampled_from(["ok", "text", "status"]), st.one_of(st.booleans(), words)),
    st.data(),
)
def test_issue20_results_differing_only_in_volatile_fields_blank_alike(
    volatile: dict[str, object], stable: dict[str, object], data: st.DataObject
) -> None:
    other = {key: data.draw(st.one_of(st.integers(), words)) for key in volatile}
    first = json.dumps({**stable, **volatile, "nested": [volatile]})
    second = json.dumps({**stable, **other, "nested": [other]})
    assert blank_volatile_fields(first) == blank_volatile_fields(second)
