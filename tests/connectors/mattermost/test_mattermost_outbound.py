"""Unit tests of the pure Mattermost outbound translation and of reading the server's answers."""

from __future__ import annotations

import pytest

from connectors.mattermost.outbound import (
    DEFAULT_RETRY_AFTER,
    error_id,
    pending_post_id,
    posted_id,
    retry_after,
    to_patch,
    to_post,
)
from gateway.app.types import Reply


def test_issue23_a_reply_is_a_post_in_its_channel_and_thread() -> None:
    assert to_post("chan", Reply("hi")).body() == {
        "channel_id": "chan",
        "message": "hi",
        "root_id": "",
    }
    assert to_post("chan", Reply("hi", thread_id="root")).body()["root_id"] == "root"
    assert to_post("chan", Reply("hi", ephemeral_to="someone")).body()["channel_id"] == "chan"
    assert to_patch(Reply("grown text")) == {"message": "grown text"}


def test_issue23_a_chunks_pending_post_id_is_derived_from_what_it_is() -> None:
    first = pending_post_id("helper-mm", "chan", "post1", 0, "hi")
    assert first == pending_post_id("helper-mm", "chan", "post1", 0, "hi")
    others = {
        pending_post_id("helper-mm", "chan", "post1", 1, "hi"),
        pending_post_id("helper-mm", "chan", "post2", 0, "hi"),
        pending_post_id("other-mm", "chan", "post1", 0, "hi"),
        pending_post_id("helper-mm", "chan", "post1", 0, "hello"),
    }
    assert first not in others
    assert len(others) == 4
    assert first.startswith("lw")
    assert len(first) == 42
    assert to_post("chan", Reply("hi"), pending_post_id=first).body()["pending_post_id"] == first


def test_issue23_posted_id_and_error_id_read_only_what_is_safe() -> None:
    assert posted_id({"id": "abc"}) == "abc"
    assert posted_id({"id": 5}) is None
    assert posted_id("not an object") is None
    assert error_id(401, {"id": "api.context.session_expired.app_error"}) == (
        "api.context.session_expired.app_error"
    )
    assert error_id(502, "<html>bad gateway</html>") == "HTTP 502"
    assert error_id(400, {"id": "x" * 500}) == "HTTP 400"


@pytest.mark.parametrize(
    ("headers", "seconds"),
    [
        ({"Retry-After": "3", "X-RateLimit-Reset": "9"}, 3.0),
        ({"X-RateLimit-Reset": "2"}, 2.0),
        ({"Retry-After": "soon", "X-RateLimit-Reset": "4"}, 4.0),
        ({"Retry-After": "inf"}, DEFAULT_RETRY_AFTER),
        ({"Retry-After": "nan"}, DEFAULT_RETRY_AFTER),
        ({"Retry-After": "-5"}, DEFAULT_RETRY_AFTER),
        ({}, DEFAULT_RETRY_AFTER),
    ],
)
def test_issue23_a_429_waits_retry_after_else_the_rate_limit_reset(
    headers: dict[str, str], seconds: float
) -> None:
    assert retry_after(headers) == seconds
