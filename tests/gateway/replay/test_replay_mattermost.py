"""Replaying a Mattermost bulk export (JSONL): from_bot posts and bot lines, threads, bad input."""

from __future__ import annotations

import json
import zipfile
from collections.abc import Sequence
from pathlib import Path

import pytest

from gateway.app.jsonbody import MAX_DEPTH
from gateway.replay.inputs import MAX_LINE_BYTES
from tests.gateway.replay.replay_fixtures import START, replay_cli, replay_json, write_config

HEAD: list[dict[str, object]] = [
    {"type": "version", "version": 1},
    {"type": "team", "team": {"name": "lab", "display_name": "Lab", "type": "O"}},
    {"type": "channel", "channel": {"team": "lab", "name": "bots", "type": "O"}},
    {"type": "user", "user": {"username": "alice", "email": "a@x", "roles": "system_user"}},
    {"type": "bot", "bot": {"username": "pingbot", "display_name": "Ping", "owner": "alice"}},
]


def post(
    index: int, user: str, message: str, *, props: object = None, **fields: object
) -> dict[str, object]:
    """A `post` line's object, `index` seconds after START."""
    found: dict[str, object] = {
        "team": "lab",
        "channel": "bots",
        "user": user,
        "message": message,
        "create_at": (START + index) * 1000,
        "reactions": None,
        **fields,
    }
    if props is not None:
        found["props"] = props
    return found


def ping_pong(rounds: int = 8) -> list[dict[str, object]]:
    """A join, a person, then a bot user (a `bot` line) and a from_bot integration."""
    lines: list[dict[str, object]] = [
        {"type": "post", "post": post(-5, "alice", "alice joined", type="system_join_channel")},
        {"type": "post", "post": post(0, "alice", "hello @pingbot")},
    ]
    for index in range(rounds):
        if index % 2 == 0:
            lines.append({"type": "post", "post": post(1 + index, "pingbot", "ping")})
        else:
            hook = post(1 + index, "alice", "pong", props={"from_bot": "true"})
            hook["user"] = "pongbot"
            lines.append({"type": "post", "post": hook})
    return lines


def write_export(path: Path, lines: Sequence[object]) -> Path:
    """A bulk export JSONL file: the head lines, then `lines`."""
    text = "".join(json.dumps(line) + "\n" for line in [*HEAD, *lines])
    path.write_text(text, encoding="utf-8")
    return path


def refused(tmp_path: Path, path: Path, *extra: str) -> str:
    code, out, err = replay_cli("--config", str(write_config(tmp_path)), str(path), *extra)
    assert (code, out) == (2, ""), err
    assert err.startswith("replay error: ")
    return err


PAIR = {
    "bots": ["pingbot", "pongbot"],
    "events": 7,
    "refused": 4,
    "cooldowns_opened": 1,
    "first_cooldown_at": "2024-01-01T12:00:05.000+00:00",
}


def test_issue23_mattermost_ping_pong_is_cut_at_the_pair_budget(tmp_path: Path) -> None:
    path = write_export(tmp_path / "export.jsonl", ping_pong())
    figures = replay_json(write_config(tmp_path), path)
    assert figures["rooms"] == [
        {
            "room": "lab/bots",
            "platform": "mattermost",
            "messages": 9,
            "consecutive_turn_cuts": 0,
            "room_budget_cuts": 0,
            "room_cooldowns_opened": 0,
            "pairs": [{**PAIR, "refused_message_ids": ["12", "13", "14", "15"]}],
        }
    ]
    assert figures["skipped"] == {"service": 1}


def test_issue23_mattermost_replies_direct_posts_and_bot_flag(tmp_path: Path) -> None:
    # The ping-pong in a thread of a direct channel, pongbot marked by --bot only.
    replies = [
        {
            "user": ("pingbot", "pongbot")[index % 2],
            "message": "again",
            "create_at": (START + 1 + index) * 1000,
        }
        for index in range(8)
    ]
    root = {
        "channel_members": ["pongbot", "pingbot"],
        "user": "pingbot",
        "message": "start",
        "create_at": START * 1000 - 1000,
        "replies": replies,
    }
    later = post(2, "alice", "a post of another channel, after the first replies")
    later["channel"] = "general"
    lines = [{"type": "direct_post", "direct_post": root}, {"type": "post", "post": later}]
    figures = replay_json(
        write_config(tmp_path),
        write_export(tmp_path / "dm.jsonl", lines),
        extra=["--bot", "pongbot"],
    )
    rooms = {room["room"]: room for room in figures["rooms"]}
    assert rooms["lab/general"]["messages"] == 1
    [pair] = rooms["pingbot,pongbot"]["pairs"]
    assert pair == {
        "bots": ["pingbot", "pongbot"],
        "events": 7,
        "refused": 4,
        "cooldowns_opened": 1,
        "first_cooldown_at": "2024-01-01T12:00:05.000+00:00",
        "refused_message_ids": ["6.5", "6.6", "6.7", "6.8"],
    }


def test_issue23_mattermost_auto_detection_folder_and_zip(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    path = write_export(tmp_path / "export.jsonl", ping_pong())
    folder = tmp_path / "unpacked"
    folder.mkdir()
    (folder / "import.jsonl").write_bytes(path.read_bytes())
    archive = tmp_path / "export.zip"
    with zipfile.ZipFile(archive, "w") as zipped:
        zipped.writestr("import.jsonl", path.read_bytes())
        zipped.writestr("data/file.txt", "attachment")
    for found in (path, folder, archive):
        assert replay_json(config, found)["rooms"][0]["platform"] == "mattermost"
    figures = replay_json(config, path, extra=["--format", "mattermost"])
    assert figures["rooms"][0]["pairs"][0]["refused"] == 4


def test_issue23_mattermost_skips_are_counted_with_a_reason(tmp_path: Path) -> None:
    lines: list[object] = [
        *ping_pong(2),
        {"type": "post", "post": post(20, "alice", "")},
        {"type": "post", "post": post(21, "", "who?")},
        {"type": "post", "post": post(22, "alice", "x", type="custom_plugin")},
        {"type": "post", "post": post(23, "alice", "x", type=["system_"])},
        {"type": "reaction_weird", "x": 1},
        {"type": ["post"], "post": {}},
        {"type": "direct_channel", "direct_channel": {"members": ["a", "b"]}},
    ]
    figures = replay_json(write_config(tmp_path), write_export(tmp_path / "e.jsonl", lines))
    assert figures["skipped"] == {"service": 1, "no_text": 1, "no_sender": 1, "unknown_type": 4}


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        ("9" * 401, "create_at (an integer of ~401 digits) is out of range"),
        ('"1704110401000"', "create_at must be milliseconds since 1970, got '1704110401000'"),
        ("null", "create_at is missing"),
        ("{}", "create_at must be milliseconds since 1970, got {}"),
        ("1e300", "create_at 1e+300 is out of range"),
        ("9" * 5000, "not acceptable JSON: Exceeds the limit (4300 digits)"),
    ],
)
def test_issue23_mattermost_bad_times_exit_2_naming_the_line(
    tmp_path: Path, raw: str, why: str
) -> None:
    path = write_export(tmp_path / "e.jsonl", ping_pong())
    path.write_text(
        path.read_text().replace(f'"create_at": {(START + 1) * 1000}', f'"create_at": {raw}')
    )
    assert f"e.jsonl: line 8: {why}" in refused(tmp_path, path)


def test_issue23_mattermost_wrong_shapes_exit_2_naming_the_line(tmp_path: Path) -> None:
    bad_reply = {
        **post(1, "alice", "root"),
        "replies": [{"user": "a", "message": "x", "create_at": 1}, 7],
    }
    for line, why in [
        ([1, 2], "line 6: is not a JSON object"),
        ({"type": "post", "post": "text"}, "line 6: post is not a JSON object"),
        (
            {"type": "post", "post": {**post(1, "a", "x"), "replies": {}}},
            "line 6: replies is not a list",
        ),
        ({"type": "post", "post": bad_reply}, "line 6 reply 2: is not a JSON object"),
    ]:
        path = write_export(tmp_path / "e.jsonl", [line])
        assert f"e.jsonl: {why}" in refused(tmp_path, path)


def test_issue23_mattermost_hostile_lines_exit_2_naming_the_line(tmp_path: Path) -> None:
    path = write_export(tmp_path / "e.jsonl", ping_pong())
    lines = path.read_text().splitlines(keepends=True)
    deep = lines[:7] + ["[" * 5000 + "]" * 5000 + "\n"] + lines[7:]
    path.write_text("".join(deep))
    assert f"e.jsonl: line 8: JSON is nested deeper than {MAX_DEPTH}" in refused(tmp_path, path)
    path.write_bytes("".join(lines).encode().replace(b"hello", b"h\xe9llo"))
    assert "e.jsonl: line 7: body is not UTF-8" in refused(tmp_path, path)
    huge = json.dumps({"type": "post", "post": post(1, "alice", "a" * MAX_LINE_BYTES)})
    path.write_text("".join(lines[:6]) + huge + "\n")
    assert f"e.jsonl: line 7: is longer than {MAX_LINE_BYTES:,} bytes" in refused(tmp_path, path)
    path.write_text("".join(lines[:6]) + '{"type": "post", "post": {"create_at": NaN}}\n')
    assert "e.jsonl: line 7: " in refused(tmp_path, path)


def test_issue23_mattermost_every_record_skipped_exits_2(tmp_path: Path) -> None:
    lines = [
        {"type": "post", "post": post(1, "alice", "", props={"from_bot": "true"})},
        {"type": "post", "post": post(2, "alice", "x", type="system_header_change")},
    ]
    path = write_export(tmp_path / "e.jsonl", lines)
    assert refused(tmp_path, path) == (
        f"replay error: {path}: every record was skipped (2 records: no_text 1, service 1); "
        "nothing to replay\n"
    )
