"""Reading exports safely: bounded bytes, bounded nesting, streamed JSON, checked zips.

Every byte a reader takes goes through `Source.open`, a `CheckedStream`: it counts what
is read against `Limits.max_bytes` (a zip member's declared size is not trusted, the
bytes actually inflated are counted, so a zip bomb stops at the bound), reports progress,
and checks nesting as the bytes pass, so a document nested deeper than `MAX_DEPTH` is
refused before the streaming parser sees it (ijson keeps a prefix per level, and its
memory grows with the square of the depth), and measures the token still open at the end
of what it has read, so that the next read takes at least as many bytes again: yajl (the
C parser under ijson) lexes a token cut by a read boundary again from its start at each
read, so fixed 64 KiB reads cost the square of a token's size (a 48 MB message took 7 CPU
seconds, a 300 MB one minutes); reads that double with the open token keep it linear.
Large documents are streamed with ijson's C backend (`yajl2_c`, when installed) with
`use_float=True`, under which an integer beyond 64 bits, a float that overflows, NaN and
Infinity are parse errors instead of values (or, for a 5,000-digit integer under Decimal
parsing, a crash of the C backend). Small documents (a Slack day file, one JSONL line) go
through `gateway.app.jsonbody`.

A zip's members are listed before anything is read: an absolute name, a `..` part, a
drive letter or a symlink is refused, naming the member. A folder's files must resolve
inside it (no symlink out).
"""

from __future__ import annotations

import io
import stat
import zipfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import accumulate, repeat
from operator import sub
from pathlib import Path, PurePosixPath
from typing import IO, Protocol

import ijson

from gateway.app.errors import LoopwardenError
from gateway.app.jsonbody import MAX_DEPTH, JsonBodyError, parse_json
from gateway.replay.records import ReplayInputError, Skipped

CHUNK = 64 * 1024
MAX_LINE_BYTES = 16 * 1024**2
# The nesting check sees only brackets outside strings: every other byte is deleted.
_NOT_SYNTAX = bytes(byte for byte in range(256) if byte not in b'"[]{}')
_AS_STEPS = bytes.maketrans(b"[{]}", b"\x02\x02\x00\x00")
# Outside a string a token (a number, true, false, null) runs until one of these.
_DELIMITERS = b'",:[]{} \t\r\n'
_IN_TOKEN = bytes(byte for byte in range(256) if byte not in _DELIMITERS)


class Readable(Protocol):
    """What the streaming parser reads from: a binary `read`."""

    def read(self, size: int = -1, /) -> bytes:
        """Up to `size` bytes; b"" at the end."""
        ...


@dataclass(frozen=True, slots=True)
class Limits:
    """How much one input may make the replay read: bytes per file, small-document size."""

    max_bytes: int = 8 * 1024**3
    max_document_bytes: int = 256 * 1024**2


class DepthError(LoopwardenError, ValueError):
    """The bytes nest deeper than MAX_DEPTH."""


class DepthCheck:
    """Follows the nesting of a JSON byte stream chunk by chunk, at C speed.

    Escapes are masked first (a `\\\\` pair, then `\\"`, each by two bytes that are
    neither quote nor bracket), then everything but quotes and brackets is dropped; the
    text between quotes is a string and is dropped too, leaving brackets only, each an
    opening (2) or a closing (0) one, whose running sum minus one per bracket is the
    depth. State carries across chunks: whether a string is open, whether a trailing
    backslash escapes the next byte, the depth, and `open_bytes`: how many of the bytes fed
    so far belong to the token still open at the end (a string since its opening quote,
    or a number or literal), which the next read must at least match.
    """

    __slots__ = ("_backslashes", "_depth", "_in_string", "open_bytes")

    def __init__(self) -> None:
        self._in_string = False
        self._backslashes = b""
        self._depth = 0
        self.open_bytes = 0

    def feed(self, chunk: bytes) -> None:
        """Check one more chunk; DepthError when the nesting passes MAX_DEPTH."""
        text = self._backslashes + chunk if self._backslashes else chunk
        kept = text.rstrip(b"\\")
        # Only an odd trailing backslash escapes what comes next; pairs are spent.
        self._backslashes = b"\\" if (len(text) - len(kept)) % 2 else b""
        # Escapes masked at their place (same length), so that quotes keep their offsets.
        masked = kept.replace(b"\\\\", b"__").replace(b'\\"', b"__") if b"\\" in kept else kept
        parts = masked.translate(None, _NOT_SYNTAX).split(b'"')
        outside = parts[1::2] if self._in_string else parts[0::2]
        if len(parts) % 2 == 0:
            self._in_string = not self._in_string
        self._measure_open(masked, len(text), len(chunk), quoted=len(parts) > 1)
        steps = b"".join(outside).translate(_AS_STEPS)
        if not steps:
            return
        depth = self._depth
        if depth + len(steps) > MAX_DEPTH and (
            max(accumulate(map(sub, steps, repeat(1)), initial=depth)) > MAX_DEPTH
        ):
            raise DepthError(f"JSON is nested deeper than {MAX_DEPTH} levels")
        # Below 0 the document is broken; the parser says so, the check just goes on.
        self._depth = max(0, depth + sum(steps) - len(steps))

    def _measure_open(self, masked: bytes, size: int, added: int, *, quoted: bool) -> None:
        """`open_bytes` after `added` bytes more.

        `masked` is the `size` bytes just checked (a backslash carried over, then the
        new bytes) with their escapes masked and any trailing backslash cut off.
        """
        if self._in_string:
            last_quote = masked.rfind(b'"') if quoted else -1
            self.open_bytes = size - last_quote if last_quote >= 0 else self.open_bytes + added
            return
        run = len(masked) - len(masked.rstrip(_IN_TOKEN))
        self.open_bytes = self.open_bytes + added if run == len(masked) else run


class CheckedStream(io.RawIOBase):
    """A binary stream that counts, bounds and (for JSON) depth-checks what is read."""

    def __init__(
        self,
        raw: IO[bytes],
        *,
        name: str,
        limit: int,
        progress: Callable[[int], None],
        json: bool,
        archive: zipfile.ZipFile | None = None,
    ) -> None:
        super().__init__()
        self._raw = raw
        self._archive = archive
        self.name_shown = name
        self._left = limit
        self._limit = limit
        self._progress = progress
        self._depth = DepthCheck() if json else None

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        """Up to `size` bytes (CHUNK when unbounded), checked; more while a JSON token is open.

        A JSON stream hands over at least as many bytes as the token open at the end of
        what it has read holds so far (the module's docstring says why).
        """
        want = CHUNK if size is None or size < 0 else size
        if want and self._depth is not None:
            want = max(want, self._depth.open_bytes)
        return self._checked(want)

    def _checked(self, want: int) -> bytes:
        """Up to `want` bytes of the raw stream, counted, bounded and depth-checked."""
        try:
            chunk = self._raw.read(min(want, self._left + 1))
        except (OSError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
            raise ReplayInputError(
                self.name_shown, "", f"cannot be read ({_reason(exc)})"
            ) from None
        self._left -= len(chunk)
        if self._left < 0:
            raise ReplayInputError(
                self.name_shown, "", f"more than {self._limit:,} bytes to read; refused"
            )
        if self._depth is not None and chunk:
            try:
                self._depth.feed(chunk)
            except DepthError as exc:
                raise ReplayInputError(self.name_shown, "", str(exc)) from None
        self._progress(len(chunk))
        return chunk

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        data = self._checked(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self._raw.close()
        if self._archive is not None:
            self._archive.close()
        super().close()


def _ignore_progress(count: int) -> None:
    """No progress bar."""


@dataclass(frozen=True, slots=True)
class Source:
    """One file to read: on disk, or a member of a zip; `name` is how errors call it."""

    name: str
    path: Path
    member: str | None = None
    size: int = 0

    def open(
        self,
        limits: Limits,
        *,
        json: bool = True,
        progress: Callable[[int], None] = _ignore_progress,
    ) -> CheckedStream:
        """The file's bytes, checked as they are read."""
        archive = None
        try:
            if self.member is None:
                raw: IO[bytes] = self.path.open("rb")
            else:
                archive = zipfile.ZipFile(self.path)
                raw = archive.open(self.member)
        except (OSError, zipfile.BadZipFile, NotImplementedError) as exc:
            if archive is not None:
                archive.close()
            raise ReplayInputError(self.name, "", f"cannot be read ({_reason(exc)})") from None
        return CheckedStream(
            raw,
            name=self.name,
            limit=limits.max_bytes,
            progress=progress,
            json=json,
            archive=archive,
        )

    def head(self, size: int = CHUNK) -> bytes:
        """The first `size` bytes, for format detection."""
        with self.open(Limits(max_bytes=size), json=False) as stream:
            return stream.read(size)

    def read_document(self, limits: Limits, progress: Callable[[int], None]) -> object:
        """A small JSON document, whole (`gateway.app.jsonbody`'s checks)."""
        with self.open(Limits(max_bytes=limits.max_document_bytes), progress=progress) as f:
            body = b"".join(iter(lambda: f.read(CHUNK), b""))
        try:
            return parse_json(body)
        except JsonBodyError as exc:
            raise ReplayInputError(self.name, "", str(exc)) from None


def numbered_lines(lines: io.BufferedReader, file: str) -> Iterator[tuple[int, bytes]]:
    """The numbered lines of a text file (CSV, JSONL), each at most MAX_LINE_BYTES long."""
    number = 0
    while line := lines.readline(MAX_LINE_BYTES + 1):
        number += 1
        if len(line) > MAX_LINE_BYTES:
            raise ReplayInputError(
                file, f"line {number}", f"is longer than {MAX_LINE_BYTES:,} bytes"
            )
        yield number, line


def _reason(exc: BaseException) -> str:
    """An OS or zip error in a few words, without the path (the message names the file)."""
    return getattr(exc, "strerror", None) or str(exc).split(":")[0]


def json_error(source: str, where: str, exc: Exception) -> ReplayInputError:
    """ijson's error as a replay error: its first line, never the excerpt it quotes."""
    # yajl's message may come as bytes (its text and an excerpt, a line each).
    raw = exc.args[0] if len(exc.args) == 1 else str(exc)
    message = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
    first = message.splitlines()[0] if message.strip() else type(exc).__name__
    if isinstance(exc, ijson.IncompleteJSONError) and "premature EOF" in first:
        first = "the file ends early (truncated?)"
    return ReplayInputError(source, where, f"not valid JSON: {first[:120]}")


class _ReadOnly:
    """A stream seen through its `read` alone.

    ijson reads into a fixed buffer of `buf_size` when the stream has `readinto`, and
    takes whatever `read` returns otherwise: hiding `readinto` lets a `CheckedStream`
    hand over more than asked while a long token is open.
    """

    __slots__ = ("read",)

    def __init__(self, stream: Readable) -> None:
        self.read = stream.read


def stream_items(stream: Readable, prefix: str) -> Iterator[object]:
    """The values at `prefix` of a JSON document, one at a time (C backend, floats)."""
    items: Iterator[object] = ijson.items(_ReadOnly(stream), prefix, use_float=True)
    return items


def stream_events(stream: Readable, *, chunk: int = CHUNK) -> Iterator[tuple[str, str, object]]:
    """The (prefix, event, value) events of a JSON document (C backend, floats)."""
    events: Iterator[tuple[str, str, object]] = ijson.parse(
        _ReadOnly(stream), buf_size=chunk, use_float=True
    )
    return events


def zip_members(path: Path, name: str) -> list[zipfile.ZipInfo]:
    """The regular files of a zip, after refusing any member that could escape it."""
    try:
        with zipfile.ZipFile(path) as archive:
            members = archive.infolist()
    except (OSError, zipfile.BadZipFile) as exc:
        raise ReplayInputError(name, "", f"is not a readable zip ({_reason(exc)})") from None
    files = []
    for info in members:
        why = _unsafe_member(info)
        if why is not None:
            raise ReplayInputError(name, f"member {info.filename[:80]!r}", why)
        if not info.is_dir():
            files.append(info)
    return files


def _unsafe_member(info: zipfile.ZipInfo) -> str | None:
    """Why a zip member could land outside its folder, or None when it cannot."""
    raw = info.filename
    name = raw.replace("\\", "/")
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        return "an absolute path in the zip; refused"
    if ".." in PurePosixPath(name).parts:
        return "a path that escapes the zip's folder ('..'); refused"
    if stat.S_ISLNK(info.external_attr >> 16):
        return "a symlink in the zip; refused"
    if "\x00" in raw:
        return "a NUL character in the name; refused"
    return None


def inside(root: Path, path: Path, name: str) -> Path:
    """`path` resolved, when it stays inside `root` (a symlink out is refused)."""
    resolved = path.resolve()
    if not resolved.is_relative_to(root.resolve()):
        raise ReplayInputError(name, "", "points outside the export's folder (symlink?); refused")
    return resolved


@dataclass(frozen=True, slots=True)
class ReadContext:
    """What every reader is given: the limits, the skip counts, the progress callback."""

    limits: Limits
    skipped: Skipped
    progress: Callable[[int], None] = _ignore_progress


STARTS = frozenset({"start_map", "start_array"})
"""The parser events that open an object or an array."""
_ENDS = frozenset({"end_map", "end_array"})


class ItemBuilder:
    """One array item (an object or an array) built from its parser events as they stream.

    `start` at the item's opening event, then `feed` each later event until it answers
    True: the item is whole, and `take` gives it. One item is held at a time, so a
    reader's memory is one message's, however long the file.
    """

    __slots__ = ("_builder", "_depth")

    def __init__(self) -> None:
        self._builder = ijson.ObjectBuilder()
        self._depth = 0

    @property
    def building(self) -> bool:
        """Whether an item is started and not yet whole."""
        return self._depth > 0

    def start(self, event: str, value: object) -> None:
        """Begin an item at its opening event (`start_map` or `start_array`)."""
        self._builder = ijson.ObjectBuilder()
        self._builder.event(event, value)
        self._depth = 1

    def feed(self, event: str, value: object) -> bool:
        """Add one event of the item; True once its closing event has come."""
        self._builder.event(event, value)
        self._depth += (event in STARTS) - (event in _ENDS)
        return self._depth == 0

    def take(self) -> object:
        """The whole item."""
        return self._builder.value


def leading_values(
    source: Source, limits: Limits, keys: frozenset[str], stop: str
) -> dict[str, object]:
    """The top-level values named in `keys` that come before the key `stop` (or the end)."""
    found: dict[str, object] = {}
    builder: ijson.ObjectBuilder | None = None
    current = ""
    with source.open(limits) as stream:
        try:
            for prefix, event, value in stream_events(stream):
                if prefix == "" and event == "map_key":
                    if builder is not None:
                        found[current] = builder.value
                    current = str(value)
                    if current == stop:
                        return found
                    builder = ijson.ObjectBuilder() if current in keys else None
                elif builder is not None and prefix:
                    builder.event(event, value)
        except ijson.JSONError as exc:
            raise json_error(source.name, "", exc) from None
    if builder is not None:
        found[current] = builder.value
    return found


def export_tree(path: Path) -> dict[str, Source]:
    """The files of a folder or a zip by their path inside it ('a/b.json'), checked."""
    shown = str(path)
    if path.is_dir():
        files: dict[str, Source] = {}
        for found in sorted(path.rglob("*")):
            relative = found.relative_to(path).as_posix()
            name = f"{shown}/{relative}"
            if found.is_symlink() or found.is_file():
                resolved = inside(path, found, name)
                if resolved.is_file():
                    files[relative] = Source(name, resolved, size=resolved.stat().st_size)
        return files
    return {
        info.filename: Source(f"{shown}:{info.filename}", path, info.filename, info.compress_size)
        for info in zip_members(path, shown)
    }
