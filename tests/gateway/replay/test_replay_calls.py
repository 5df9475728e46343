"""Replaying LLM calls: the proxy's CSV export and a JSONL of chat-completion bodies."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pytest

from gateway.calls.entry import CallLogEntry, CallOutcome
from gateway.calls.export import write_csv
from tests.gateway.replay.replay_fixtures import START, replay_json, write_config

CONFIG = """
proxy:
  call_loop: {max_repeats: 2, window_seconds: 60, pause_seconds: 120}
  rules: [{name: one-step, fields: [session, step], max_calls: 1, window_seconds: 1h}]
  prices: {"gpt-4o-mini*": {input_per_1k: 0.001, output_per_1k: 0.002}}
  default_output_tokens: 500
"""


def entry(
    offset: float,
    session: str,
    fingerprint: str,
    outcome: CallOutcome = "forwarded",
    *,
    status: int | None = 200,
    tokens: tuple[int, int] | None = (1000, 200),
    step: str | None = None,
) -> CallLogEntry:
    fields = {"session": session, "agent": "billing", "model": "gpt-4o-mini"}
    if step:
        fields["step"] = step
    return CallLogEntry(
        at=START + offset,
        provider="openai",
        agent="billing",
        session=session,
        circuit=f"billing/session={session}" + (f"/step={step}" if step else ""),
        model="gpt-4o-mini",
        outcome=outcome,
        status=status,
        input_tokens=None if tokens is None else tokens[0],
        output_tokens=None if tokens is None else tokens[1],
        cost=0.0014,
        fingerprint=fingerprint,
        fields=fields,
    )


def export(path: Path, entries: list[CallLogEntry]) -> Path:
    """The CSV `loopwarden calls export --csv` writes (its own writer)."""
    out = io.StringIO()
    write_csv(entries, out)
    path.write_text(out.getvalue(), encoding="utf-8")
    return path


def test_issue13_calls_csv_golden_figures_with_live_refusals(tmp_path: Path) -> None:
    rows = [
        entry(0, "s1", "fpA"),
        entry(1, "s1", "fpA"),
        entry(2, "s1", "fpA"),  # third identical call: loop_detected, pauses s1
        entry(3, "s1", "fpA"),  # loop_paused
        entry(4, "s1", "fpA", "loop_paused", status=429),  # refused live: counts as it was
        entry(5, "s2", "fpB", "loop_detected", status=429),  # live said so; counts so
        entry(6, "s2", "fpB", "upstream_error", status=503, tokens=None),  # not counted
        entry(7, "s2", "fpB"),
        entry(8, "s2", "fpB"),  # third counted identical call: loop_detected
        entry(10, "s3", "fpX", step="p1"),
        entry(11, "s3", "fpY", step="p1", tokens=None),  # one-step: duplicate_call
    ]
    config = write_config(tmp_path, CONFIG)
    figures = replay_json(config, export(tmp_path / "calls.csv", rows))
    sessions = {s["session"]: s for s in figures["calls"]["agents"][0]["sessions"]}
    assert figures["calls"]["agents"][0]["agent"] == "billing"
    assert sessions == {
        "s1": {
            "session": "s1",
            "calls": 5,
            "loop_detected": 1,
            "loop_paused": 2,
            "duplicate_call": 0,
            "cost_saved_usd": 0.0042,
        },
        "s2": {
            "session": "s2",
            "calls": 4,
            "loop_detected": 2,
            "loop_paused": 0,
            "duplicate_call": 0,
            "cost_saved_usd": 0.0028,
        },
        # No tokens logged: estimated as the proxy does, with the average output (200) of
        # the calls forwarded so far and no request body to count input tokens from.
        "s3": {
            "session": "s3",
            "calls": 2,
            "loop_detected": 0,
            "loop_paused": 0,
            "duplicate_call": 1,
            "cost_saved_usd": 0.0004,
        },
    }
    assert figures["rooms"] == []


def body(text: str, **metadata: str) -> dict[str, object]:
    return {
        "model": "gpt-4o-mini",
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": text}],
        "metadata": metadata,
    }


def test_issue13_calls_jsonl_bodies_with_metadata_and_batch_lines(tmp_path: Path) -> None:
    metadata = {"X-Loopwarden-Session": "run-1", "X-Loopwarden-Agent": "math-bot"}
    lines = []
    for index in range(3):
        # A fresh request id each time: the fingerprint ignores it, the repeat is seen.
        asked = body(f"what is 2+2? (request {index:08d}-8d2b-4a51-9e77-1b2c3d4e5f60)", **metadata)
        lines.append(json.dumps(dict(asked, timestamp=START + index)))
    batch = {
        "custom_id": "req-9",
        "method": "POST",
        "url": "/v1/chat/completions",
        "timestamp": "2024-01-01T12:00:03Z",
        "body": body("hello", **{"x-loopwarden-session": "run-2"}),
    }
    lines += ["", json.dumps(batch), json.dumps({"timestamp": START, "input": "not a chat"})]
    path = tmp_path / "requests.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    figures = replay_json(write_config(tmp_path, CONFIG), path)
    agents = {a["agent"]: a["sessions"] for a in figures["calls"]["agents"]}
    [math_run] = agents["math-bot"]
    expected_input = math.ceil(len(lines[2].encode()) / 4)
    assert math_run["loop_detected"] == 1
    assert math_run["cost_saved_usd"] == pytest.approx(
        round((expected_input * 0.001 + 500 * 0.002) / 1000, 6)
    )
    # Without X-Loopwarden-Agent the agent is named after the file.
    assert agents["requests"] == [
        {
            "session": "run-2",
            "calls": 1,
            "loop_detected": 0,
            "loop_paused": 0,
            "duplicate_call": 0,
            "cost_saved_usd": 0.0,
        }
    ]
    assert figures["skipped"] == {"not_a_call": 1}
