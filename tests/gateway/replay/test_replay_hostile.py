"""Bad input: exit 2 naming the file, the record and why; never a crash or a blow-up."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import stat
import zipfile
from pathlib import Path

import ijson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.app.jsonbody import MAX_DEPTH
from gateway.cli.replay import run
from gateway.config import parse_config
from gateway.replay.inputs import (
    CHUNK,
    CheckedStream,
    DepthCheck,
    DepthError,
    Limits,
    stream_events,
)
from tests.gateway.replay.replay_fixtures import (
    CONFIG,
    discord_author,
    discord_message,
    ping_pong_discord,
    replay_cli,
    replay_json,
    slack_export,
    slack_ts,
    write_config,
    write_discord,
)

BOT = discord_author("222", "PingBot", bot=True)


def refused(tmp_path: Path, *inputs: Path | str) -> str:
    """The error line of a replay that must exit 2."""
    code, out, err = replay_cli("--config", str(write_config(tmp_path)), *map(str, inputs))
    assert code == 2, (out, err)
    assert out == ""
    assert err.startswith("replay error: ")
    return err


def test_issue13_truncated_discord_export_names_file_and_record(tmp_path: Path) -> None:
    path = ping_pong_discord(tmp_path / "general.json")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) * 2 // 3])
    err = refused(tmp_path, path)
    assert str(path) in err
    assert "ends early (truncated?)" in err
    assert "message " in err


def test_issue13_record_without_timestamp_is_fatal(tmp_path: Path) -> None:
    messages = [discord_message(str(i), i, BOT, "x") for i in range(4)]
    del messages[2]["timestamp"]
    err = refused(tmp_path, write_discord(tmp_path / "c.json", messages))
    assert "c.json: message 2 (id 2): timestamp is missing" in err


def test_issue13_slack_and_csv_records_without_time_name_their_place(tmp_path: Path) -> None:
    export = slack_export()
    day = list(export.files["bots/2024-01-01.json"])  # type: ignore[call-overload]
    day[3] = {key: value for key, value in day[3].items() if key != "ts"}
    folder = type(export)({**export.files, "bots/2024-01-01.json": day}).folder(tmp_path / "ex")
    assert "bots/2024-01-01.json: message 3: ts is missing" in refused(tmp_path, folder)
    csv_path = tmp_path / "calls.csv"
    header = (
        "time,provider,agent,session,circuit,model,outcome,status,input_tokens,"
        "output_tokens,cost,cost_estimated,rule,retry,duration_ms,step,customer,user,feature,"
        "fingerprint\n"
    )
    row = (
        "2024-01-01T12:00:00.000+00:00,openai,a,s,a/session=s,m,forwarded,200,1,1,,false,,0,"
        "1.000,,,,,fp\n"
    )
    csv_path.write_text(header + row + row.replace("2024-01-01T12:00:00.000+00:00", ""))
    assert "calls.csv: line 3: time is missing" in refused(tmp_path, csv_path)


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("notes.txt", b"just some notes\n"),
        ("empty.json", b""),
        ("array.json", b"[1, 2, 3]"),
        ("image.png", b"\x89PNG\r\n\x1a\n" + bytes(range(256))),
        ("latin1.json", b'{"caf\xe9": 1}'),
    ],
)
def test_issue13_unknown_format_is_refused(tmp_path: Path, name: str, content: bytes) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    err = refused(tmp_path, path)
    assert f"{path}: unknown format" in err


def test_issue13_missing_input_is_refused(tmp_path: Path) -> None:
    assert "no such file or folder" in refused(tmp_path, tmp_path / "nope.json")


@pytest.mark.parametrize(
    ("member", "why"),
    [
        ("../escape.json", "escapes the zip's folder"),
        ("bots/../../escape.json", "escapes the zip's folder"),
        ("/etc/passwd", "absolute path"),
        ("C:/Windows/x.json", "absolute path"),
        ("..\\windows.json", "escapes the zip's folder"),
    ],
)
def test_issue13_zip_member_escaping_its_folder_is_refused(
    tmp_path: Path, member: str, why: str
) -> None:
    path = slack_export().zip(tmp_path / "export.zip")
    with zipfile.ZipFile(path, "a") as archive:
        archive.writestr(member, "[]")
    err = refused(tmp_path, path)
    assert "export.zip: member " in err
    assert why in err


def test_issue13_zip_symlink_member_is_refused(tmp_path: Path) -> None:
    path = slack_export().zip(tmp_path / "export.zip")
    link = zipfile.ZipInfo("bots/2024-01-02.json")
    link.external_attr = (stat.S_IFLNK | 0o777) << 16
    with zipfile.ZipFile(path, "a") as archive:
        archive.writestr(link, "/etc/passwd")
    assert "a symlink in the zip" in refused(tmp_path, path)


def test_issue13_folder_symlink_out_of_the_export_is_refused(tmp_path: Path) -> None:
    folder = slack_export().folder(tmp_path / "export")
    outside = tmp_path / "secret.json"
    outside.write_text("[]")
    os.symlink(outside, folder / "bots" / "2024-01-02.json")
    assert "points outside the export's folder" in refused(tmp_path, folder)


def test_issue13_zip_bomb_stops_at_the_bound(tmp_path: Path) -> None:
    export = slack_export()
    path = export.zip(tmp_path / "export.zip")
    with zipfile.ZipFile(path, "a", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("bots/2024-01-02.json", b"[" + b" " * (8 * 1024**2) + b"]")
    err = io.StringIO()
    code = run(
        parse_config(CONFIG, env={}),
        [str(path)],
        out=io.StringIO(),
        err=err,
        limits=Limits(max_bytes=1024**2, max_document_bytes=1024**2),
    )
    assert code == 2
    assert "2024-01-02.json: more than 1,048,576 bytes to read; refused" in err.getvalue()


def test_issue13_non_utf8_inputs_are_refused(tmp_path: Path) -> None:
    path = ping_pong_discord(tmp_path / "general.json")
    path.write_bytes(path.read_bytes().replace(b"again!", b"ag\xffin!"))
    assert "invalid bytes in UTF8 string" in refused(tmp_path, path)
    export = slack_export()
    folder = export.folder(tmp_path / "export")
    day = folder / "bots" / "2024-01-01.json"
    day.write_bytes(day.read_bytes().replace(b"ping", b"p\xe9ng"))
    assert "2024-01-01.json: body is not UTF-8" in refused(tmp_path, folder)
    csv_path = tmp_path / "calls.csv"
    csv_path.write_bytes(
        b"time,provider,agent,session,circuit,model,outcome,status,input_tokens,output_tokens,"
        b"cost,cost_estimated,rule,retry,duration_ms,step,customer,user,feature,fingerprint\n"
        b"2024-01-01T12:00:00Z,openai,caf\xe9,s,c,m,forwarded,200,1,1,,false,,0,1,,,,,fp\n"
    )
    assert "calls.csv: line 2: is not UTF-8" in refused(tmp_path, csv_path)


def test_issue13_deep_nesting_is_refused_before_parsing(tmp_path: Path) -> None:
    depth = 200_000  # ijson would need tens of GB for its prefixes at this depth
    path = tmp_path / "deep.json"
    head = ping_pong_discord(tmp_path / "ok.json").read_bytes().split(b'"messages": [', 1)[0]
    path.write_bytes(head + b'"messages": [{"x": ' + b"[" * depth + b"]" * depth + b"}]}")
    assert f"nested deeper than {MAX_DEPTH} levels" in refused(tmp_path, path)
    jsonl = tmp_path / "deep.jsonl"
    first = json.dumps({"model": "m", "messages": [], "timestamp": "2024-01-01T00:00:00Z"})
    jsonl.write_text(first + "\n" + "[" * 5000 + "]" * 5000 + "\n")
    assert "deep.jsonl: line 2: JSON is nested deeper than" in refused(tmp_path, jsonl)


def test_issue13_huge_numbers_and_times_are_refused(tmp_path: Path) -> None:
    messages = [discord_message(str(i), i, BOT, "x") for i in range(3)]
    path = write_discord(tmp_path / "c.json", messages)
    digits = path.read_text().replace('"isPinned": false', '"isPinned": ' + "9" * 5000, 1)
    path.write_text(digits)
    assert "integer overflow" in refused(tmp_path, path)
    for stamp, why in [
        ("99999-01-01T00:00:00+00:00", "is not an ISO 8601 time"),
        ("1e308", "is out of range"),
        ("inf", "is not an ISO 8601 time"),
        ("9" * 5000, "is not a time (too long"),
    ]:
        messages[1]["timestamp"] = stamp
        err = refused(tmp_path, write_discord(tmp_path / "c.json", messages))
        assert "c.json: message 1 (id 1): timestamp" in err
        assert why in err
    jsonl = tmp_path / "calls.jsonl"
    jsonl.write_text(json.dumps({"model": "m", "messages": [], "timestamp": 1e308}) + "\n")
    assert "calls.jsonl: line 1: timestamp 1e+308 is out of range" in refused(tmp_path, jsonl)
    jsonl.write_text('{"model": "m", "messages": [], "timestamp": ' + "1" * 5000 + "}\n")
    assert "calls.jsonl: line 1:" in refused(tmp_path, jsonl)


def test_issue13_after_a_refused_input_the_next_replay_is_served(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_bytes(b"\x00\x01")
    config = parse_config(CONFIG, env={})
    assert run(config, [str(bad)], out=io.StringIO(), err=io.StringIO()) == 2
    out = io.StringIO()
    good = ping_pong_discord(tmp_path / "good.json")
    assert run(config, [str(good)], as_json=True, out=out, err=io.StringIO()) == 0
    assert json.loads(out.getvalue())["rooms"][0]["messages"] == 9


def test_issue13_slack_ts_out_of_range(tmp_path: Path) -> None:
    export = slack_export()
    day = list(export.files["bots/2024-01-01.json"])  # type: ignore[call-overload]
    day[1] = {**day[1], "ts": "1e308"}
    folder = type(export)({**export.files, "bots/2024-01-01.json": day}).folder(tmp_path / "ex")
    assert "message 1: ts '1e308' is out of range" in refused(tmp_path, folder)
    assert slack_ts(0)  # the fixture's ts stay plain


def nested(depth: int, filler: str) -> str:
    """Arrays `depth` deep, each level holding a string full of JSON syntax."""
    text = json.dumps(filler)
    return "".join(f"[{text}, " for _ in range(depth)) + "0" + "]" * depth


@settings(max_examples=60, deadline=None)
@given(
    depth=st.integers(min_value=MAX_DEPTH - 3, max_value=MAX_DEPTH + 3),
    filler=st.text(alphabet='[]{}"\\ab', max_size=12),
    cuts=st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=40),
)
def test_issue13_depth_check_is_exact_across_chunks(
    depth: int, filler: str, cuts: list[int]
) -> None:
    data = nested(depth, filler).encode()
    check = DepthCheck()
    start, index = 0, 0
    try:
        while start < len(data):
            size = cuts[index % len(cuts)]
            check.feed(data[start : start + size])
            start, index = start + size, index + 1
    except DepthError:
        assert depth > MAX_DEPTH
    else:
        assert depth <= MAX_DEPTH


def test_issue13_csv_token_count_of_5000_digits_is_refused(tmp_path: Path) -> None:
    csv_path = tmp_path / "calls.csv"
    csv_path.write_text(
        "time,provider,agent,session,circuit,model,outcome,status,input_tokens,output_tokens,"
        "cost,cost_estimated,rule,retry,duration_ms,step,customer,user,feature,fingerprint\n"
        f"2024-01-01T12:00:00Z,openai,a,s,c,m,forwarded,200,{'9' * 5000},1,,false,,0,1,,,,,fp\n"
    )
    assert "calls.csv: line 2: input_tokens must be a whole number" in refused(tmp_path, csv_path)


def telegram_export(path: Path, messages: list[dict[str, object]]) -> Path:
    """A Telegram Desktop `result.json` of one supergroup holding `messages`."""
    chat = {"name": "Lab", "type": "private_supergroup", "id": 42, "messages": messages}
    path.write_text(json.dumps(chat, ensure_ascii=False), encoding="utf-8")
    return path


def tg_message(index: int, **fields: object) -> dict[str, object]:
    """A Telegram Desktop message `index` seconds after 2024-01-01T12:00:00Z."""
    return {
        "id": index,
        "type": "message",
        "date_unixtime": str(1_704_110_400 + index),
        "from": "Alice",
        "from_id": "user100",
        "text": "hello",
        **fields,
    }


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        ("9" * 401, "date_unixtime (an integer of ~401 digits) is out of range"),
        ('"' + "9" * 401 + '"', "date_unixtime is not a time (too long: 401 characters)"),
        ('"0000-06-01T00:00:00"', "date_unixtime '0000-06-01T00:00:00' is not an ISO 8601 time"),
        (
            '"0001-01-01T00:30:00+01:00"',
            "date_unixtime '0001-01-01T00:30:00+01:00' is out of range",
        ),
        ("-1e308", "date_unixtime -1e+308 is out of range"),
        ("1e308", "date_unixtime 1e+308 is out of range"),
        ('"-inf"', "date_unixtime '-inf' is out of range"),
        ("-62135596801", "date_unixtime -62135596801 is out of range"),
    ],
)
def test_issue20_absurd_times_exit_2_naming_the_record(tmp_path: Path, raw: str, why: str) -> None:
    # The streamed Telegram reader, the Slack day files and a JSONL of bodies all refuse.
    path = telegram_export(tmp_path / "result.json", [tg_message(1), tg_message(2)])
    path.write_text(path.read_text().replace('"1704110402"', raw, 1))
    err = refused(tmp_path, path)
    if raw.startswith("9" * 20):  # a bare 401-digit number is past the streaming parser
        assert "result.json: message 1: not valid JSON: parse error: integer overflow" in err
    else:
        assert f"result.json: message 1 (id 2): {why}" in err
    export = slack_export()
    folder = export.folder(tmp_path / "slack")
    day = folder / "bots" / "2024-01-01.json"
    day.write_text(re.sub(r'"ts": "[0-9.]+"', lambda _: f'"ts": {raw}', day.read_text(), count=1))
    assert f"2024-01-01.json: message 0: {why.replace('date_unixtime', 'ts')}" in refused(
        tmp_path, folder
    )
    jsonl = tmp_path / "calls.jsonl"
    jsonl.write_text('{"model": "m", "messages": [], "timestamp": ' + raw + "}\n")
    assert f"calls.jsonl: line 1: {why.replace('date_unixtime', 'timestamp')}" in refused(
        tmp_path, jsonl
    )


def test_issue20_year_0_never_reaches_the_report(tmp_path: Path) -> None:
    # Two bots at the very start of year 1 in a zone east of UTC: year 0 in UTC, which
    # the report's ISO times (a cooldown's first time) cannot show.
    ping, pong = BOT, discord_author("333", "PongBot", bot=True)
    messages = [discord_message(str(i), i, (ping, pong)[i % 2], "x") for i in range(8)]
    for index, message in enumerate(messages):
        message["timestamp"] = f"0001-01-01T00:00:{index:02d}+01:00"
    err = refused(tmp_path, write_discord(tmp_path / "c.json", messages))
    assert "c.json: message 0 (id 0): timestamp '0001-01-01T00:00:00+01:00' is out of range" in err


@pytest.mark.parametrize(
    ("encoding", "why"),
    [("utf-16", "unknown format"), ("utf-16-le", "unknown format"), ("utf-32", "unknown format")],
)
def test_issue20_wide_encodings_are_refused(tmp_path: Path, encoding: str, why: str) -> None:
    path = telegram_export(tmp_path / "result.json", [tg_message(1)])
    path.write_bytes(path.read_text(encoding="utf-8").encode(encoding))
    assert f"{path}: {why}" in refused(tmp_path, path)
    code, _, err = replay_cli(
        "--config", str(write_config(tmp_path)), str(path), "--format", "telegram"
    )
    assert code == 2
    assert f"replay error: {path}: message 0: not valid JSON" in err


def test_issue20_latin1_text_in_a_telegram_export_is_refused(tmp_path: Path) -> None:
    path = telegram_export(tmp_path / "result.json", [tg_message(1), tg_message(2, text="café")])
    path.write_bytes(path.read_bytes().replace("café".encode(), "café".encode("latin-1")))
    err = refused(tmp_path, path)
    assert err.endswith(
        "result.json: message 1: not valid JSON: lexical error: invalid bytes in UTF8 string.\n"
    )
    assert "caf" not in err  # yajl's excerpt of the export is not quoted


def test_issue20_deep_nesting_in_a_telegram_message_is_refused(tmp_path: Path) -> None:
    path = telegram_export(tmp_path / "result.json", [tg_message(1), tg_message(2)])
    deep = "[" * 100_000 + "]" * 100_000
    path.write_text(path.read_text().replace('"hello"', deep, 1))
    assert f"result.json: message 0: JSON is nested deeper than {MAX_DEPTH} levels" in refused(
        tmp_path, path
    )


def test_issue20_5000_digit_ids_are_refused_or_skipped(tmp_path: Path) -> None:
    digits = "7" * 5000
    path = telegram_export(tmp_path / "result.json", [tg_message(1), tg_message(2)])
    path.write_text(path.read_text().replace('"from_id": "user100"', f'"from_id": {digits}', 1))
    assert "result.json: message 0: not valid JSON: parse error: integer overflow" in refused(
        tmp_path, path
    )
    path = telegram_export(
        tmp_path / "result.json", [tg_message(1, from_id="user" + digits), tg_message(2)]
    )
    figures = replay_json(write_config(tmp_path), path)
    assert figures["rooms"][0]["messages"] == 2  # a long id in text is an id like another
    export = slack_export()
    folder = export.folder(tmp_path / "slack")
    day = folder / "bots" / "2024-01-01.json"
    day.write_text(day.read_text().replace('"user": "U0ALICE"', f'"user": {digits}', 1))
    assert "2024-01-01.json:" in refused(tmp_path, folder)


def test_issue20_look_alike_keys_are_not_the_fields(tmp_path: Path) -> None:
    # Cyrillic "і" and "о", a trailing space, a zero-width space: none is the field.
    look_alikes = ["from_\u0456d", "fr\u043em_id", "from_id ", "from\u200b_id"]
    messages = [tg_message(1)]
    for index, key in enumerate(look_alikes, start=2):
        message = tg_message(index)
        message[key] = message.pop("from_id")
        messages.append(message)
    path = telegram_export(tmp_path / "result.json", messages)
    figures = replay_json(write_config(tmp_path), path)
    assert figures["rooms"][0]["messages"] == 1
    assert figures["skipped"] == {"no_sender": len(look_alikes)}
    dated = tg_message(9)
    dated["d\u0430te_unixtime"] = dated.pop("date_unixtime")  # Cyrillic "а"
    path = telegram_export(tmp_path / "result.json", [tg_message(1), dated])
    assert "result.json: message 1 (id 9): date is missing" in refused(tmp_path, path)


def test_issue20_every_record_skipped_exits_2_with_the_reasons(tmp_path: Path) -> None:
    silent = [tg_message(1, from_id=None), tg_message(2, type="service"), tg_message(3, text="")]
    path = telegram_export(tmp_path / "result.json", silent)
    code, out, err = replay_cli("--config", str(write_config(tmp_path)), str(path), "--json")
    assert (code, out) == (2, "")
    assert err == (
        f"replay error: {path}: every record was skipped (3 records: no_sender 1, no_text 1, "
        "service 1); nothing to replay\n"
    )
    good = ping_pong_discord(tmp_path / "general.json")
    code, out, err = replay_cli("--config", str(write_config(tmp_path)), str(path), str(good))
    assert code == 0
    assert err == (
        f"replay warning: {path}: every record was skipped (3 records: no_sender 1, "
        "no_text 1, service 1)\n"
    )
    assert "discord #general (800): 9 messages" in out
    empty = telegram_export(tmp_path / "empty.json", [])
    code, out, err = replay_cli("--config", str(write_config(tmp_path)), str(empty))
    assert (code, err) == (0, "")  # no record at all: nothing was skipped
    assert out == "nothing to replay: no message and no call in the inputs\n"


class CountingReads(io.BytesIO):
    """A file that keeps the size of every read asked of it."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.asked: list[int] = []

    def read(self, size: int | None = -1, /) -> bytes:
        self.asked.append(-1 if size is None else size)
        return super().read(size)


@pytest.mark.parametrize(
    "token",
    [
        b'"' + b"x" * (4 * CHUNK) + b'\\"' + b"y" * (60 * CHUNK) + b'"',  # a 4 MB string
        b'"' + b"\\\\" * (32 * CHUNK) + b'"',  # escapes only
        b"1" * (64 * CHUNK),  # a 4 MB number (refused by the parser once read)
    ],
)
def test_issue20_a_huge_token_is_read_in_reads_that_double(token: bytes) -> None:
    # yajl lexes a token cut by a read again from its start: with fixed 64 KiB reads a
    # 4 MB token would take 64 reads and 130 MB of lexing; reads that grow with the open
    # token take a handful and lex it about twice.
    data = b'{"messages": [{"text": ' + token + b"}]}"
    raw = CountingReads(data)
    stream = CheckedStream(raw, name="x.json", limit=1 << 30, progress=lambda _: None, json=True)
    with contextlib.suppress(ijson.JSONError):
        for _ in stream_events(stream):
            pass
    assert len(raw.asked) <= 12
    assert sum(raw.asked) <= 3 * len(data)  # and never asks for much more than there is


def test_issue20_huge_message_replays(tmp_path: Path) -> None:
    text = "a" * (3 * 1024**2) + "\\" + "b" * 100
    path = telegram_export(tmp_path / "result.json", [tg_message(1, text=text), tg_message(2)])
    assert replay_json(write_config(tmp_path), path)["rooms"][0]["messages"] == 2


@settings(max_examples=80, deadline=None)
@given(
    head=st.sampled_from(['{"a": [1, "x\\\\", ', '{"b": "\\"", "c": ', "[", '{"d": true, "e": ']),
    open_token=st.one_of(
        st.text(alphabet='ab\\"{}[],: ', max_size=30).map(
            lambda text: '"' + json.dumps(text)[1:-1]
        ),
        st.text(alphabet="0123456789.eE-", min_size=1, max_size=12),
    ),
    cuts=st.lists(st.integers(min_value=1, max_value=9), min_size=1, max_size=10),
)
def test_issue20_open_token_is_measured_across_chunks(
    head: str, open_token: str, cuts: list[int]
) -> None:
    data = (head + open_token).encode()
    check = DepthCheck()
    start, index = 0, 0
    while start < len(data):
        size = cuts[index % len(cuts)]
        check.feed(data[start : start + size])
        start, index = start + size, index + 1
    # A string counts from its opening quote; a trailing lone backslash waits a byte.
    assert check.open_bytes == len(open_token.encode())


@pytest.mark.parametrize("kind", [["Default"], {"a": 1}, True, 1.5, None])
def test_issue20_a_discord_message_type_of_the_wrong_type_is_skipped(
    tmp_path: Path, kind: object
) -> None:
    messages = [discord_message(str(i), i, BOT, f"ping {i}") for i in range(3)]
    messages[1]["type"] = kind
    path = write_discord(tmp_path / "c.json", messages)
    figures = replay_json(write_config(tmp_path), path)
    assert figures["skipped"] == {"unknown_type": 1}
