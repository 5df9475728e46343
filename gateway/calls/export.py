"""The request log as CSV (`loopwarden calls export --csv`), one row per call, oldest first.

Columns: time (ISO 8601, UTC), provider, agent, session, circuit, model, outcome,
status, input_tokens, output_tokens, cost, cost_estimated, rule, retry, duration_ms,
the other rule fields (step, customer, user, feature) and the call's fingerprint. An
unknown value is an empty cell.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import TextIO

from gateway.calls.store import CallLogEntry

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
    """One entry as CSV cells, in `CSV_COLUMNS` order."""
    fields = entry.fields
    return [
        datetime.fromtimestamp(entry.at, UTC).isoformat(timespec="milliseconds"),
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
