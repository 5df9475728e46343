"""The memory backend's transcripts (DESIGN.md §3), bounded in number and in bytes.

On sqlite and redis a transcript lives on disk or in the Redis server; here it lives in
the gateway's own memory, so besides `max_messages` per transcript and `TRANSCRIPTS_KEEP`
transcripts, all of them share one budget of bytes (`state.max_transcript_bytes`,
32 MiB by default, `gateway.config.limits`): without it 10,000 transcripts of 200 messages of 8,000
characters, held for 7 days, would be gigabytes.

Decisions where DESIGN.md is silent:
- An entry's bytes are what this process holds for it: the size of each of its strings
  (text, sender name, message key, sender id; `sys.getsizeof`, so 4,000 emoji are 16 KB
  and 4,000 ASCII letters 4 KB) plus `ENTRY_OVERHEAD` for the entry object and its places
  in the transcript; a transcript adds `TRANSCRIPT_OVERHEAD` and its scope's size. The
  count is `held_bytes`, deterministic, and within a few percent of what tracemalloc
  measures (a string shared by entries counts once per entry, so it errs high).
- Past the budget the least recently written transcripts go whole, oldest first. The one
  being written never goes: when it alone passes the budget its own oldest messages go,
  its newest always kept. An evicted or trimmed message's key is free again, as a
  message trimmed by `max_messages` is.
- Expired transcripts are swept from the front as before: O(1) amortised per append.
"""

from __future__ import annotations

import sys
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from itertools import islice

from gateway.config.limits import DEFAULT_TRANSCRIPT_BYTES
from gateway.state import transcripts
from gateway.state.base import Transcript, TranscriptEntry

# Transcripts held; past this the least recently written one goes, so a flood of small
# rooms costs bounded memory even under a large byte budget.
TRANSCRIPTS_KEEP = 10_000
# Measured with tracemalloc on CPython 3.11 (an entry: the slotted object, its deque slot
# and its key's set slot; a transcript: its record, deque block, set and OrderedDict slot).
ENTRY_OVERHEAD = 160
TRANSCRIPT_OVERHEAD = 1_100


# An ASCII string holds `sys.getsizeof("")` plus one byte a character, so an all-ASCII
# entry (the usual one) is counted from lengths, without four `getsizeof` calls.
_ASCII_ENTRY = ENTRY_OVERHEAD + 4 * sys.getsizeof("")


def entry_bytes(entry: TranscriptEntry) -> int:
    """The memory one stored entry holds (its four strings and `ENTRY_OVERHEAD`)."""
    text, name, key, sender = entry.text, entry.sender_name, entry.key, entry.sender_id
    if text.isascii() and name.isascii() and key.isascii() and sender.isascii():
        return _ASCII_ENTRY + len(text) + len(name) + len(key) + len(sender)
    size_of = sys.getsizeof
    return ENTRY_OVERHEAD + size_of(text) + size_of(name) + size_of(key) + size_of(sender)


@dataclass(slots=True)
class _Transcript:
    """One room's or thread's messages, the keys they were appended under, expiry and bytes."""

    expires_at: float
    size: int
    entries: deque[TranscriptEntry] = field(default_factory=deque)
    keys: set[str] = field(default_factory=set)

    def drop_oldest(self) -> int:
        """Drop the oldest entry; its bytes."""
        oldest = self.entries.popleft()
        self.keys.discard(oldest.key)
        size = entry_bytes(oldest)
        self.size -= size
        return size


class MemoryTranscripts:
    """Every transcript of one memory store, least recently written first, within the budget."""

    def __init__(self, max_bytes: int = DEFAULT_TRANSCRIPT_BYTES) -> None:
        self._max_bytes = max_bytes
        self._held: OrderedDict[str, _Transcript] = OrderedDict()
        self._bytes = 0

    @property
    def held_bytes(self) -> int:
        """The bytes every transcript holds now, as counted against the budget."""
        return self._bytes

    def append(
        self, scope: str, entry: TranscriptEntry, *, max_messages: int, ttl: float, now: float
    ) -> bool:
        """Append once per key; trim to `max_messages`, then every transcript to the budget."""
        held = self._live(scope, now)
        if held is not None and entry.key in held.keys:
            return False
        self._sweep(now)
        if held is None:
            held = self._held[scope] = _Transcript(now + ttl, TRANSCRIPT_OVERHEAD)
            held.size += sys.getsizeof(scope)
            self._bytes += held.size
            if len(self._held) > TRANSCRIPTS_KEEP:
                self._drop(next(iter(self._held)))
        else:
            held.expires_at = now + ttl
            self._held.move_to_end(scope)
        stored = transcripts.bounded(entry)
        held.entries.append(stored)
        held.keys.add(stored.key)
        size = entry_bytes(stored)
        held.size += size
        self._bytes += size
        while len(held.entries) > max_messages:
            self._bytes -= held.drop_oldest()
        if self._bytes > self._max_bytes:
            self._fit(held)
        return True

    def recent(self, scope: str, limit: int, now: float) -> Transcript:
        """The newest `limit` entries, oldest first (nothing here can be unreadable)."""
        held = self._live(scope, now)
        if held is None or limit <= 0:
            return Transcript()
        newest = list(islice(reversed(held.entries), limit))
        newest.reverse()
        return Transcript(tuple(newest))

    def forget(self, scope: str, *, threads: bool = False) -> int:
        """Drop the transcript (and, with `threads`, every thread's of it); entries dropped."""
        dropped = self._drop(scope)
        if threads:
            prefix = scope + transcripts.SEP
            for name in [name for name in self._held if name.startswith(prefix)]:
                dropped += self._drop(name)
        return dropped

    def _fit(self, writing: _Transcript) -> None:
        """Evict whole transcripts, least recently written first, then `writing`'s oldest."""
        held = self._held
        while self._bytes > self._max_bytes:
            oldest = next(iter(held))
            if held[oldest] is writing:  # the last one left: trim it, keeping its newest
                while self._bytes > self._max_bytes and len(writing.entries) > 1:
                    self._bytes -= writing.drop_oldest()
                return
            self._drop(oldest)

    def _drop(self, scope: str) -> int:
        """Forget one transcript; how many entries it held."""
        gone = self._held.pop(scope, None)
        if gone is None:
            return 0
        self._bytes -= gone.size
        return len(gone.entries)

    def _live(self, scope: str, now: float) -> _Transcript | None:
        """The scope's transcript unless it has expired (an expired one is dropped)."""
        held = self._held.get(scope)
        if held is not None and held.expires_at <= now:
            self._drop(scope)
            return None
        return held

    def _sweep(self, now: float) -> None:
        """Drop expired transcripts from the front: O(1) amortised per append."""
        held = self._held
        while held:
            oldest = next(iter(held))
            if held[oldest].expires_at > now:
                return
            self._drop(oldest)
