"""The real Synapse the Matrix tests run against: users, rooms, messages and its rate limit."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fakes.synapse_server import (
    MatrixError,
    RateLimit,
    SynapseClient,
    SynapseServer,
    running_synapse,
)


async def test_issue23_two_users_talk_in_a_room(synapse: SynapseClient) -> None:
    alice, alice_token = await synapse.register("issue23-alice", admin=True)
    bot, bot_token = await synapse.register("issue23-bot")
    assert alice == "@issue23-alice:loopwarden.test"
    room = await synapse.create_room(alice_token, invite=[bot])
    await synapse.join(bot_token, room)

    root = await synapse.send_text(alice_token, room, "hello bot", mentions=[bot])
    reply = await synapse.send_text(
        bot_token, room, "hello alice", msgtype="m.notice", thread_root=root
    )

    events = await synapse.messages(bot_token, room)
    assert [(e["sender"], e["content"]["body"]) for e in events] == [
        (alice, "hello bot"),
        (bot, "hello alice"),
    ]
    assert [e["event_id"] for e in events] == [root, reply]
    assert events[0]["content"]["m.mentions"] == {"user_ids": [bot]}
    assert events[1]["content"]["msgtype"] == "m.notice"
    assert events[1]["content"]["m.relates_to"]["rel_type"] == "m.thread"
    assert events[1]["content"]["m.relates_to"]["event_id"] == root


async def test_issue23_a_stranger_cannot_join_a_private_room(synapse: SynapseClient) -> None:
    _, owner_token = await synapse.register("issue23-owner")
    _, stranger_token = await synapse.register("issue23-stranger")
    room = await synapse.create_room(owner_token)

    with pytest.raises(MatrixError) as refused:
        await synapse.join(stranger_token, room)

    assert (refused.value.status, refused.value.errcode) == (403, "M_FORBIDDEN")


@pytest.fixture(scope="module")
def slow_synapse(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SynapseServer]:
    """A Synapse of its own whose message rate limit (3, then one per 1,000 s) a test meets."""
    slow = RateLimit(per_second=0.001, burst_count=3)
    with running_synapse(tmp_path_factory.mktemp("slow-synapse"), rc_message=slow) as server:
        yield server


async def _send_until_limited(
    client: SynapseClient, token: str, room: str, most: int
) -> tuple[list[str], MatrixError]:
    """Send up to `most` messages; the event ids sent and the error that stopped them."""
    sent: list[str] = []
    for n in range(most):
        try:
            sent.append(await client.send_text(token, room, f"message {n}"))
        except MatrixError as exc:
            return sent, exc
    pytest.fail(f"{most} sends and none was rate limited")


async def test_issue23_a_low_rc_message_limits_sends(slow_synapse: SynapseServer) -> None:
    async with SynapseClient(slow_synapse) as client:
        _, token = await client.register("issue23-chatty")
        room = await client.create_room(token)
        most = slow_synapse.rc_message.burst_count + 1
        sent, limited = await _send_until_limited(client, token, room, most)

        assert sent
        assert (limited.status, limited.errcode) == (429, "M_LIMIT_EXCEEDED")
        assert limited.retry_after_ms is not None
        assert limited.retry_after_ms > 0
        assert int(limited.headers["Retry-After"]) >= 1
        events = await client.messages(token, room)
        assert [e["event_id"] for e in events] == sent
