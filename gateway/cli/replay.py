"""`loopwarden replay`: detect the inputs, replay them, print (and write) the report.

Exit 0 with the report; 2 for an input that cannot be replayed (`replay error: FILE:
record: why` on stderr; what was replayed before it is not reported, the figures would
be partial), for a replay whose every record was skipped (each input named with its
skip counts: an export read as nothing is a format this reader does not know, not a
quiet history), and for a `--report` path that is one of the inputs (or a file inside
an input folder), refused before anything is read; 1 when the HTML report cannot be
written. When some inputs replay and another has every record skipped, that one is
named on stderr (`replay warning:`) and the replay exits 0. Everything written to the
terminal that comes from an export goes through `gateway.observability.visible` (control and escape
sequences shown, not obeyed); `--json` is written in ASCII (`\\u` escapes), the same JSON
with nothing a terminal would act on.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO, TypeVar

from gateway.cli.command import Subcommands, add_parser, config_option, with_config
from gateway.config import Config
from gateway.observability.visible import visible
from gateway.replay import calls, discord, matrix, mattermost, report, slack, telegram
from gateway.replay.detect import FORMATS, Detected, Format, detect
from gateway.replay.engine import BotMarks, CallReplay, ChatReplay, merged, merged_calls
from gateway.replay.inputs import Limits, ReadContext
from gateway.replay.progress import Progress
from gateway.replay.records import ChatMessage, RecordedCall, ReplayInputError, Skipped

_Record = TypeVar("_Record", ChatMessage, RecordedCall)


@dataclass(slots=True)
class _InputTally:
    """One input's records: how many were replayed, how many skipped and why."""

    name: str
    skipped: Skipped = field(default_factory=Skipped)
    replayed: int = 0

    def counted(self, records: Iterator[_Record]) -> Iterator[_Record]:
        """`records`, counting each one handed on."""
        for record in records:
            self.replayed += 1
            yield record

    def all_skipped(self) -> str | None:
        """Why nothing of this input was replayed, when it held records and all were skipped."""
        counts = self.skipped.counts
        total = counts.total()
        if self.replayed or not total:
            return None
        reasons = ", ".join(f"{why} {count:,}" for why, count in sorted(counts.items()))
        return f"{self.name}: every record was skipped ({total:,} records: {reasons})"


def add(subcommands: Subcommands) -> None:
    """The `replay` subcommand."""
    parser = add_parser(
        subcommands,
        "replay",
        help="replay recorded chat exports or LLM calls: what would the guards have stopped?",
        description="Run a recorded history (DiscordChatExporter JSON, a Slack export folder "
        "or zip, a Telegram Desktop result.json, an Element (Matrix) JSON export, a "
        "Mattermost bulk export JSONL, the proxy's calls CSV export or a JSONL of "
        "chat-completion bodies) through the config's policies offline, and report what "
        "would have been refused.",
    )
    config_option(parser)
    parser.add_argument("inputs", nargs="+", metavar="INPUT", help="an export file or folder")
    parser.add_argument(
        "--format", choices=FORMATS, default="auto", help="the inputs' format (auto: detected)"
    )
    parser.add_argument(
        "--bot",
        action="append",
        default=[],
        metavar="ID_OR_NAME",
        help="treat this sender as a bot (a display name, a platform id or Telegram from_id)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--report", metavar="FILE.html", help="write a self-contained HTML page")
    parser.set_defaults(handler=with_config(_replay))


def _replay(args: argparse.Namespace, config: Config) -> int:
    return run(
        config,
        args.inputs,
        wanted=args.format,
        bots=args.bot,
        as_json=args.json,
        report_path=args.report,
    )


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
    chat = ChatReplay(config, BotMarks(bots))
    llm = CallReplay(config)
    progress: Progress | None = None
    tallies: list[_InputTally] = []
    try:
        if report_path is not None:
            _refuse_overwriting_an_input(report_path, inputs)
        found = [detect(Path(name), wanted) for name in inputs]
        if not as_json and err.isatty():
            progress = Progress(sum(item.size for item in found), err)
        advance = progress.advance if progress else _no_progress
        tallies = [_InputTally(item.name) for item in found]
        messages, recorded = _streams(found, tallies, limits or Limits(), advance)
        if messages:
            for message in merged(messages):
                chat.feed(message)
        if recorded:
            for call in merged_calls(recorded):
                llm.feed(call)
    except ReplayInputError as exc:
        if progress is not None:
            progress.finish()
        print(f"replay error: {visible(str(exc))}", file=err)
        return 2
    if progress is not None:
        progress.finish()
    empty = [why for tally in tallies if (why := tally.all_skipped()) is not None]
    if empty and not any(tally.replayed for tally in tallies):
        for why in empty:
            print(f"replay error: {visible(why)}; nothing to replay", file=err)
        return 2
    for why in empty:
        print(f"replay warning: {visible(why)}", file=err)
    skipped = sum((tally.skipped.counts for tally in tallies), Counter[str]())
    figures = report.summary(chat, llm, skipped)
    if report_path is not None:
        try:
            Path(report_path).write_text(report.html(figures, chat), encoding="utf-8")
        except OSError as exc:
            print(f"replay error: cannot write {visible(report_path)}: {exc.strerror}", file=err)
            return 1
    if as_json:
        json.dump(figures, out)
        out.write("\n")
    else:
        out.write(report.text(chat, llm, skipped))
    return 0


def _refuse_overwriting_an_input(report_path: str, inputs: Sequence[str]) -> None:
    """ReplayInputError when the report would overwrite an input or a file of an input folder.

    Compared as files (`os.path.samefile`: after symlinks, relative paths and hard
    links), and for a folder input by where the report resolves to.
    """
    target = Path(report_path)
    if not target.exists():
        return
    resolved = target.resolve()
    for name in inputs:
        given = Path(name)
        if not given.exists():
            continue
        if os.path.samefile(target, given) or (
            given.is_dir() and resolved.is_relative_to(given.resolve())
        ):
            raise ReplayInputError(
                f"--report {report_path}",
                "",
                f"is the input {name} (or inside it): refused, it would be overwritten",
            )


def _no_progress(count: int) -> None:
    """No progress bar."""


def _streams(
    found: Sequence[Detected],
    tallies: Sequence[_InputTally],
    limits: Limits,
    advance: Callable[[int], None],
) -> tuple[list[Iterator[ChatMessage]], list[Iterator[RecordedCall]]]:
    """Each input's records (counted in its tally), chat messages and LLM calls apart."""
    messages: list[Iterator[ChatMessage]] = []
    recorded: list[Iterator[RecordedCall]] = []
    for item, tally in zip(found, tallies, strict=True):
        context = ReadContext(limits, tally.skipped, advance)
        if item.kind == "slack" and item.files is not None:
            messages.append(tally.counted(slack.read(item.files, context)))
        elif item.source is None:
            continue
        elif item.kind == "discord":
            messages.append(tally.counted(discord.read(item.source, context)))
        elif item.kind == "telegram":
            messages.append(tally.counted(telegram.read(item.source, context)))
        elif item.kind == "matrix":
            messages.append(tally.counted(matrix.read(item.source, context)))
        elif item.kind == "mattermost":
            messages.append(tally.counted(mattermost.read(item.source, context)))
        elif item.kind == "csv":
            recorded.append(tally.counted(calls.read_csv(item.source, context)))
        else:
            recorded.append(tally.counted(calls.read_jsonl(item.source, context)))
    return messages, recorded
