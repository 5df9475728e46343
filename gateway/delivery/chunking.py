"""Split a reply into chunks that fit a platform's message limit, at the most natural cuts.

A cut is preferred at a paragraph break, then a line break, then a sentence end, then
between words; a kind of cut that would leave the chunk under a third of the limit gives
way to a lesser kind further on. A cut inside a code fence is taken only when no cut
outside one fits: the fence is then closed at the end of the chunk and reopened, with
its language, at the start of the next, and those added lines count toward the limit.
Only a word longer than the room left is cut inside. The whitespace at a cut is dropped
(inside a fence the next line keeps its indentation); nothing else is added or removed,
and there are no "(1/3)" markers. A fence whose opening line is too long to repeat
(over a quarter of the limit) is split like plain text.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from dataclasses import dataclass
from enum import IntEnum
from typing import Literal

_FENCE_LINE = re.compile(r"^ {0,3}(`{3,}|~{3,})([^\n]*)$", re.MULTILINE)
_BREAK = re.compile(r"[ \t\r\n]+")
_SENTENCE_END = frozenset(".!?…")
_AFTER_SENTENCE = frozenset("\"')]”’*_")


class _Kind(IntEnum):
    """Kinds of cut, best first."""

    PARAGRAPH = 0
    LINE = 1
    SENTENCE = 2
    WORD = 3


LengthUnit = Literal["chars", "utf16"]
"""What a platform's message limit counts: code points, or UTF-16 code units (Telegram)."""


@dataclass(frozen=True, slots=True)
class _Fence:
    """A fenced code block: where its lines start and end, and how to reopen and close it."""

    start: int  # start of the opening line
    body: int  # first character after the opening line
    close: int  # start of the closing line (end of text when unclosed)
    end: int  # end of the closing line
    opener: str  # the opening line to repeat, e.g. "```python"
    marker: str  # the fence characters that close it, e.g. "```"


@dataclass(frozen=True, slots=True)
class _Cut:
    """Chunk ends at `end` (exclusive); the next chunk starts at `start`."""

    end: int
    start: int
    fence: _Fence | None  # the fence left open at this cut, to close and reopen


def chunk_text(text: str, limit: int, *, units: LengthUnit = "chars") -> list[str]:
    """Split `text` into chunks of at most `limit` characters, in order, none empty.

    With `units="utf16"` the limit counts UTF-16 code units, as Telegram does (an emoji
    outside the Basic Multilingual Plane counts twice): a chunk over the limit is cut
    again with a character limit scaled by its own density, until every chunk fits.
    """
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    if not text or text.isspace():
        return []
    chunks = [text] if len(text) <= limit else _Splitter(text, limit).chunks()
    if units == "utf16":
        return [part for chunk in chunks for part in _fit_utf16(chunk, limit)]
    return chunks


def utf16_length(text: str) -> int:
    """How many UTF-16 code units `text` takes."""
    return len(text.encode("utf-16-le")) // 2


def _fit_utf16(chunk: str, limit: int) -> list[str]:
    """`chunk` as pieces of at most `limit` UTF-16 units (a lone character always fits)."""
    size = utf16_length(chunk)
    if size <= limit or len(chunk) == 1:
        return [chunk]
    scaled = max(1, limit * len(chunk) // size)
    return [part for piece in chunk_text(chunk, scaled) for part in _fit_utf16(piece, limit)]


class _Splitter:
    """One long text being cut into chunks; knows its fences and the limit."""

    def __init__(self, text: str, limit: int) -> None:
        self.text = text
        self.limit = limit
        self.fences = _fences(text, limit)
        self.starts = [fence.start for fence in self.fences]

    def chunks(self) -> list[str]:
        """The chunks, in order; whitespace at the cuts and at both ends is dropped."""
        text = self.text
        end_of_text = len(text.rstrip())
        pos = len(text) - len(text.lstrip())
        prefix = ""
        chunks: list[str] = []
        while pos < end_of_text:
            if end_of_text - pos <= self.limit - len(prefix):
                chunks.append(prefix + text[pos:end_of_text])
                break
            cut = self.best_cut(pos, prefix)
            chunk = prefix + text[pos : cut.end]
            if cut.fence is None:
                prefix = ""
            else:
                chunk += "\n" + cut.fence.marker
                prefix = cut.fence.opener + "\n"
            chunks.append(chunk)
            pos = cut.start
        return chunks

    def containing(self, at: int) -> _Fence | None:
        """The fence whose lines strictly contain position `at`, if any."""
        index = bisect_left(self.starts, at) - 1
        if index >= 0 and at < self.fences[index].end:
            return self.fences[index]
        return None

    def best_cut(self, pos: int, prefix: str) -> _Cut:
        """The best place to end the chunk that starts at `pos` (after `prefix`)."""
        text = self.text
        last = pos + self.limit - len(prefix)  # the chunk is text[pos:end] with end <= last
        outside: dict[_Kind, _Cut] = {}
        inside: dict[_Kind, _Cut] = {}
        for found in _BREAK.finditer(text, pos, last + 1):
            end = found.start()
            if end <= pos:
                continue
            # A run at the window's edge may go on past it: look at the whole run.
            run = (_BREAK.match(text, end) or found) if found.end() == last + 1 else found
            gap = run.group()
            newline = gap.rfind("\n")
            line_start = end + newline + 1 if newline >= 0 else run.end()
            kind = _kind(text, pos, end, gap.count("\n"))
            fence = self.containing(line_start)
            if fence is None:
                outside[kind] = _Cut(end, run.end(), None)
            elif (
                fence.body <= end
                and line_start < fence.close
                and end + 1 + len(fence.marker) <= last
            ):
                inside[kind] = _Cut(end, line_start, fence)
        floor = pos - len(prefix) + self.limit // 3
        cut = _pick(outside, floor)
        if cut is not None:
            return cut
        cut = _pick(inside, floor)
        # Splitting a fence that would fit whole in the next chunk is avoidable: cut before it.
        if cut is not None and not (outside and _fits(cut.fence, self.limit)):
            return cut
        return _latest(outside) or _latest(inside) or self.hard_cut(pos, last)

    def hard_cut(self, pos: int, last: int) -> _Cut:
        """No whitespace to cut at: cut inside the word, leaving room to close an open fence."""
        fence = self.containing(last)
        if fence is not None:
            end = min(max(pos + 1, last - 1 - len(fence.marker)), fence.close - 1)
            if end >= fence.body:
                return _Cut(end, end, fence)
        return _Cut(last, last, None)


def _fences(text: str, limit: int) -> list[_Fence]:
    """The fenced code blocks of `text` (CommonMark-style), those short enough to repeat."""
    fences: list[_Fence] = []
    opening: re.Match[str] | None = None
    for line in _FENCE_LINE.finditer(text):
        marker, info = line.group(1), line.group(2)
        if opening is None:
            if marker[0] == "`" and "`" in info:
                continue  # backticks in the info string: inline code, not a fence
            opening = line
            continue
        opened = opening.group(1)
        if marker[0] == opened[0] and len(marker) >= len(opened) and not info.strip():
            fences.append(_fence(text, opening, line.start(), line.end()))
            opening = None
    if opening is not None:
        fences.append(_fence(text, opening, len(text), len(text)))
    return [f for f in fences if len(f.opener) + len(f.marker) + 2 <= limit // 4]


def _fence(text: str, opening: re.Match[str], close: int, end: int) -> _Fence:
    body = min(opening.end() + 1, len(text))
    opener = opening.group(1) + opening.group(2).rstrip()
    return _Fence(opening.start(), body, close, end, opener, opening.group(1))


def _kind(text: str, pos: int, end: int, newlines: int) -> _Kind:
    if newlines >= 2:
        return _Kind.PARAGRAPH
    if newlines == 1:
        return _Kind.LINE
    before = text[end - 1]
    if before in _SENTENCE_END or (
        before in _AFTER_SENTENCE and end - 2 >= pos and text[end - 2] in _SENTENCE_END
    ):
        return _Kind.SENTENCE
    return _Kind.WORD


def _pick(cuts: dict[_Kind, _Cut], floor: int) -> _Cut | None:
    """The best kind of cut that fills the chunk past `floor`, if any."""
    for kind in _Kind:
        cut = cuts.get(kind)
        if cut is not None and cut.end >= floor:
            return cut
    return None


def _latest(cuts: dict[_Kind, _Cut]) -> _Cut | None:
    """The cut that keeps the most text in the chunk, whatever its kind."""
    return max(cuts.values(), key=lambda cut: cut.end, default=None)


def _fits(fence: _Fence | None, limit: int) -> bool:
    return fence is not None and fence.end - fence.start <= limit
