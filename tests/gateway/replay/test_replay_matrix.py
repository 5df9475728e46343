"""Replaying Element's (Matrix) JSON chat export: notices are bots, --bot, threads, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.app.jsonbody import MAX_DEPTH
from tests.gateway.replay.replay_fixtures import START, replay_cli, replay_json, write_config

ROOM = "!lab:example.org"


def event(
    index: int, sender: str, body: str, *, msgtype: str = "m.text", **fields: object
) -> dict[str, object]:
    """An `m.room.message` event as Element's export writes it, `index` seconds after START."""
    return {
        "type": "m.room.message",
        "sender": sender,
        "content": {"msgtype": msgtype, "body": body},
        "origin_server_ts": (START + index) * 1000,
        "unsigned": {"age": 1234},
        "event_id": f"$ev{index}",
        "room_id": ROOM,
        **fields,
    }


def ping_pong(rounds: int = 8) -> list[dict[str, object]]:
    """A person, a join, then a notice bot and a text bot answering each other."""
    events: list[dict[str, object]] = [
        {
            "type": "m.room.member",
            "sender": "@ping:example.org",
            "state_key": "@ping:example.org",
            "content": {"membership": "join"},
            "origin_server_ts": (START - 5) * 1000,
            "event_id": "$join",
            "room_id": ROOM,
        },
        event(0, "@alice:example.org", "hello bots"),
    ]
    for index in range(rounds):
        if index % 2 == 0:
            events.append(event(1 + index, "@ping:example.org", "ping", msgtype="m.notice"))
        else:
            events.append(event(1 + index, "@telegram_pong:example.org", "pong"))
    return events


def write_export(path: Path, events: list[dict[str, object]]) -> Path:
    """An Element "Export chat" JSON file of one room."""
    document = {
        "room_name": "Bot lab",
        "room_creator": "Alice",
        "topic": "",
        "export_date": "2024-01-02",
        "exported_by": "Alice",
        "messages": events,
    }
    path.write_text(json.dumps(document, indent=2), encoding="utf-8")
    return path


def refused(tmp_path: Path, path: Path, *extra: str) -> str:
    code, out, err = replay_cli("--config", str(write_config(tmp_path)), str(path), *extra)
    assert (code, out) == (2, ""), err
    assert err.startswith("replay error: ")
    return err


def test_issue23_matrix_ping_pong_is_cut_at_the_pair_budget(tmp_path: Path) -> None:
    path = write_export(tmp_path / "matrix - Bot lab.json", ping_pong())
    figures = replay_json(
        write_config(tmp_path), path, extra=["--bot", "@telegram_pong:example.org"]
    )
    assert figures["rooms"] == [
        {
            "room": ROOM,
            "platform": "matrix",
            "messages": 9,
            "consecutive_turn_cuts": 0,
            "room_budget_cuts": 0,
            "room_cooldowns_opened": 0,
            "pairs": [
                {
                    "bots": ["@ping:example.org", "@telegram_pong:example.org"],
                    "events": 7,
                    "refused": 4,
                    "cooldowns_opened": 1,
                    "first_cooldown_at": "2024-01-01T12:00:05.000+00:00",
                    "refused_message_ids": ["$ev5", "$ev6", "$ev7", "$ev8"],
                }
            ],
        }
    ]
    assert figures["skipped"] == {"service": 1}


def test_issue23_matrix_without_bot_flag_only_notice_senders_are_bots(tmp_path: Path) -> None:
    path = write_export(tmp_path / "export.json", ping_pong())
    figures = replay_json(write_config(tmp_path), path, "--format", "matrix")
    assert figures["rooms"][0]["pairs"] == []  # the m.text bot is taken for a person


def test_issue23_matrix_threads_mentions_and_skips(tmp_path: Path) -> None:
    thread = {"rel_type": "m.thread", "event_id": "$ev0"}
    events = ping_pong(4)
    for found in events[2:]:
        found["content"]["m.relates_to"] = thread  # type: ignore[index]
    edit = event(9, "@alice:example.org", "* fixed", **{})
    edit["content"]["m.relates_to"] = {"rel_type": "m.replace", "event_id": "$ev0"}  # type: ignore[index]
    events += [
        edit,
        event(10, "@alice:example.org", "cat.png", msgtype="m.image"),
        event(11, "@alice:example.org", "", msgtype="m.text"),
        event(12, "@alice:example.org", "?", msgtype="org.example.custom"),
        {**event(13, "@alice:example.org", "x"), "type": "m.reaction"},
        {**event(14, "@alice:example.org", "x"), "type": "org.example.event"},
        {key: value for key, value in event(15, "", "x").items() if key != "sender"},
        {key: value for key, value in event(16, "@a:x", "x").items() if key != "event_id"},
    ]
    figures = replay_json(
        write_config(tmp_path),
        write_export(tmp_path / "export.json", events),
        extra=["--bot", "@telegram_pong:example.org"],
    )
    [room] = figures["rooms"]
    assert room["messages"] == 5
    assert room["pairs"][0]["events"] == 3
    assert figures["skipped"] == {
        "service": 3,
        "no_text": 2,
        "unknown_type": 2,
        "no_sender": 1,
        "no_id": 1,
    }


def test_issue23_matrix_auto_detection_picks_the_export(tmp_path: Path) -> None:
    path = write_export(tmp_path / "export.json", ping_pong())
    figures = replay_json(write_config(tmp_path), path)
    assert figures["rooms"][0]["platform"] == "matrix"


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        ("9" * 401, "message 2: not valid JSON: parse error: integer overflow"),
        ('"1704110401000"', "origin_server_ts must be milliseconds since 1970, got '17041"),
        ("[1]", "origin_server_ts must be milliseconds since 1970, got [1]"),
        ("true", "origin_server_ts must be milliseconds since 1970, got True"),
        ("1e300", "origin_server_ts 1e+300 is out of range"),
        ("-62135596800001", "origin_server_ts -62135596800001 is out of range"),
    ],
)
def test_issue23_matrix_bad_times_exit_2_naming_the_record(
    tmp_path: Path, raw: str, why: str
) -> None:
    path = write_export(tmp_path / "export.json", ping_pong())
    text = path.read_text().replace(
        f'"origin_server_ts": {(START + 1) * 1000}', f'"origin_server_ts": {raw}'
    )
    path.write_text(text)
    err = refused(tmp_path, path)
    assert f"{path}: message 2" in err
    assert why in err


def test_issue23_matrix_wrong_types_are_skipped_or_named(tmp_path: Path) -> None:
    events = ping_pong()
    events[2] = {**events[2], "type": ["m.room.message"], "content": [1, 2]}
    events[3] = {**events[3], "content": {"msgtype": {"x": 1}, "body": 5}}
    events[4] = {**events[4], "content": {"msgtype": "m.text", "body": ["x"]}, "sender": 7}
    events[5] = {**events[5], "content": {"msgtype": "m.text", "body": "x", "m.mentions": 3}}
    figures = replay_json(write_config(tmp_path), write_export(tmp_path / "e.json", events))
    assert figures["skipped"] == {"service": 1, "unknown_type": 1, "no_text": 2}
    events[6] = "not an event"  # type: ignore[call-overload]
    assert "e.json: message 6: is not a JSON object" in refused(
        tmp_path, write_export(tmp_path / "e.json", events)
    )


def test_issue23_matrix_hostile_bytes_exit_2_naming_the_record(tmp_path: Path) -> None:
    path = write_export(tmp_path / "deep.json", ping_pong())
    path.write_text(path.read_text().replace('"join"', "[" * 100_000 + "]" * 100_000, 1))
    assert f"deep.json: message 0: JSON is nested deeper than {MAX_DEPTH} levels" in refused(
        tmp_path, path
    )
    path = write_export(tmp_path / "latin.json", ping_pong())
    path.write_bytes(path.read_bytes().replace(b"hello bots", b"h\xe9llo", 1))
    err = refused(tmp_path, path)
    assert "latin.json: message 1: not valid JSON: lexical error: invalid bytes in UTF8" in err
    huge = event(1, "@alice:example.org", "a" * (3 * 1024**2))
    path = write_export(tmp_path / "huge.json", [huge, *ping_pong()])
    assert replay_json(write_config(tmp_path), path)["rooms"][0]["messages"] == 10


def test_issue23_matrix_every_record_skipped_exits_2(tmp_path: Path) -> None:
    events = [event(1, "@a:x", "", msgtype="m.text"), {**event(2, "@a:x", "x"), "state_key": ""}]
    events[1]["type"] = "m.room.topic"
    path = write_export(tmp_path / "e.json", events)
    assert refused(tmp_path, path) == (
        f"replay error: {path}: every record was skipped (2 records: no_text 1, service 1); "
        "nothing to replay\n"
    )
