"""`loopwarden calls export`: CSV on stdout by default, `--csv` optional (issue 22)."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest

from gateway.calls.export import CSV_COLUMNS
from gateway.cli.main import main


@pytest.mark.parametrize("flags", [[], ["--csv"]])
def test_issue22_calls_export_writes_csv_by_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str]
) -> None:
    state = tmp_path / "state.sqlite3"
    config = tmp_path / "loopwarden.yaml"
    config.write_text(f"state: {{backend: sqlite, path: '{state}'}}\n", encoding="utf-8")
    assert main(["calls", "export", *flags, "--config", str(config)]) == 0
    captured = capsys.readouterr()
    assert list(csv.reader(io.StringIO(captured.out))) == [list(CSV_COLUMNS)]
    assert captured.err == ""
