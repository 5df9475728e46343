"""The request log as CSV (`loopwarden calls export --csv`), one row per call, oldest first.

Columns: time (ISO 8601, UTC), provider, agent, session, circuit, model, outcome,
status, input_tokens, output_tokens, cost, cost_estimated, rule, retry, duration_ms,
the other rule fields (step, customer, user, feature) and the call's fingerprint. An
unknown value is an empty cell. The console's download (`GET /admin/calls.csv`) writes the
same rows.

Decisions where DESIGN.md is silent: no cell a spreadsheet would read as a formula, in
any list-separator setting. A spreadsheet whose list separator is `;` (most of Europe)
splits each line of this comma-separated file at every `;`, and ignores the quotes around
a cell that no longer starts a field, so `abc;=7+7` in an agent name makes a cell `=7+7`
there; a tab-separated reading splits at tabs, and any reading starts a new line at a
line break inside a cell. So a `'` goes in front of every part of a cell that starts
(after spaces and double quotes) with `=`, `+`, `-`, `@`, a tab or a carriage return,
whether the part starts the cell or follows a `,`, `;`, tab or line break in it:
`=HYPERLINK(...)` is written `'=HYPERLINK(...)`, `abc;=7+7` is `abc;'=7+7`. Everything
else of the cell is kept, and the file is ordinary CSV (`loopwarden replay` reads it).
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import TextIO

from gateway.calls.entry import CallLogEntry

# Where a spreadsheet may start a cell (the cell's start, or after a separator or line
# break of some list-separator setting) followed, after spaces and quotes, by what starts
# a formula. The `'` goes right after the boundary.
_LIVE_PART = re.compile(r"""(^|[,;\t\r\n])(?=[ "]*[=+\-@\t\r])""")
CSV_COLUMNS = (
    "time",
    "provider",
    "agent",
    "session",
    "circuit",
    "model",
    "outcome",
    "status",
    "input_tokens",
    "output_tokens",
    "cost",
    "cost_estimated",
    "rule",
    "retry",
    "duration_ms",
    "step",
    "customer",
    "user",
    "feature",
    "fingerprint",
)


def csv_row(entry: CallLogEntry) -> list[str]:
    """One entry as CSV cells, in `CSV_COLUMNS` order, none of them a formula."""
    fields = entry.fields
    cells = [
        call_time(entry.at),
        entry.provider,
        entry.agent,
        entry.session,
        entry.circuit,
        entry.model,
        entry.outcome,
        _cell(entry.status),
        _cell(entry.input_tokens),
        _cell(entry.output_tokens),
        "" if entry.cost is None else f"{entry.cost:.6f}",
        "true" if entry.estimated else "false",
        entry.rule or "",
        str(entry.retry),
        f"{entry.duration_ms:.3f}",
        fields.get("step", ""),
        fields.get("customer", ""),
        fields.get("user", ""),
        fields.get("feature", ""),
        entry.fingerprint,
    ]
    return [_inert(cell) for cell in cells]


def call_time(at: float) -> str:
    """A logged call's time as the export and the Calls page show it: ISO 8601 UTC, in ms."""
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="milliseconds")


def write_csv(entries: Iterable[CallLogEntry], out: TextIO) -> int:
    """Write the header and one row per entry; the number of rows written."""
    writer = csv.writer(out)
    writer.writerow(CSV_COLUMNS)
    rows = 0
    for entry in entries:
        writer.writerow(csv_row(entry))
        rows += 1
    return rows


def _cell(value: int | None) -> str:
    return "" if value is None else str(value)


def _inert(cell: str) -> str:
    """The cell, with a `'` before each part of it a spreadsheet would take for a formula."""
    return _LIVE_PART.sub(r"\1'", cell)
