"""Pure outbound translation for Slack: which Web API call posts a chunk, and its failures."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from slack_sdk.errors import SlackApiError

from connectors.slack.outbound import (
    DEFAULT_RETRY_AFTER,
    Post,
    error_code,
    posted_id,
    rate_limited,
    retry_after,
    to_post,
)
from gateway.app.types import Reply


@dataclass
class FakeResponse:
    """What slack-sdk's SlackApiError carries: status, headers and the JSON answer."""

    status_code: int = 429
    headers: dict[str, str] = field(default_factory=dict)
    data: object = None


def api_error(
    status: int = 429, data: object = None, headers: dict[str, str] | None = None
) -> SlackApiError:
    response = FakeResponse(status, headers or {}, data)
    return SlackApiError("refused", response)  # type: ignore[no-untyped-call]  # untyped in slack-sdk


def test_issue10_a_chunk_is_a_post_in_its_thread_or_an_ephemeral_to_one_user() -> None:
    plain = to_post("C0LOBBY", Reply("hi", thread_id="1.5", reply_to="1.4"))
    assert plain == Post("chat.postMessage", "C0LOBBY", "hi", "1.5")
    assert posted_id(plain, {"ok": True, "ts": "1.6"}) == "1.6"
    whisper = to_post("C0LOBBY", Reply("psst", ephemeral_to="U0ALICE"))
    assert whisper == Post("chat.postEphemeral", "C0LOBBY", "psst", None, "U0ALICE")
    assert posted_id(whisper, {"ok": True, "message_ts": "1.7"}) == "1.7"
    assert posted_id(plain, {"ok": True, "ts": 1.6}) is None  # not text: no id


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"Retry-After": "30"}, 30.0),
        ({"Retry-After": "-3"}, 0.0),
        ({"Retry-After": "inf"}, DEFAULT_RETRY_AFTER),
        ({"Retry-After": "nan"}, DEFAULT_RETRY_AFTER),
        ({"Retry-After": "1e309"}, DEFAULT_RETRY_AFTER),  # overflows to inf
        ({"Retry-After": "soon"}, DEFAULT_RETRY_AFTER),
        ({}, DEFAULT_RETRY_AFTER),
    ],
)
def test_issue10_retry_after_is_a_finite_wait(headers: dict[str, str], expected: float) -> None:
    assert retry_after(api_error(headers=headers)) == expected


def test_issue10_error_codes_and_rate_limits_are_read_from_the_answer_only() -> None:
    assert error_code(api_error(200, {"ok": False, "error": "channel_not_found"})) == (
        "channel_not_found"
    )
    assert error_code(api_error(500, ["not", "an", "object"])) == "HTTP 500"
    assert error_code(api_error(400, {"error": {"nested": "odd"}})) == "HTTP 400"
    assert rate_limited(api_error(429))
    assert rate_limited(api_error(200, {"ok": False, "error": "ratelimited"}))
    assert not rate_limited(api_error(403, {"ok": False, "error": "not_in_channel"}))
