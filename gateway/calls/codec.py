"""A `CallLogEntry` as stored: plain JSON-able values (Redis, the console) and SQLite rows.

Both are derived from the entry's one list of fields (`LOG_FIELDS`, from
`dataclasses.fields(CallLogEntry)`): the plain form names each field as the entry does
(`fields` a JSON object), a SQLite row holds them in `LOG_COLUMNS` order (`fields` as
JSON text with sorted keys) in the table `LOG_TABLE` creates (a column a field, typed by
its kind, NOT NULL unless its default is None). Reading either back checks the outcome:
an unknown one is a `StateError` naming it, so a foreign or newer log never yields an
entry no code expects.
"""

from __future__ import annotations

import dataclasses
import json
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, NamedTuple, cast

from gateway.app.errors import StateError
from gateway.calls.entry import OUTCOMES, CallLogEntry, LogKind


class LogField(NamedTuple):
    """One field of `CallLogEntry` as the codecs read it."""

    name: str
    kind: LogKind
    optional: bool
    """None is a value of the field (its default is None): it is stored and read as None."""
    column: str
    """Its CSV column (`fields` has none of its own: it fills `FIELD_COLUMNS`)."""


LOG_FIELDS: tuple[LogField, ...] = tuple(
    LogField(
        spec.name,
        cast(LogKind, spec.metadata["kind"]),
        spec.default is None,
        cast(str | None, spec.metadata["csv"]) or spec.name,
    )
    for spec in dataclasses.fields(CallLogEntry)
)
LOG_COLUMNS = ", ".join(spec.name for spec in LOG_FIELDS)
"""The call_log table's columns of an entry, in `LOG_FIELDS` order (for SELECT and INSERT)."""

_SQL_TYPES: Mapping[LogKind, str] = {
    "time": "REAL",
    "text": "TEXT",
    "outcome": "TEXT",
    "int": "INTEGER",
    "money": "REAL",
    "flag": "INTEGER",
    "ms": "REAL",
    "fields": "TEXT",
}
LOG_TABLE = "CREATE TABLE IF NOT EXISTS call_log (id INTEGER PRIMARY KEY, {})".format(
    ", ".join(
        f"{spec.name} {_SQL_TYPES[spec.kind]}{'' if spec.optional else ' NOT NULL'}"
        for spec in LOG_FIELDS
    )
)
"""The call_log table: its id (the order entries were written in), then a column a field."""


def _outcome(value: object) -> object:
    if value not in OUTCOMES:
        raise StateError(f"the call log holds an unknown outcome {value!r}")
    return value


def _fields(value: Mapping[object, object]) -> Mapping[str, str]:
    return MappingProxyType({str(k): str(v) for k, v in value.items()})


def _json_fields(text: str) -> Mapping[str, str]:
    return _fields(json.loads(text))


Reader = tuple[Callable[[Any], object], bool]
"""How a stored value becomes a field's: the conversion, and whether None is kept as None."""

# Builtins where they do the conversion: this runs for every entry a page or export reads.
_READ: Mapping[LogKind, Callable[[Any], object]] = {
    "time": float,
    "text": str,
    "outcome": _outcome,
    "int": int,
    "money": float,
    "flag": bool,
    "ms": float,
    "fields": _fields,
}
_NAMES = tuple(spec.name for spec in LOG_FIELDS)
_FIELDS_AT = next(i for i, spec in enumerate(LOG_FIELDS) if spec.kind == "fields")
_PLAIN_READERS: tuple[Reader, ...] = tuple((_READ[spec.kind], spec.optional) for spec in LOG_FIELDS)
_SQL_READERS: tuple[Reader, ...] = tuple(
    (_json_fields if spec.kind == "fields" else _READ[spec.kind], spec.optional)
    for spec in LOG_FIELDS
)
_attributes = operator.attrgetter(*_NAMES)
_items = operator.itemgetter(*_NAMES)
_new_entry: Callable[..., CallLogEntry] = CallLogEntry


def _read(
    values: Iterable[object], readers: Iterable[tuple[Callable[[Any], object], bool]]
) -> CallLogEntry:
    """The entry of its values in `LOG_FIELDS` order, each read by its field's reader."""
    return _new_entry(
        *[
            None if optional and value is None else read(value)
            for (read, optional), value in zip(readers, values, strict=True)
        ]
    )


def plain(entry: CallLogEntry) -> dict[str, object]:
    """The entry as JSON-able values named as its fields (`fields` a plain dict)."""
    values = dict(zip(_NAMES, _attributes(entry), strict=True))
    values["fields"] = dict(entry.fields)
    return values


def from_plain(values: Mapping[str, object]) -> CallLogEntry:
    """The entry `plain` made (StateError for an unknown outcome)."""
    return _read(_items(values), _PLAIN_READERS)


def sql_row(entry: CallLogEntry) -> tuple[object, ...]:
    """The entry's call_log row, in `LOG_COLUMNS` order (`fields` as sorted JSON text)."""
    row = list(_attributes(entry))
    row[_FIELDS_AT] = json.dumps(dict(entry.fields), sort_keys=True)
    return tuple(row)


def from_sql_row(row: Sequence[object]) -> CallLogEntry:
    """The entry of a call_log row in `LOG_COLUMNS` order (StateError for an unknown outcome)."""
    return _read(row, _SQL_READERS)
