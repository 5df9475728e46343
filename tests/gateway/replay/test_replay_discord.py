"""Replaying DiscordChatExporter exports: golden figures, threads, bots, skipped records."""

from __future__ import annotations

from pathlib import Path

from tests.gateway.replay.replay_fixtures import (
    discord_author,
    discord_message,
    iso,
    ping_pong_discord,
    replay_json,
    write_config,
    write_discord,
)

ALICE = discord_author("111", "alice", bot=False)
PING = discord_author("222", "PingBot", bot=True)
PONG = discord_author("333", "PongBot", bot=True)


def test_issue13_discord_ping_pong_golden_figures(tmp_path: Path) -> None:
    figures = replay_json(write_config(tmp_path), ping_pong_discord(tmp_path / "general.json"))
    assert figures == {
        "rooms": [
            {
                "room": "800",
                "platform": "discord",
                "messages": 9,
                "consecutive_turn_cuts": 0,
                "room_budget_cuts": 0,
                "room_cooldowns_opened": 0,
                "pairs": [
                    {
                        "bots": ["PingBot", "PongBot"],
                        # PingBot's first message precedes PongBot's: nobody hosted received it.
                        "events": 7,
                        "refused": 4,
                        "cooldowns_opened": 1,
                        "first_cooldown_at": iso(5, zone="+00:00"),
                        "refused_message_ids": ["1005", "1006", "1007", "1008"],
                    }
                ],
            }
        ],
        "calls": {"agents": []},
        "skipped": {},
    }


def test_issue13_discord_offsets_system_messages_and_no_text(tmp_path: Path) -> None:
    messages = [
        discord_message("1", 0, ALICE, "", kind="GuildMemberJoin"),
        discord_message("2", 1, PING, "hi"),
        discord_message("3", 2, PONG, "hi"),
        discord_message("4", 3, ALICE, "pinned", kind="ChannelPinnedMessage"),
        discord_message("5", 4, PING, ""),  # an attachment alone
        discord_message("6", 5, PONG, "new kind", kind="SomethingDiscordAddsLater"),
        discord_message("7", 6, PING, "reply", kind="Reply"),
    ]
    messages[6]["timestamp"] = iso(6, zone="+02:00").replace("12:00:06", "14:00:06")
    config = write_config(tmp_path, "policy: {bot_loop: {max_consecutive_bot_turns: 1}}")
    figures = replay_json(config, write_discord(tmp_path / "c.json", messages))
    [room] = figures["rooms"]
    assert room["messages"] == 3
    # Skipped records neither count nor reset the run: one bot turn, then the second is cut.
    assert room["consecutive_turn_cuts"] == 1
    assert room["pairs"][0]["events"] == 1
    assert figures["skipped"] == {"no_text": 1, "service": 2, "unknown_type": 1}


def test_issue13_discord_thread_file_joins_its_channel_room_in_time_order(tmp_path: Path) -> None:
    channel = [discord_message(str(10 + i), 2 * i, (PING, PONG)[i % 2], "x") for i in range(3)]
    thread = [discord_message(str(20 + i), 2 * i + 1, (PONG, PING)[i % 2], "y") for i in range(3)]
    write_discord(tmp_path / "general.json", channel)
    write_discord(
        tmp_path / "thread.json", thread, channel_id="900", kind="GuildPublicThread", parent="800"
    )
    config = write_config(tmp_path)
    figures = replay_json(config, tmp_path / "general.json", tmp_path / "thread.json")
    [room] = figures["rooms"]
    assert room["room"] == "800"
    assert room["messages"] == 6
    [pair] = room["pairs"]
    # Interleaved by time: 10 (t0), 20 (t1), 11 (t2), 21 (t3) fill the budget at 3 events.
    assert pair["events"] == 5
    assert pair["refused"] == 2
    assert pair["refused_message_ids"] == ["12", "22"]


def test_issue13_discord_mentions_decide_pairs_when_bots_answer_mentions(tmp_path: Path) -> None:
    third = discord_author("444", "ThirdBot", bot=True)
    pong_ref = {
        "id": "333",
        "name": "PongBot",
        "discriminator": "0000",
        "nickname": "PongBot",
        "isBot": True,
    }
    messages = [
        discord_message("1", 0, PONG, "here"),
        discord_message("2", 1, third, "here too"),
        discord_message("3", 2, PING, "@PongBot hi", mentions=[pong_ref]),
        discord_message("4", 3, PING, "nobody in particular"),
    ]
    config = write_config(tmp_path, "policy: {respond_to: {bots: mentions}}")
    figures = replay_json(config, write_discord(tmp_path / "c.json", messages))
    [room] = figures["rooms"]
    assert [(p["bots"], p["events"]) for p in room["pairs"]] == [(["PingBot", "PongBot"], 1)]
