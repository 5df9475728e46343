"""A transcript's name and stored form, shared by every StateStore backend (DESIGN.md §3).

- `scope(room, thread)` names one transcript: the room's own, or one thread's
  (`room␟thread`, ␟ being U+001F), so a room's threads are found by prefix.
- `bounded(entry)` is what a backend keeps: the text capped at `MAX_TEXT_CHARS`, the
  name at `MAX_NAME_CHARS`, and any lone surrogate (a platform SDK may hand one over;
  no JSON route does, `gateway.app.jsonbody`) replaced by U+FFFD, so every backend can
  encode what it stores as UTF-8.
- `encode` / `decode`: the JSON form the sqlite and redis backends store, ASCII only, so
  a record holding any other byte (not UTF-8, or not written by `encode`) is not one of
  ours, which Redis' Lua can tell too. `decode` answers None for a record that is not one
  (not ASCII, not JSON, a field missing or of the wrong type): the backend skips and
  counts it, and the turn goes on.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import cast

from gateway.state.base import TranscriptEntry

SEP = "\x1f"
# A message longer than this is stored cut: history is for following a conversation, and
# a model's context is spent by `history.max_tokens` well before.
MAX_TEXT_CHARS = 8_000
MAX_NAME_CHARS = 200

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def scope(room: str, thread_id: str | None) -> str:
    """The transcript of a room (`thread_id` None) or of one of its threads."""
    return room if thread_id is None else f"{room}{SEP}{thread_id}"


def unicode_text(text: str) -> str:
    """`text` with any lone surrogate replaced by U+FFFD (valid text is returned as it is)."""
    if text.isascii():
        return text
    return _LONE_SURROGATE.sub("\ufffd", text)


def bounded(entry: TranscriptEntry) -> TranscriptEntry:
    """The entry as it is stored: text and name capped, lone surrogates replaced."""
    text = entry.text
    name = entry.sender_name
    if (
        len(text) <= MAX_TEXT_CHARS
        and len(name) <= MAX_NAME_CHARS
        and text.isascii()
        and name.isascii()
        and entry.key.isascii()
        and entry.sender_id.isascii()
    ):
        return entry  # the usual entry, kept as it is without a call (two per message)
    text = unicode_text(entry.text[:MAX_TEXT_CHARS])
    name = unicode_text(entry.sender_name[:MAX_NAME_CHARS])
    key = unicode_text(entry.key)
    sender_id = unicode_text(entry.sender_id)
    if (text, name, key, sender_id) == (entry.text, entry.sender_name, entry.key, entry.sender_id):
        return entry
    return TranscriptEntry(key, sender_id, name, text)


def encode(entry: TranscriptEntry) -> str:
    """The JSON record (ASCII) of a bounded entry."""
    return json.dumps(
        {"k": entry.key, "id": entry.sender_id, "n": entry.sender_name, "t": entry.text},
        separators=(",", ":"),
    )


def decode_many(records: Sequence[object]) -> tuple[tuple[TranscriptEntry, ...], int]:
    """The entries of many records (text or bytes), in order, and how many were unreadable.

    ASCII records are parsed as one JSON array when they join into one of as many items
    (one parse instead of one per record); otherwise, some record being unreadable, one
    by one.
    """
    texts = [
        raw.decode("ascii") if isinstance(raw, bytes) and raw.isascii() else raw for raw in records
    ]
    entries: list[TranscriptEntry | None] | None = None
    if all(isinstance(raw, str) and raw.isascii() for raw in texts):
        try:
            items = json.loads("[" + ",".join(cast(list[str], texts)) + "]")
        except (ValueError, RecursionError):
            items = None
        if isinstance(items, list) and len(items) == len(texts):
            entries = [_entry(item) for item in items]
    if entries is None:
        entries = [decode(raw) for raw in texts]
    found = tuple(entry for entry in entries if entry is not None)
    return found, len(records) - len(found)


def decode(raw: object) -> TranscriptEntry | None:
    """The entry an ASCII record (text or bytes) holds; None when it is not a readable one."""
    if not isinstance(raw, str | bytes) or not raw.isascii():
        return None
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):  # not JSON, or absurdly nested
        return None
    return _entry(data)


def _entry(data: object) -> TranscriptEntry | None:
    """The entry a decoded record holds, None when it is not an entry's JSON."""
    if not isinstance(data, dict):
        return None
    key, sender_id, name, text = data.get("k"), data.get("id"), data.get("n"), data.get("t")
    if not (
        isinstance(key, str)
        and isinstance(sender_id, str)
        and isinstance(name, str)
        and isinstance(text, str)
    ):
        return None
    return bounded(TranscriptEntry(key, sender_id, name, text))
