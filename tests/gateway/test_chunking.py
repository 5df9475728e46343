"""Chunking replies to a platform's limit: examples and Hypothesis properties."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.delivery.chunking import chunk_text, utf16_length

_WHITESPACE = re.compile(r"[ \t\r\n]+")


def words(text: str) -> list[str]:
    return [word for word in _WHITESPACE.split(text) if word]


def non_fence_words(chunks: list[str]) -> list[str]:
    return [word for chunk in chunks for word in words(chunk) if not word.startswith("```")]


def fence_lines(chunk: str) -> int:
    return sum(1 for line in chunk.split("\n") if line.lstrip().startswith("```"))


def test_short_text_is_one_chunk_unchanged() -> None:
    assert chunk_text("hello  world\n", 100) == ["hello  world\n"]


def test_blank_text_gives_no_chunks() -> None:
    assert chunk_text("", 10) == []
    assert chunk_text(" \n\t ", 10) == []


def test_limit_must_be_positive() -> None:
    with pytest.raises(ValueError, match="limit"):
        chunk_text("text", 0)


def test_paragraph_break_preferred_over_line_and_word() -> None:
    first = "First paragraph line one.\nLine two of the first paragraph."
    second = "Second paragraph, quite a bit of text here."
    chunks = chunk_text(f"{first}\n\n{second}", 70)
    assert chunks == [first, second]


def test_line_break_preferred_over_sentence() -> None:
    text = "Alpha beta. Gamma delta epsilon zeta eta theta.\nIota kappa lambda mu nu."
    assert chunk_text(text, 60) == [
        "Alpha beta. Gamma delta epsilon zeta eta theta.",
        "Iota kappa lambda mu nu.",
    ]


def test_sentence_end_preferred_over_word() -> None:
    text = "One two three four five six. Seven eight nine ten eleven twelve."
    assert chunk_text(text, 40) == [
        "One two three four five six.",
        "Seven eight nine ten eleven twelve.",
    ]


def test_small_paragraph_gives_way_to_a_fuller_cut() -> None:
    text = "Hi.\n\n" + "word " * 40
    chunks = chunk_text(text, 100)
    assert len(chunks[0]) > 50  # not just "Hi."
    assert all(len(chunk) <= 100 for chunk in chunks)


def test_word_longer_than_limit_is_cut_inside() -> None:
    assert chunk_text("a" * 25, 10) == ["a" * 10, "a" * 10, "a" * 5]


def test_no_part_markers() -> None:
    chunks = chunk_text("lorem ipsum " * 500, 200)
    assert not any(re.search(r"\(\d+/\d+\)", chunk) for chunk in chunks)


def test_fence_moved_whole_to_next_chunk_when_it_fits() -> None:
    prose = "Here is the fix for the parser, explained briefly. " * 3
    code = "```python\n" + "\n".join(f"x{i} = {i}" for i in range(20)) + "\n```"
    chunks = chunk_text(prose + "\n\n" + code + "\n\nDone.", len(code) + 10)
    assert code in chunks[1]
    assert chunks[0] == prose.strip()


def test_fence_split_is_closed_and_reopened_with_language() -> None:
    lines = [f"    value_{i} = compute({i})" for i in range(40)]
    text = "Intro.\n\n```python\n" + "\n".join(lines) + "\n```\nOutro."
    chunks = chunk_text(text, 300)
    assert len(chunks) > 2
    for chunk in chunks:
        assert len(chunk) <= 300
        assert fence_lines(chunk) % 2 == 0
    for chunk in chunks[1:-1]:
        assert chunk.startswith("```python\n")
        assert chunk.endswith("\n```")
    # Indentation inside the fence survives the cut.
    assert all(
        line.startswith("    value_") for chunk in chunks[1:-1] for line in chunk.split("\n")[1:-1]
    )
    assert non_fence_words(chunks) == non_fence_words([text])


def test_cut_outside_a_fence_preferred() -> None:
    code = "```\n" + "\n".join(f"line {i}" for i in range(8)) + "\n```"
    text = code + "\n" + "tail words " * 10
    chunks = chunk_text(text, len(code) + 20)
    assert chunks[0] == code


def test_issue3_6000_char_reply_in_order_within_discord_limit() -> None:
    paragraphs = [(f"Paragraph {i}: " + "some sentence here. " * 14).strip() for i in range(20)]
    text = "\n\n".join(paragraphs)
    assert len(text) > 5_500
    chunks = chunk_text(text, 2_000)
    assert len(chunks) == 4  # six ~300-character paragraphs fit in 2,000
    assert all(len(chunk) <= 2_000 for chunk in chunks)
    assert "\n\n".join(chunks) == text  # every cut fell on a paragraph break


_WORD = st.text(alphabet="abcXYZ019.,;:!?'\"()*_-éßø漢字🙂", min_size=1, max_size=12)
_SEPARATOR = st.sampled_from([" ", "  ", "\n", "\n\n", ". ", "\t", " \n "])


@st.composite
def prose(draw: st.DrawFn, max_word: int = 12) -> str:
    items = draw(st.lists(st.tuples(_WORD.filter(lambda w: len(w) <= max_word), _SEPARATOR)))
    return "".join(word + sep for word, sep in items)


@given(text=st.text(alphabet=st.sampled_from("ab `\n.!~"), max_size=400), limit=st.integers(1, 80))
@settings(max_examples=300)
def test_every_chunk_within_limit_and_non_empty(text: str, limit: int) -> None:
    chunks = chunk_text(text, limit)
    for chunk in chunks:
        assert 0 < len(chunk) <= limit
        assert chunk.strip()


@given(data=st.data(), limit=st.integers(13, 300))
@settings(max_examples=300)
def test_words_kept_whole_and_in_order(data: st.DataObject, limit: int) -> None:
    text = data.draw(prose(max_word=min(12, limit - 1)))
    chunks = chunk_text(text, limit)
    assert all(len(chunk) <= limit for chunk in chunks)
    assert [w for c in chunks for w in words(c)] == words(text)


@given(data=st.data(), limit=st.integers(2, 12))
def test_long_words_cut_but_nothing_lost(data: st.DataObject, limit: int) -> None:
    text = data.draw(prose())
    chunks = chunk_text(text, limit)
    assert all(len(chunk) <= limit for chunk in chunks)
    assert "".join(words("".join(chunks))) == "".join(words(text))


_CODE_LINE = st.lists(st.text(alphabet="abxyz_.,=()[]{}", min_size=1, max_size=10), max_size=8)


@st.composite
def markdown(draw: st.DrawFn) -> str:
    blocks: list[str] = []
    for _ in range(draw(st.integers(1, 6))):
        if draw(st.booleans()):
            blocks.append(draw(prose()).strip() or "text")
        else:
            language = draw(st.sampled_from(["", "python", "js"]))
            code_lines = draw(st.lists(_CODE_LINE, min_size=1, max_size=15))
            body = "\n".join("    " + " ".join(line) for line in code_lines)
            blocks.append(f"```{language}\n{body}\n```")
    return "\n\n".join(blocks)


@given(text=markdown(), limit=st.integers(80, 400))
@settings(max_examples=200)
def test_fences_balanced_in_every_chunk_and_words_kept(text: str, limit: int) -> None:
    chunks = chunk_text(text, limit)
    for chunk in chunks:
        assert len(chunk) <= limit
        assert fence_lines(chunk) % 2 == 0, chunk
    assert non_fence_words(chunks) == non_fence_words([text])


@given(
    text=st.text(alphabet=st.sampled_from("ab \n😀🚀é"), max_size=400),
    limit=st.integers(2, 80),
)
@settings(max_examples=300)
def test_utf16_chunks_fit_in_code_units_and_lose_nothing(text: str, limit: int) -> None:
    chunks = chunk_text(text, limit, units="utf16")
    assert all(chunk and utf16_length(chunk) <= limit for chunk in chunks)
    assert "".join("".join(chunks).split()) == "".join(text.split())


def test_emoji_reply_for_telegram_fits_4096_utf16_units() -> None:
    text = ("🚀" * 1500 + " launch\n") * 4
    chunks = chunk_text(text, 4096, units="utf16")
    assert max(utf16_length(chunk) for chunk in chunks) <= 4096
    assert max(len(chunk) for chunk in chunk_text(text, 4096)) > 2048
    assert "".join(c.replace(" ", "").replace("\n", "") for c in chunks) == text.replace(
        " ", ""
    ).replace("\n", "")
