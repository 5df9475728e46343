"""`loopwarden replay`: detect the inputs, replay them, print (and write) the report.

Exit 0 with the report; 2 for an input that cannot be replayed (`replay error: FILE:
record: why` on stderr; what was replayed before it is not reported, the figures would
be partial); 1 when the HTML report cannot be written.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TextIO

from gateway.config import Config
from gateway.replay import calls, discord, report, slack, telegram
from gateway.replay.detect import Detected, Format, detect
from gateway.replay.engine import BotMarks, CallReplay, ChatReplay, merged, merged_calls
from gateway.replay.inputs import Limits, ReadContext
from gateway.replay.progress import Progress
from gateway.replay.records import ChatMessage, RecordedCall, ReplayInputError, Skipped


def run(
    config: Config,
    inputs: Sequence[str],
    *,
    wanted: Format = "auto",
    bots: Sequence[str] = (),
    as_json: bool = False,
    report_path: str | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
    limits: Limits | None = None,
) -> int:
    """Replay `inputs` under `config`; the exit code (`out`, `err`: default stdout, stderr)."""
    out = out or sys.stdout
    err = err or sys.stderr
    skipped = Skipped()
    chat = ChatReplay(config, BotMarks(bots))
    llm = CallReplay(config)
    progress: Progress | None = None
    try:
        found = [detect(Path(name), wanted) for name in inputs]
        if not as_json and err.isatty():
            progress = Progress(sum(item.size for item in found), err)
        context = ReadContext(
            limits or Limits(), skipped, progress.advance if progress else _no_progress
        )
        messages, recorded = _streams(found, context)
        if messages:
            for message in merged(messages):
                chat.feed(message)
        if recorded:
            for call in merged_calls(recorded):
                llm.feed(call)
    except ReplayInputError as exc:
        if progress is not None:
            progress.finish()
        print(f"replay error: {exc}", file=err)
        return 2
    if progress is not None:
        progress.finish()
    figures = report.summary(chat, llm, skipped.counts)
    if report_path is not None:
        try:
            Path(report_path).write_text(report.html(figures, chat), encoding="utf-8")
        except OSError as exc:
            print(f"replay error: cannot write {report_path}: {exc.strerror}", file=err)
            return 1
    if as_json:
        json.dump(figures, out, ensure_ascii=False)
        out.write("\n")
    else:
        out.write(report.text(chat, llm, skipped.counts))
    return 0


def _no_progress(count: int) -> None:
    """No progress bar."""


def _streams(
    found: Sequence[Detected], context: ReadContext
) -> tuple[list[Iterator[ChatMessage]], list[Iterator[RecordedCall]]]:
    """Each input's records, chat messages and LLM calls apart."""
    messages: list[Iterator[ChatMessage]] = []
    recorded: list[Iterator[RecordedCall]] = []
    for item in found:
        if item.kind == "slack" and item.files is not None:
            messages.append(slack.read(item.files, context))
        elif item.source is None:
            continue
        elif item.kind == "discord":
            messages.append(discord.read(item.source, context))
        elif item.kind == "telegram":
            messages.append(telegram.read(item.source, context))
        elif item.kind == "csv":
            recorded.append(calls.read_csv(item.source, context))
        else:
            recorded.append(calls.read_jsonl(item.source, context))
    return messages, recorded
