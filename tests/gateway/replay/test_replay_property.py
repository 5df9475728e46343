"""Replaying what the gateway's own room saw gives the decisions the live gateway made.

The real pipeline runs two hosted bots (scripted to answer everything) in an in-memory
room on a fake clock; everything posted in the room is recorded with its time, written
as a DiscordChatExporter export, and replayed. The bot-loop decisions of the live turns
(events per pair, refusals, cooldowns opened, consecutive-turn cuts, the refused
messages) must be the replay's figures. The second bot comes online after the first one
has spoken, so that every bot has spoken before any other bot hears it: the replay
hosts a bot from its first message, the live gateway from its start.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

import pytest

from gateway.app.context import TurnContext
from gateway.app.types import InboundMessage, Reply
from tests.fakes.inmemory import InMemoryConnector, PipelineRig, next_id, rig_config
from tests.gateway.replay.replay_fixtures import (
    discord_author,
    discord_message,
    replay_json,
    write_config,
    write_discord,
)

CONFIGS = {
    "pair budget": """
policy:
  respond_to: {humans: mentions}
  bot_loop: {max_events_per_window: 4, window_seconds: 60, cooldown_seconds: 20,
             max_consecutive_bot_turns: 0}
""",
    "turn cap": """
policy:
  respond_to: {humans: mentions}
  bot_loop: {max_events_per_window: 50, window_seconds: 60, cooldown_seconds: 20,
             max_consecutive_bot_turns: 3}
""",
}
REFUSALS = frozenset({"budget_exceeded", "cooldown"})


@dataclass(frozen=True)
class Post:
    at: float
    message_id: str
    sender_id: str
    sender_name: str
    is_bot: bool
    text: str


class RecordedRoom:
    """One channel: a post reaches every connected hosted bot; every post is recorded."""

    def __init__(self, rig: PipelineRig) -> None:
        self.rig = rig
        self.posts: list[Post] = []
        self._queue: deque[tuple[str, str, str]] = deque()
        for connector in rig.connectors.values():
            connector.on_send = self._on_send

    def _on_send(self, connector: InMemoryConnector, channel_id: str, reply: Reply) -> None:
        self._queue.append((connector.bot_user_id, connector.bot_id, reply.text))

    async def connect(self, bot_id: str) -> None:
        """Bring one hosted bot online (the pipeline's turn for each message it receives)."""
        rig, bot = self.rig, self.rig.config.bot(bot_id)
        connector = rig.connectors[bot_id]

        async def sink(message: InboundMessage) -> Reply | None:
            turn = TurnContext(
                message=message,
                policy=rig.config.policy,
                state=rig.state,
                config=rig.config,
                bot=bot,
                connector=connector,
                agent=rig.agents[bot_id],
            )
            rig.turns.append(turn)
            return await rig.handler(turn)

        await connector.start(sink)

    async def say(self, text: str, mentions: Collection[str] = ()) -> None:
        """A person speaks, then the bots' replies are posted until the room is quiet."""
        await self._post(
            Post(self.rig.clock.now, next_id(), "U_ALICE", "alice", False, text), mentions
        )
        while self._queue:
            self.rig.clock.advance(1.0)
            user, name, text = self._queue.popleft()
            await self._post(Post(self.rig.clock.now, next_id(), user, name, True, text))

    async def _post(self, post: Post, mentions: Collection[str] = ()) -> None:
        self.posts.append(post)
        for connector in self.rig.connectors.values():
            if connector.connected:
                await connector.push(
                    connector.message(
                        post.text,
                        sender_id=post.sender_id,
                        sender_name=post.sender_name,
                        sender_is_bot=post.is_bot,
                        message_id=post.message_id,
                        mentions_bot=connector.bot_user_id in mentions,
                    )
                )


@pytest.mark.parametrize("case", sorted(CONFIGS))
async def test_issue13_replaying_the_room_gives_the_live_decisions(
    tmp_path: Path, case: str
) -> None:
    rig = PipelineRig(rig_config(CONFIGS[case], bots=("parrot", "echo")))
    room = RecordedRoom(rig)
    await room.connect("parrot")
    await room.say("hello parrot", mentions={"U_parrot"})
    await room.connect("echo")
    await room.say("hello echo", mentions={"U_echo"})
    rig.clock.advance(30)
    await room.say("once more, echo", mentions={"U_echo"})

    live = [
        (turn.message.message_id, decision.code)
        for turn in rig.turns
        for decision in turn.decisions
        if decision.stage == "bot_loop"
    ]
    assert any(code != "ok" for _, code in live), live  # the guards had something to stop

    messages = [
        discord_message(
            post.message_id,
            post.at - rig.clock.now,
            discord_author(post.sender_id, post.sender_name, bot=post.is_bot),
            post.text,
        )
        for post in room.posts
    ]
    export = write_discord(tmp_path / "room.json", messages)
    figures = replay_json(write_config(tmp_path, CONFIGS[case]), export)
    [shown] = figures["rooms"]
    assert shown["messages"] == len(room.posts)
    assert shown["consecutive_turn_cuts"] == sum(code == "bot_turn_cap" for _, code in live)
    pairs = shown["pairs"]
    pair_decisions = [(mid, code) for mid, code in live if code != "bot_turn_cap"]
    if not pair_decisions:
        assert pairs == []
        return
    [pair] = pairs
    assert pair["bots"] == ["echo", "parrot"]
    assert pair["events"] == len(pair_decisions)
    assert pair["cooldowns_opened"] == sum(code == "budget_exceeded" for _, code in live)
    assert pair["refused_message_ids"] == [mid for mid, code in live if code in REFUSALS]
    assert pair["refused"] == len(pair["refused_message_ids"])
