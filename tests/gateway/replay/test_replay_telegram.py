"""Replaying Telegram Desktop exports: one chat, the whole account, entity texts, --bot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.gateway.replay.replay_fixtures import (
    iso,
    replay_json,
    telegram_account,
    telegram_chat,
    telegram_message,
    write_config,
)

PAIR = {
    "bots": ["Ping Bot", "Pong"],
    "events": 5,
    "refused": 2,
    "cooldowns_opened": 1,
    "first_cooldown_at": iso(5),
    "refused_message_ids": ["7", "8"],
}


def write(path: Path, document: object) -> Path:
    path.write_text(json.dumps(document, ensure_ascii=False, indent=1), encoding="utf-8")
    return path


@pytest.mark.parametrize("bot", ["user300", "300", "Pong", "pong"])
def test_issue13_telegram_single_chat_golden_figures(tmp_path: Path, bot: str) -> None:
    result = write(tmp_path / "result.json", telegram_chat())
    figures = replay_json(write_config(tmp_path), result, extra=["--bot", bot])
    assert figures == {
        "rooms": [
            {
                "room": "-1001234567890",
                "platform": "telegram",
                "messages": 7,
                "consecutive_turn_cuts": 0,
                "room_budget_cuts": 0,
                "room_cooldowns_opened": 0,
                "pairs": [PAIR],
            }
        ],
        "calls": {"agents": []},
        "skipped": {"no_text": 1, "service": 1},
    }


def test_issue13_telegram_without_bot_flag_only_names_ending_in_bot_are_bots(
    tmp_path: Path,
) -> None:
    result = write(tmp_path / "result.json", telegram_chat())
    figures = replay_json(write_config(tmp_path), result)
    [room] = figures["rooms"]
    assert room["pairs"] == []  # "Pong" is taken for a person: nothing to pair with


def test_issue13_telegram_whole_account_export_and_its_folder(tmp_path: Path) -> None:
    group = {
        "name": "Old group",
        "type": "private_group",
        "id": 555,
        "messages": [
            telegram_message(1, 100, "a_bot", "user1", "x"),
            telegram_message(2, 101, "b_bot", "user2", [{"type": "code", "text": "y"}]),
        ],
    }
    folder = tmp_path / "DataExport_2024-01-02"
    folder.mkdir()
    write(folder / "result.json", telegram_account([telegram_chat(), group]))
    figures = replay_json(write_config(tmp_path), folder, extra=["--bot", "user300"])
    rooms = figures["rooms"]
    assert isinstance(rooms, list)
    assert [room["room"] for room in rooms] == ["-1001234567890", "-555"]
    assert rooms[0]["pairs"] == [PAIR]
    assert rooms[1]["pairs"][0]["events"] == 1


def test_issue13_telegram_falls_back_to_local_date_without_unixtime(tmp_path: Path) -> None:
    chat = telegram_chat()
    for message in chat["messages"]:  # type: ignore[attr-defined]
        message.pop("date_unixtime")
    figures = replay_json(
        write_config(tmp_path), write(tmp_path / "result.json", chat), extra=["--bot", "Pong"]
    )
    assert figures["rooms"][0]["pairs"] == [PAIR]
