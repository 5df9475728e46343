"""The calls CSV export: no cell is a formula in any list-separator setting (issue 20)."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from gateway.calls.entry import CallLogEntry
from gateway.calls.export import CSV_COLUMNS, write_csv
from tests.gateway.replay.replay_fixtures import START, replay_json, write_config

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
HOSTILE = (
    "abc;=7+7",
    '=HYPERLINK("http://evil.example","x")',
    "ok; =1+1",
    'ok;"=1+1',
    "x\t@SUM(A1)",
    "line\n+1",
    "a,-2;b",
    "\t=1",
    "café;ｘ",
)


def call(n: int, text: str) -> CallLogEntry:
    """A forwarded call whose agent, session and rule fields all hold `text`."""
    return CallLogEntry(
        at=START + n,
        provider="openai",
        agent=text,
        session=text,
        circuit=f"c{n}",
        model="gpt-4o-mini",
        outcome="forwarded",
        status=200,
        input_tokens=10,
        output_tokens=5,
        fingerprint=f"fp{n}",
        fields={"step": text, "customer": text, "user": text, "feature": text},
    )


def exported(texts: tuple[str, ...]) -> str:
    out = io.StringIO()
    write_csv([call(n, text) for n, text in enumerate(texts)], out)
    return out.getvalue()


def live_parts(text: str, separator: str) -> list[str]:
    """Every cell of a reading of `text` that splits at `separator` and at line breaks,
    as a spreadsheet with that list separator does when quotes do not start a cell,
    that starts (after spaces and quotes) with what starts a formula."""
    parts = [part for line in text.splitlines() for part in line.split(separator)]
    return [part for part in parts if part.lstrip(' "').startswith(FORMULA_STARTS)]


def test_issue20_no_cell_is_a_formula_with_a_semicolon_or_tab_separator() -> None:
    text = exported(HOSTILE)
    for separator in (",", ";", "\t"):
        assert live_parts(text, separator) == [], separator
    # Read as the CSV it is, each cell is the text with a `'` before each live part.
    rows = list(csv.reader(io.StringIO(text, newline="")))
    assert rows[0] == list(CSV_COLUMNS)
    agents = [row[CSV_COLUMNS.index("agent")] for row in rows[1:]]
    assert agents == [
        "abc;'=7+7",
        '\'=HYPERLINK("http://evil.example","x")',
        "ok;' =1+1",
        "ok;'\"=1+1",
        "x\t'@SUM(A1)",
        "line\n'+1",
        "a,'-2;b",
        "'\t'=1",
        "café;ｘ",
    ]
    # A European spreadsheet's own reading (`;`, quotes honoured where a cell starts).
    for row in csv.reader(io.StringIO(text, newline=""), delimiter=";"):
        assert not [cell for cell in row if cell.lstrip(' "').startswith(FORMULA_STARTS)]


def test_issue20_the_neutralised_export_replays(tmp_path: Path) -> None:
    path = tmp_path / "calls.csv"
    path.write_text(exported(HOSTILE), encoding="utf-8")
    config = write_config(
        tmp_path, "proxy:\n  call_loop: {max_repeats: 2, window_seconds: 60, pause_seconds: 60}\n"
    )
    figures = replay_json(config, path)
    agents = figures["calls"]["agents"]
    assert sum(s["calls"] for a in agents for s in a["sessions"]) == len(HOSTILE)
    assert "abc;'=7+7" in {a["agent"] for a in agents}
