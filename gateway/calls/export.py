"""The request log as CSV (`loopwarden calls export --csv`), one row per call, oldest first.

Columns: time (ISO 8601, UTC), provider, agent, session, circuit, model, outcome,
status, input_tokens, output_tokens, cost, cost_estimated, rule, retry, duration_ms,
the other rule fields (step, customer, user, feature) and the call's fingerprint: a
column a `CallLogEntry` field, in its order, each cell written by the field's kind
(`CSV_COLUMNS` is derived from the fields, `gateway.calls.codec.LOG_FIELDS`). An
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
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import TextIO, cast

from gateway.calls.codec import LOG_FIELDS
from gateway.calls.entry import CallLogEntry, LogKind

# Where a spreadsheet may start a cell (the cell's start, or after a separator or line
# break of some list-separator setting) followed, after spaces and quotes, by what starts
# a formula. The `'` goes right after the boundary.
_LIVE_PART = re.compile(r"""(^|[,;\t\r\n])(?=[ "]*[=+\-@\t\r])""")
FIELD_COLUMNS = ("step", "customer", "user", "feature")
"""The rule fields a call carries (`CallLogEntry.fields`) that get a column of their own."""


def call_time(at: float) -> str:
    """A logged call's time as the export and the Calls page show it: ISO 8601 UTC, in ms."""
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="milliseconds")


def _or_empty(value: object) -> str:
    """The value as text, an unknown (None) one as an empty cell."""
    return "" if value is None else str(value)


def _decimals(places: int) -> Callable[[object], str]:
    """A number's cell with `places` decimals (None: an empty cell)."""

    def cell(value: object) -> str:
        return "" if value is None else f"{cast(float, value):.{places}f}"

    return cell


_CELL: Mapping[LogKind, Callable[[object], str]] = {
    "time": lambda value: call_time(cast(float, value)),
    "text": _or_empty,
    "outcome": str,
    "int": _or_empty,
    "money": _decimals(6),
    "flag": lambda value: "true" if value else "false",
    "ms": _decimals(3),
}
_CELLS = tuple((spec.name, _CELL.get(spec.kind)) for spec in LOG_FIELDS)
CSV_COLUMNS = tuple(
    column
    for spec in LOG_FIELDS
    for column in (FIELD_COLUMNS if spec.kind == "fields" else (spec.column,))
)
"""The header: a column a `CallLogEntry` field (`fields`: one each of `FIELD_COLUMNS`)."""


def csv_row(entry: CallLogEntry) -> list[str]:
    """One entry as CSV cells, in `CSV_COLUMNS` order, none of them a formula."""
    cells: list[str] = []
    for name, cell in _CELLS:
        if cell is None:  # the rule fields, spread over their columns
            fields = entry.fields
            cells.extend(_inert(fields.get(column, "")) for column in FIELD_COLUMNS)
        else:
            cells.append(_inert(cell(getattr(entry, name))))
    return cells


def write_csv(entries: Iterable[CallLogEntry], out: TextIO) -> int:
    """Write the header and one row per entry; the number of rows written."""
    writer = csv.writer(out)
    writer.writerow(CSV_COLUMNS)
    rows = 0
    for entry in entries:
        writer.writerow(csv_row(entry))
        rows += 1
    return rows


def _inert(cell: str) -> str:
    """The cell, with a `'` before each part of it a spreadsheet would take for a formula."""
    return _LIVE_PART.sub(r"\1'", cell)
