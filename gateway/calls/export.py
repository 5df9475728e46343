"""The request log as CSV (`loopwarden calls export --csv`), one row per call, oldest first.

Columns: time (ISO 8601, UTC), provider, agent, session, circuit, model, outcome,
status, input_tokens, output_tokens, cost, cost_estimated, rule, retry, duration_ms,
the other rule fields (step, customer, user, feature) and the call's fingerprint. An
unknown value is an empty cell. The console's download (`GET /admin/calls.csv`) writes the
same rows.

Decisions where DESIGN.md is silent: a cell a spreadsheet would read as a formula (it
starts with `=`, `+`, `-`, `@`, a tab or a carriage return: an agent named
`=HYPERLINK(...)`, say) is written with a leading `'`, so opening the export runs nothing.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import TextIO

from gateway.calls.store import CallLogEntry

_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
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
    """The cell, with a leading `'` when a spreadsheet would take it for a formula."""
    return f"'{cell}" if cell.startswith(_FORMULA_STARTS) else cell
