"""Replaying Telegram Desktop exports: one chat, the whole account, entity texts, --bot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.gateway.replay.replay_fixtures import (
    iso,
    replay_cli,
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


def chat_analytics_sample(count: int) -> dict[str, object]:
    """The shape of chat-analytics' BIG_20A_5475M.json: `from_id` a number, `date` in UTC."""
    names = ("Marjory.Cartwright", "Christelle61", "alert_bot", "Coy99")
    return {
        "name": "Big sample",
        "type": "private_supergroup",
        "id": 1111111111,
        "messages": [
            {
                "id": index + 1,
                "date": iso(index, zone="Z"),
                "type": "message",
                "from": names[index % len(names)],
                "from_id": 19 + index % len(names),
                "text": "Incidunt consequuntur alias.",
            }
            for index in range(count)
        ],
    }


def test_issue20_telegram_numeric_from_id_is_the_sender(tmp_path: Path) -> None:
    result = write(tmp_path / "BIG_20A_5475M.json", chat_analytics_sample(12))
    figures = replay_json(write_config(tmp_path), result, extra=["--bot", "Coy99"])
    [room] = figures["rooms"]
    assert (room["room"], room["messages"]) == ("-1001111111111", 12)
    assert figures["skipped"] == {}
    [pair] = room["pairs"]  # alert_bot (21) and Coy99 (22, by --bot) answer each other
    assert pair["bots"] == ["alert_bot", "Coy99"]
    assert pair["events"] == 5


@pytest.mark.parametrize(
    ("from_id", "sender_kept"),
    [(19, True), ("user19", True), (True, False), (19.5, False), ([19], False), ("", False)],
)
def test_issue20_telegram_from_id_forms(tmp_path: Path, from_id: object, sender_kept: bool) -> None:
    chat = chat_analytics_sample(2)
    chat["messages"][0]["from_id"] = from_id  # type: ignore[index]
    figures = replay_json(write_config(tmp_path), write(tmp_path / "result.json", chat))
    assert figures["rooms"][0]["messages"] == (2 if sender_kept else 1)
    assert figures["skipped"] == ({} if sender_kept else {"no_sender": 1})


def test_issue20_telegram_bad_date_unixtime_is_named_as_such(tmp_path: Path) -> None:
    chat = telegram_chat()
    chat["messages"][3]["date_unixtime"] = "-inf"  # type: ignore[index]
    code, out, err = replay_cli(
        "--config", str(write_config(tmp_path)), str(write(tmp_path / "result.json", chat))
    )
    assert (code, out) == (2, "")
    assert "result.json: message 3 (id 4): date_unixtime '-inf' is out of range" in err
