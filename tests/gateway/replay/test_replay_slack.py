"""Replaying Slack workspace exports (folder and zip): golden figures, threads, bot kinds."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.gateway.replay.replay_fixtures import (
    SlackExport,
    iso,
    replay_json,
    slack_export,
    slack_ts,
    write_config,
)

GOLDEN = {
    "rooms": [
        {
            "room": "C0BOTS",
            "platform": "slack",
            "messages": 7,
            "consecutive_turn_cuts": 0,
            "room_budget_cuts": 0,
            "room_cooldowns_opened": 0,
            "pairs": [
                {
                    # A legacy integration (`bot_message`, bot_id only) and a bot user.
                    "bots": ["hookbot", "pingbot"],
                    "events": 5,
                    "refused": 2,
                    "cooldowns_opened": 1,
                    "first_cooldown_at": iso(5),
                    "refused_message_ids": [slack_ts(5), slack_ts(6)],
                }
            ],
        }
    ],
    "calls": {"agents": []},
    "skipped": {"no_text": 1, "service": 2, "unknown_type": 1},
}


@pytest.mark.parametrize("form", ["folder", "zip"])
def test_issue13_slack_export_golden_figures(tmp_path: Path, form: str) -> None:
    export = slack_export()
    target = (
        export.folder(tmp_path / "export")
        if form == "folder"
        else export.zip(tmp_path / "export.zip")
    )
    assert replay_json(write_config(tmp_path), target) == GOLDEN


def test_issue13_slack_days_in_order_and_users_json_marks_bots(tmp_path: Path) -> None:
    export = SlackExport(
        {
            "channels.json": [{"id": "C1", "name": "ops"}],
            "users.json": [
                {"id": "U1", "name": "deploy", "is_bot": True, "profile": {}},
                {"id": "U2", "name": "watch", "is_bot": True, "profile": {}},
            ],
            # The second day's file sorts after the first whatever the listing order.
            "ops/2024-01-02.json": [
                {"type": "message", "ts": slack_ts(86_400 + i), "user": u, "text": "again"}
                for i, u in enumerate(["U1", "U2"])
            ],
            "ops/2024-01-01.json": [
                {"type": "message", "ts": slack_ts(i), "user": u, "text": "go"}
                for i, u in enumerate(["U1", "U2", "U1"])
            ],
        }
    )
    config = write_config(tmp_path)
    figures = replay_json(config, export.folder(tmp_path / "export"))
    [room] = figures["rooms"]
    [pair] = room["pairs"]
    assert (room["messages"], pair["events"], pair["refused"]) == (5, 4, 0)


def test_issue13_slack_folder_without_conversation_list_uses_folder_name(tmp_path: Path) -> None:
    export = SlackExport(
        {
            "users.json": [],
            "random/2024-01-01.json": [
                {"type": "message", "ts": slack_ts(0), "bot_id": "B1", "text": "a"},
                {"type": "message", "ts": slack_ts(1), "bot_id": "B2", "text": "b"},
            ],
        }
    )
    figures = replay_json(write_config(tmp_path), export.folder(tmp_path / "export"))
    assert figures["rooms"][0]["room"] == "random"
