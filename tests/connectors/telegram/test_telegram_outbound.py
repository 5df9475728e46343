"""Pure outbound translation for Telegram: sendMessage and sendChatAction arguments, failures."""

from __future__ import annotations

from datetime import timedelta

import httpx
import pytest
from telegram.constants import ChatAction
from telegram.error import NetworkError, RetryAfter

from connectors.telegram.outbound import (
    chat_ref,
    nothing_sent,
    retry_after_seconds,
    to_chat_action,
    to_send_message,
)
from gateway.app.errors import DeliveryError
from gateway.app.types import Reply


@pytest.fixture(autouse=True)
def _timedelta_periods(monkeypatch: pytest.MonkeyPatch) -> None:
    """Opt in to PTB's timedelta periods, else its RetryAfter warns (an error under pytest)."""
    monkeypatch.setenv("PTB_TIMEDELTA", "true")


def test_issue10_a_chunk_quotes_its_message_in_its_forum_topic() -> None:
    call = to_send_message("-1001", Reply("hi", thread_id="17", reply_to="42"))
    assert (call.chat_id, call.text, call.message_thread_id) == (-1001, "hi", 17)
    assert call.reply_parameters is not None
    assert call.reply_parameters.message_id == 42
    assert call.reply_parameters.allow_sending_without_reply is True
    bare = to_send_message("@news", Reply("plain"))
    assert (bare.chat_id, bare.message_thread_id, bare.reply_parameters) == ("@news", None, None)
    typing = to_chat_action("-1003", "17")
    assert (typing.chat_id, typing.message_thread_id, typing.action) == (
        -1003,
        17,
        ChatAction.TYPING,
    )


@pytest.mark.parametrize(
    ("reply", "field_name"),
    [
        (Reply("x", thread_id="topic"), "thread_id"),
        (Reply("x", thread_id="１７"), "thread_id"),  # fullwidth digits: int() would take them
        (Reply("x", reply_to="9" * 5000), "reply_to"),
        (Reply("x", reply_to=str(2**64)), "reply_to"),
    ],
)
def test_issue10_a_topic_or_message_id_that_is_no_number_is_a_final_delivery_error(
    reply: Reply, field_name: str
) -> None:
    with pytest.raises(DeliveryError) as caught:
        to_send_message("-1001", reply)
    assert not caught.value.retryable
    assert field_name in str(caught.value)
    assert len(str(caught.value)) < 200


def test_issue10_only_ascii_digit_chat_ids_are_numbers() -> None:
    assert chat_ref("-1001") == -1001
    assert chat_ref("5678") == 5678
    assert chat_ref("١٢٣") == "١٢٣"  # Arabic-Indic digits: Telegram is asked as written
    with pytest.raises(DeliveryError, match="channel_id"):
        chat_ref("9" * 30)


def test_issue10_retry_after_and_whether_anything_was_sent() -> None:
    assert retry_after_seconds(RetryAfter(timedelta(seconds=7))) == 7.0
    assert retry_after_seconds(RetryAfter(timedelta(days=1))) == 86400.0
    refused = NetworkError("connect failed")
    refused.__cause__ = httpx.ConnectError("refused")
    assert nothing_sent(refused)
    timed_out = NetworkError("read timed out")
    timed_out.__cause__ = httpx.ReadTimeout("slow")
    assert not nothing_sent(timed_out)
