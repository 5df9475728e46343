"""Replaying a three-bot ring (issue 20): the room budget's cuts are reported per room."""

from __future__ import annotations

from pathlib import Path

from tests.gateway.replay.replay_fixtures import (
    discord_author,
    discord_message,
    replay_cli,
    replay_json,
    write_config,
    write_discord,
)

ALICE = discord_author("111", "alice", bot=False)
RING = [discord_author(f"{n}", name, bot=True) for n, name in ((2, "A"), (3, "B"), (4, "C"))]


def ring_export(path: Path, messages: int = 30) -> Path:
    """Alice, then A→B→C→A… one message every 3 s."""
    posts = [discord_message("1000", 0, ALICE, "hi bots")]
    posts += [
        discord_message(f"{1000 + n}", 3 * n, RING[(n - 1) % 3], "pong")
        for n in range(1, messages + 1)
    ]
    return write_discord(path, posts)


def test_issue20_replay_reports_room_budget_cuts_of_a_three_bot_ring(tmp_path: Path) -> None:
    config = write_config(tmp_path, "policy: {bot_loop: {}}\n")
    export = ring_export(tmp_path / "general.json")
    [room] = replay_json(config, export)["rooms"]
    # A's first message reaches no bot yet; the next 20 fill the room budget (20 per 90 s)
    # and the 22nd message opens its cooldown, which refuses the remaining eight. No pair
    # sees enough of the ring for its own budget, and the bot-turn cap (30) is not reached.
    assert (room["room_budget_cuts"], room["room_cooldowns_opened"]) == (9, 1)
    assert room["consecutive_turn_cuts"] == 0
    assert [pair["refused"] for pair in room["pairs"]] == [0, 0, 0]
    code, out, _ = replay_cli(str(export), "--config", str(config))
    assert code == 0
    assert "0 consecutive-turn cuts, 9 room-budget cuts" in out
