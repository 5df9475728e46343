"""Pure outbound translation for Discord: where a chunk goes, what it replies to, failures."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest

from connectors.discord.outbound import (
    ALLOWED_MENTIONS,
    may_have_posted,
    retry_after,
    to_post,
)
from gateway.app.errors import DeliveryError
from gateway.app.types import Reply

# After connectors.discord.outbound, which imported discord.py with its voice warning quiet.
import discord  # noqa: E402 - isort: skip


@dataclass
class FakeResponse:
    """What discord.py's HTTPException reads of an aiohttp response."""

    status: int = 429
    reason: str = "Too Many Requests"
    headers: dict[str, str] = field(default_factory=dict)


def http_error(status: int = 429, headers: dict[str, str] | None = None) -> discord.HTTPException:
    response: Any = FakeResponse(status, headers=headers or {})
    return discord.HTTPException(response, "refused")


def test_issue10_a_reply_is_a_discord_reply_that_pings_no_one_but_users() -> None:
    post = to_post("200", Reply("hi", reply_to="555"), thread=None, on_starter=False)
    assert (post.target, post.content) == (200, "hi")
    assert post.reference is not None
    assert (post.reference.message_id, post.reference.channel_id) == (555, 200)
    assert post.reference.fail_if_not_exists is False
    options: dict[str, Any] = post.send_options(42)
    assert options == {
        "nonce": 42,
        "allowed_mentions": ALLOWED_MENTIONS,
        "reference": post.reference,
    }
    assert ALLOWED_MENTIONS.to_dict()["parse"] == ["users"]  # no @everyone, @here, roles
    assert ALLOWED_MENTIONS.replied_user is False


def test_issue10_threads_and_the_thread_opened_on_the_answered_message() -> None:
    in_thread = to_post(
        "200", Reply("t", thread_id="300", reply_to="301"), thread="300", on_starter=False
    )
    assert in_thread.target == 300
    assert in_thread.reference is not None
    assert in_thread.reference.channel_id == 300
    on_starter = to_post(
        "200", Reply("s", thread_id="301", reply_to="301"), thread="301", on_starter=True
    )
    assert (on_starter.target, on_starter.reference) == (301, None)
    plain = to_post("200", Reply("p"), thread=None, on_starter=False)
    assert "reference" not in plain.send_options(1)


@pytest.mark.parametrize(
    ("channel", "reply", "field_name"),
    [
        ("abc", Reply("x"), "channel_id"),
        ("１２３", Reply("x"), "channel_id"),  # fullwidth digits: int() would take them
        ("١٢٣", Reply("x"), "channel_id"),  # Arabic-Indic digits
        ("12 ", Reply("x"), "channel_id"),
        ("1_000", Reply("x"), "channel_id"),
        ("9" * 5000, Reply("x"), "channel_id"),
        (str(2**64), Reply("x"), "channel_id"),
        ("200", Reply("x", reply_to="not-an-id"), "reply_to"),
    ],
)
def test_issue10_an_id_that_is_not_a_snowflake_is_a_final_delivery_error(
    channel: str, reply: Reply, field_name: str
) -> None:
    with pytest.raises(DeliveryError) as caught:
        to_post(channel, reply, thread=None, on_starter=False)
    assert not caught.value.retryable
    assert field_name in str(caught.value)
    assert len(str(caught.value)) < 200  # a 5,000-digit id is not echoed whole


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"X-RateLimit-Reset-After": "1.5", "Retry-After": "3"}, 1.5),
        ({"Retry-After": "3"}, 3.0),
        ({"X-RateLimit-Reset-After": "inf", "Retry-After": "2"}, 2.0),
        ({"X-RateLimit-Reset-After": "nan"}, None),
        ({"Retry-After": "-1"}, None),
        ({"Retry-After": "soon"}, None),
        ({}, None),
    ],
)
def test_issue10_retry_after_reads_only_a_finite_wait(
    headers: dict[str, str], expected: float | None
) -> None:
    assert retry_after(http_error(headers=headers)) == expected


def test_issue10_only_a_failure_after_the_request_left_may_have_posted() -> None:
    down: Any = FakeResponse(503)
    assert may_have_posted(discord.DiscordServerError(down, "down"))
    assert may_have_posted(TimeoutError())
    assert may_have_posted(aiohttp.ServerDisconnectedError())
    refused = aiohttp.ClientConnectorError(
        aiohttp.client_reqrep.ConnectionKey("h", 1, False, False, None, None, None),
        OSError(111, "refused"),
    )
    assert not may_have_posted(refused)
    assert not may_have_posted(http_error(403))
