"""Which format an input is: from `--format`, else from its content.

A folder or zip holding `channels.json` or `users.json` is a Slack export; one holding
`result.json` (or that file itself) a Telegram Desktop export. A file is read from its
first 64 KiB: a JSON object whose first keys are `guild` and `channel` is a
DiscordChatExporter export, one with `chats` or `personal_information` (or a single
chat's `name`, `type`, `id`, `messages`) is Telegram's, one with `room_name` and
`room_creator` or `exported_by` Element's (Matrix); a first line that is a bulk
export's version line (`{"type": "version", ...}`) is a Mattermost export (so is a
folder or zip holding exactly one `.jsonl` file that starts so), a first line that is
the calls export's CSV header is a request log, and a first line that is a
chat-completion body (or a batch line holding one) a JSONL of request bodies.
`--format calls` takes either of the last two, told apart the same way. Anything else is
an unknown format (exit 2).
"""

from __future__ import annotations

import io
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import ijson

from gateway.replay import calls, discord, matrix, mattermost, slack, telegram
from gateway.replay.inputs import CheckedStream, Source, export_tree, stream_events
from gateway.replay.records import ReplayInputError

Format = Literal["auto", "discord", "slack", "telegram", "matrix", "mattermost", "calls"]
FORMATS: tuple[Format, ...] = (
    "auto",
    "discord",
    "slack",
    "telegram",
    "matrix",
    "mattermost",
    "calls",
)
Kind = Literal["discord", "slack", "telegram", "matrix", "mattermost", "csv", "jsonl"]
_LOOK_CHUNK = 64
UNKNOWN = (
    "unknown format: not a DiscordChatExporter JSON, a Slack export (folder or zip), a "
    "Telegram Desktop result.json, an Element (Matrix) JSON export, a Mattermost bulk "
    "export, a calls CSV export nor a JSONL of request bodies (--format says which it is)"
)


@dataclass(frozen=True, slots=True)
class Detected:
    """An input and its format: one file (`source`) or an export's files (`files`)."""

    kind: Kind
    name: str
    source: Source | None = None
    files: Mapping[str, Source] | None = None

    @property
    def size(self) -> int:
        """The bytes the input holds on disk, for the progress bar."""
        if self.files is not None:
            return sum(source.size for source in self.files.values())
        return self.source.size if self.source is not None else 0


def detect(path: Path, wanted: Format = "auto") -> Detected:
    """The format of one input (ReplayInputError when it is unreadable or unknown)."""
    name = str(path)
    if not path.exists():
        raise ReplayInputError(name, "", "no such file or folder")
    if path.is_dir() or zipfile.is_zipfile(path):
        return _tree(path, name, wanted)
    source = Source(name, path, size=path.stat().st_size)
    head = source.head()
    if wanted in ("discord", "telegram", "matrix", "mattermost"):
        return Detected(wanted, name, source)
    if wanted == "slack":
        raise ReplayInputError(name, "", "a Slack export is a folder or a zip")
    if wanted == "auto" and mattermost.looks_like(head):
        return Detected("mattermost", name, source)
    if calls.looks_like_csv(head):
        return Detected("csv", name, source)
    if calls.looks_like_jsonl(head) or wanted == "calls":
        return Detected("jsonl", name, source)
    keys = top_keys(head)
    if discord.looks_like(keys):
        return Detected("discord", name, source)
    if telegram.looks_like(keys):
        return Detected("telegram", name, source)
    if matrix.looks_like(keys):
        return Detected("matrix", name, source)
    raise ReplayInputError(name, "", UNKNOWN)


def _tree(path: Path, name: str, wanted: Format) -> Detected:
    """A folder's or a zip's format."""
    files = export_tree(path)
    if wanted in ("auto", "slack") and slack.looks_like(files):
        return Detected("slack", name, files=files)
    if wanted in ("auto", "telegram"):
        results = [found for key, found in files.items() if key.rsplit("/", 1)[-1] == "result.json"]
        if len(results) == 1:
            return Detected("telegram", name, results[0])
    if wanted in ("auto", "mattermost"):
        lines = [found for key, found in files.items() if key.endswith(".jsonl")]
        if len(lines) == 1 and (wanted == "mattermost" or mattermost.looks_like(lines[0].head())):
            return Detected("mattermost", name, lines[0])
    raise ReplayInputError(name, "", UNKNOWN)


def top_keys(head: bytes) -> dict[str, None]:
    """The top-level keys that the first bytes of a JSON object show, in order.

    Read in small chunks, depth-checked: nesting too deep for the parser ends the look
    within 64 bytes of where it starts (the replay then refuses the file for it).
    """
    keys: dict[str, None] = {}
    stream = CheckedStream(io.BytesIO(head), name="", limit=len(head), progress=_ignore, json=True)
    try:
        for prefix, event, value in stream_events(stream, chunk=_LOOK_CHUNK):
            if prefix == "" and event == "map_key":
                keys[str(value)] = None
    except (ijson.JSONError, ReplayInputError):  # the head ends mid-document, or nests too deep
        pass
    return keys


def _ignore(count: int) -> None:
    """No progress to report while looking."""
