"""Recorded LLM calls: the proxy's `calls export --csv`, or a JSONL of request bodies.

The CSV has the columns of `gateway.calls.export.CSV_COLUMNS`; each row is a call with
its circuit, fingerprint, rule fields, live outcome, status and tokens. A JSONL line is
an OpenAI chat-completion request body (or a batch line `{"custom_id", "body": {...}}`),
read as the proxy reads one (`OpenAIProvider.describe`, `build_call`): the circuit and
rule fields come from the `X-Loopwarden-*` entries of its `metadata`, as they would
from the headers.

Decisions where DESIGN.md is silent:
- A JSONL line's time is its `timestamp` (ISO 8601 or seconds), at the top, in the body
  or in `metadata`; without an `X-Loopwarden-Agent` the agent is named after the file.
- A line that is not a chat completion (no model or messages) is skipped as
  `not_a_call`, a CSV row without a fingerprint as `no_fingerprint`, one with an
  outcome the proxy never writes as `unknown_outcome`. A token count or status that is
  not a plain whole number of at most 12 digits is bad input (exit 2).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator, Mapping
from pathlib import Path

from multidict import CIMultiDict

from gateway.app.jsonbody import JsonBodyError, parse_json
from gateway.calls.entry import OUTCOMES
from gateway.calls.export import CSV_COLUMNS, FIELD_COLUMNS
from gateway.proxy.auth import ProxyClient
from gateway.proxy.calls import CallFieldError, build_call
from gateway.proxy.openai import OpenAIProvider
from gateway.proxy.provider import OWN_HEADER_PREFIX
from gateway.replay.inputs import ReadContext, Source, numbered_lines
from gateway.replay.records import RecordedCall, ReplayInputError, parse_time, quoted
from guards.call_loop import circuit_key

REQUIRED_COLUMNS = ("time", "agent", "session", "model", "outcome", "fingerprint")
_MAX_DIGITS = 12
_PROVIDER = OpenAIProvider()


def looks_like_csv(head: bytes) -> bool:
    """Whether a file starts with the calls export's header row."""
    first = head.split(b"\n", 1)[0].strip().decode("utf-8", "replace")
    return first.split(",")[: len(CSV_COLUMNS)] == list(CSV_COLUMNS)


def looks_like_jsonl(head: bytes) -> bool:
    """Whether a file's first line is a JSON object naming a model and messages.

    Only a look: the line is parsed (and refused, naming it) when it is replayed.
    """
    line = head.split(b"\n", 1)[0].strip()
    return line.startswith(b"{") and b'"model"' in line and b'"messages"' in line


def read_csv(source: Source, context: ReadContext) -> Iterator[RecordedCall]:
    """The calls of a request-log export, in its order (oldest first)."""
    with source.open(context.limits, json=False, progress=context.progress) as raw:
        rows = csv.reader(_text_lines(io.BufferedReader(raw), source.name))
        try:
            header = next(rows, None)
            if header is None or any(column not in header for column in REQUIRED_COLUMNS):
                raise ReplayInputError(source.name, "line 1", "is not a calls export header")
            columns = {name: header.index(name) for name in header}
            for row in rows:
                call = _row(row, columns, source.name, rows.line_num, context)
                if call is not None:
                    yield call
        except csv.Error as exc:
            raise ReplayInputError(source.name, f"line {rows.line_num}", str(exc)) from None


def _text_lines(lines: io.BufferedReader, file: str) -> Iterator[str]:
    """The lines of a UTF-8 text file (ReplayInputError naming the first that is not)."""
    for number, line in numbered_lines(lines, file):
        try:
            yield line.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ReplayInputError(
                file, f"line {number}", f"is not UTF-8 (byte {exc.start})"
            ) from None


def _row(
    row: list[str], columns: Mapping[str, int], file: str, line: int, context: ReadContext
) -> RecordedCall | None:
    """One CSV row as a recorded call; None when skipped."""
    if not row:
        return None
    if len(row) < len(columns):
        raise ReplayInputError(
            file, f"line {line}", f"has {len(row)} cells, the header {len(columns)}"
        )

    def cell(name: str) -> str:
        index = columns.get(name)
        return row[index] if index is not None else ""

    where = f"line {line}"
    try:
        at = parse_time(cell("time") or None, "time")
        status = _number(cell("status"), "status")
        input_tokens = _number(cell("input_tokens"), "input_tokens")
        output_tokens = _number(cell("output_tokens"), "output_tokens")
    except ValueError as exc:
        raise ReplayInputError(file, where, str(exc)) from None
    outcome = cell("outcome")
    if outcome not in OUTCOMES:
        context.skipped.add("unknown_outcome")
        return None
    fingerprint = cell("fingerprint")
    if not fingerprint:
        context.skipped.add("no_fingerprint")
        return None
    agent, session, model = cell("agent"), cell("session"), cell("model")
    fields = {name: cell(name) for name in FIELD_COLUMNS if cell(name)}
    fields["agent"], fields["model"] = agent, model
    if session:
        fields["session"] = session
    return RecordedCall(
        at=at,
        agent=agent,
        session=session,
        circuit=cell("circuit") or circuit_key(agent or "-", session or None, fields.get("step")),
        fingerprint=fingerprint,
        model=model,
        fields=fields,
        outcome=outcome,
        status=status,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
    )


def _number(text: str, name: str) -> int | None:
    """An empty cell (None) or a plain whole number of at most 12 digits."""
    if not text:
        return None
    if not (len(text) <= _MAX_DIGITS and text.isascii() and text.isdigit()):
        raise ValueError(f"{name} must be a whole number, got {quoted(text)}")
    return int(text)


def read_jsonl(source: Source, context: ReadContext) -> Iterator[RecordedCall]:
    """The calls of a file of request bodies, one per line, in its order."""
    agent = Path(source.name).stem or "jsonl"
    with source.open(context.limits, json=False, progress=context.progress) as raw:
        for number, line in numbered_lines(io.BufferedReader(raw), source.name):
            if line.strip():
                call = _line(line.rstrip(b"\r\n"), agent, source.name, number, context)
                if call is not None:
                    yield call


def _line(
    line: bytes, default_agent: str, file: str, number: int, context: ReadContext
) -> RecordedCall | None:
    """One JSONL line as a recorded call; None when skipped."""
    where = f"line {number}"
    try:
        data = parse_json(line)
    except JsonBodyError as exc:
        raise ReplayInputError(file, where, str(exc)) from None
    if not isinstance(data, Mapping):
        raise ReplayInputError(file, where, "is not a JSON object")
    body: Mapping[str, object] = data
    raw = line
    if isinstance(data.get("body"), Mapping):
        body = data["body"]
        raw = json.dumps(body).encode()
    metadata = body.get("metadata") or data.get("metadata")
    metadata = metadata if isinstance(metadata, Mapping) else {}
    stamp = next(
        (
            found
            for found in (data.get("timestamp"), body.get("timestamp"), metadata.get("timestamp"))
            if found is not None
        ),
        None,
    )
    try:
        at = parse_time(stamp, "timestamp")
    except ValueError as exc:
        raise ReplayInputError(file, where, str(exc)) from None
    try:
        described = _PROVIDER.describe("POST", "chat/completions", raw)
    except JsonBodyError as exc:
        raise ReplayInputError(file, where, str(exc)) from None
    if described is None:
        context.skipped.add("not_a_call")
        return None
    headers: CIMultiDict[str] = CIMultiDict(
        (str(key), value)
        for key, value in metadata.items()
        if str(key).lower().startswith(OWN_HEADER_PREFIX) and isinstance(value, str)
    )
    agent = headers.get("X-Loopwarden-Agent") or default_agent
    try:
        call = build_call(
            _PROVIDER,
            ProxyClient(agent=agent, root=agent),
            headers,
            described,
            size=len(raw),
            started=0.0,
        )
    except CallFieldError as exc:
        raise ReplayInputError(file, where, str(exc)) from None
    return RecordedCall(
        at=at,
        agent=agent,
        session=call.session,
        circuit=call.circuit,
        fingerprint=call.fingerprint,
        model=described.model,
        fields=call.fields,
        request_bytes=len(raw),
    )
