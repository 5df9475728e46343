"""The memory backend's transcript budget in bytes (issue 20, state/memory_transcripts.py)."""

from __future__ import annotations

import sys

import pytest

from gateway.app.errors import ConfigError
from gateway.config import StateConfig, parse_config
from gateway.config.limits import DEFAULT_TRANSCRIPT_BYTES, MIN_TRANSCRIPT_BYTES
from gateway.state.base import TranscriptEntry
from gateway.state.factory import build_state
from gateway.state.memory import MemoryStateStore
from gateway.state.memory_transcripts import (
    ENTRY_OVERHEAD,
    TRANSCRIPT_OVERHEAD,
    MemoryTranscripts,
    entry_bytes,
)

DAY = 86_400.0
BIG = "\U0001f600" * 4_000
"""A 16 KB message (4,000 emoji: four bytes each, in UTF-8 and in CPython's memory)."""


def said(key: str, text: str = BIG) -> TranscriptEntry:
    """A message of its own (a text object of its own, as a platform hands each over)."""
    return TranscriptEntry(key, "U1", "ann", text[:-1] + key[-1])


def one_transcript_bytes(scope: str, entries: list[TranscriptEntry]) -> int:
    """What a transcript of `entries` under `scope` counts."""
    return TRANSCRIPT_OVERHEAD + sys.getsizeof(scope) + sum(map(entry_bytes, entries))


@pytest.mark.parametrize(
    "entry",
    [
        said("room:a:1"),
        TranscriptEntry("room:a:2", "U1", "ann", "plain ASCII, counted from lengths"),
        TranscriptEntry("room:a:3", "U1", "Ånn", "ascii text, a Latin-1 name"),
        TranscriptEntry("room:a:4", "U1", "ann", "ħ" * 100),
    ],
)
def test_issue20_an_entry_counts_its_text_name_key_sender_and_overhead(
    entry: TranscriptEntry,
) -> None:
    assert entry_bytes(entry) == ENTRY_OVERHEAD + sum(
        sys.getsizeof(part) for part in (entry.text, entry.sender_name, entry.key, entry.sender_id)
    )
    assert entry_bytes(said("room:a:1")) > 16_000


def test_issue20_the_byte_budget_evicts_the_least_recently_written_transcripts_first() -> None:
    held = MemoryTranscripts(max_bytes=100_000)  # room for five 16 KB messages and change
    for index, scope in enumerate(("room:a", "room:b", "room:c", "room:d", "room:e")):
        assert held.append(scope, said(f"{scope}:{index}"), max_messages=200, ttl=DAY, now=0.0)
    # `a` is written again, so `b` is now the least recently written.
    assert held.append("room:a", said("room:a:9"), max_messages=200, ttl=DAY, now=1.0)
    assert held.recent("room:b", 10, 1.0).entries == ()
    assert [len(held.recent(s, 10, 1.0).entries) for s in ("room:a", "room:c", "room:d")] == [
        2,
        1,
        1,
    ]
    held.append("room:f", said("room:f:1"), max_messages=200, ttl=DAY, now=2.0)
    assert held.recent("room:c", 10, 2.0).entries == ()
    assert held.held_bytes <= 100_000
    # The count is the sum of what is held, to the byte.
    live = {s: list(held.recent(s, 200, 2.0).entries) for s in ("room:a", "room:d", "room:e")}
    live["room:f"] = list(held.recent("room:f", 200, 2.0).entries)
    assert held.held_bytes == sum(one_transcript_bytes(s, e) for s, e in live.items())


def test_issue20_the_transcript_being_written_is_never_evicted_only_trimmed_to_its_newest() -> None:
    held = MemoryTranscripts(max_bytes=MIN_TRANSCRIPT_BYTES)
    held.append("room:old", said("room:old:1"), max_messages=200, ttl=DAY, now=0.0)
    for index in range(10):
        assert held.append("room:hot", said(f"m{index}"), max_messages=200, ttl=DAY, now=1.0)
        assert held.recent("room:hot", 1, 1.0).entries == (said(f"m{index}"),)
    assert held.recent("room:old", 10, 1.0).entries == ()
    kept = held.recent("room:hot", 200, 1.0).entries
    assert [entry.key for entry in kept] == ["m7", "m8", "m9"]  # 3 of 16 KB fit in 64 KiB
    assert held.held_bytes == one_transcript_bytes("room:hot", list(kept))
    assert held.held_bytes <= MIN_TRANSCRIPT_BYTES
    # A message alone larger than the budget is still kept, alone: the newest always is.
    tiny = MemoryTranscripts(max_bytes=1_000)
    tiny.append("room:x", said("x1"), max_messages=200, ttl=DAY, now=0.0)
    tiny.append("room:x", said("x2"), max_messages=200, ttl=DAY, now=0.0)
    assert tiny.recent("room:x", 10, 0.0).entries == (said("x2"),)
    # A trimmed message's key is free again, as one trimmed by max_messages is.
    assert held.append("room:hot", said("m0"), max_messages=200, ttl=DAY, now=1.0)


def test_issue20_forget_expiry_and_max_messages_give_their_bytes_back() -> None:
    held = MemoryTranscripts(max_bytes=10**9)
    for index in range(5):
        held.append("room:a", said(f"a{index}"), max_messages=3, ttl=DAY, now=0.0)
    assert held.held_bytes == one_transcript_bytes(
        "room:a", [said(f"a{index}") for index in (2, 3, 4)]
    )
    held.append("room:a\x1ft1", said("t1"), max_messages=3, ttl=DAY, now=0.0)
    held.append("room:b", said("b1"), max_messages=3, ttl=10.0, now=0.0)
    assert held.forget("room:a", threads=True) == 4
    assert held.held_bytes == one_transcript_bytes("room:b", [said("b1")])
    assert held.recent("room:b", 10, 10.0).entries == ()  # expired, dropped on reading
    assert held.held_bytes == 0
    held.append("room:c", said("c1"), max_messages=3, ttl=10.0, now=0.0)
    held.append("room:d", said("d1"), max_messages=3, ttl=10.0, now=20.0)  # sweeps `c`
    assert held.held_bytes == one_transcript_bytes("room:d", [said("d1")])


async def test_issue20_the_memory_store_takes_its_budget_from_the_state_config() -> None:
    store = build_state(StateConfig(max_transcript_bytes=MIN_TRANSCRIPT_BYTES))
    assert isinstance(store, MemoryStateStore)
    for room in range(100):
        await store.transcript_append(
            f"room:r{room}", said(f"room:r{room}:1"), max_messages=200, ttl=DAY
        )
        assert store.transcript_bytes <= MIN_TRANSCRIPT_BYTES
    assert [e.key for e in (await store.transcript_recent("room:r99", 5)).entries] == ["room:r99:1"]
    assert StateConfig().max_transcript_bytes == DEFAULT_TRANSCRIPT_BYTES == 32 * 1024 * 1024


@pytest.mark.parametrize(
    "value",
    [".inf", "-.inf", ".nan", "1e308", "1.0e+308", "-1", "0", "65535", "1.5", "'32MiB'"]
    + [f"'{'9' * 5_000}'", str(64 * 1024**3 + 1)],
)
def test_issue20_an_absurd_transcript_budget_is_refused_naming_the_field(value: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(f"state: {{max_transcript_bytes: {value}}}\n", env={})
    assert caught.value.path == "state.max_transcript_bytes"


def test_issue20_a_transcript_budget_from_the_environment_is_read_as_a_number() -> None:
    config = parse_config(
        "state: {max_transcript_bytes: '${LW_BYTES}'}\n", env={"LW_BYTES": "1048576"}
    )
    assert config.state.max_transcript_bytes == 1_048_576
