"""Look-alike folding: text that reads the same to a person folds to one form."""

from __future__ import annotations

import re
import sys
import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from guards.lookalike import displayed, fold, is_blank

FORMAT_CHARACTERS = [
    chr(code) for code in range(sys.maxunicode + 1) if unicodedata.category(chr(code)) == "Cf"
]
# Not Cf, but invisible on their own: CGJ, the variation selectors, the blank letters.
INVISIBLE_MARKS = ["\u034f", "\ufe00", "\ufe0f", "\U000e0100", "\U000e01ef", "\u3164", "\u2800"]
_MARKS_RX = re.compile("[\u034f\ufe00-\ufe0f\U000e0100-\U000e01ef\u115f\u1160\u3164\uffa0\u2800]")


def reference_fold(text: str) -> str:
    """fold() with its invisible characters dropped one at a time, by category.

    The folding of what is left is fold's own: on NFKC text without invisible characters
    it only maps look-alikes and folds case.
    """
    visible = "".join(ch for ch in text if unicodedata.category(ch) != "Cf")
    visible = _MARKS_RX.sub("", visible)
    return fold(unicodedata.normalize("NFKC", visible)) if visible else ""


def test_fold_drops_every_format_character_of_this_unicode_database() -> None:
    # The character table in guards.lookalike is written out; this holds it to Python's.
    assert len(FORMAT_CHARACTERS) > 150
    kept = [f"U+{ord(ch):04X}" for ch in FORMAT_CHARACTERS if fold(f"a{ch}b") != "ab"]
    assert kept == []


@pytest.mark.parametrize("mark", INVISIBLE_MARKS)
def test_fold_drops_invisible_marks(mark: str) -> None:
    assert fold(f"NO{mark}_REPLY") == "no_reply"


@pytest.mark.parametrize(
    ("text", "folded"),
    [
        ("ＮＯ＿ＲＥＰＬＹ", "no_reply"),  # full-width
        ("NО_RЕPLY", "no_reply"),  # Cyrillic О and Е
        ("ΝΟ_RΕΡLΥ", "no_reply"),  # Greek capitals
        ("NO\u2010REPLY", "no-reply"),
        ("NO\u2015REPLY", "no-reply"),
        ("𝐍𝐎_𝐑𝐄𝐏𝐋𝐘", "no_reply"),  # mathematical bold
        ("\u200fNO_REPLY\u202c", "no_reply"),
        ("Plain ASCII, kept.", "plain ascii, kept."),
    ],
)
def test_fold_reads_text_as_a_person_does(text: str, folded: str) -> None:
    assert fold(text) == folded


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40) | st.text(st.characters(max_codepoint=0x7F), max_size=40))
def test_fast_fold_equals_the_character_by_character_fold(text: str) -> None:
    assert fold(text) == reference_fold(text)


@pytest.mark.parametrize("text", ["", " \n\t", "\u200b", "\u00a0\u200f\u2066", "\u034f\ufe0f"])
def test_blank_text_reads_as_nothing(text: str) -> None:
    assert is_blank(text)


@pytest.mark.parametrize("text", ["a", " . ", "😄", "\u200bx", "\ud800"])
def test_text_that_shows_is_not_blank(text: str) -> None:
    assert not is_blank(text)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=30))
def test_is_blank_agrees_with_fold(text: str) -> None:
    assert is_blank(text) == (not fold(text).strip())


@pytest.mark.parametrize("filler", ["\u3164", "\u115f", "\u1160", "\uffa0", "\u2800"])
def test_issue20_blank_letters_read_as_nothing(filler: str) -> None:
    assert fold(f"{filler}NO_{filler}REPLY{filler}") == "no_reply"
    assert is_blank(filler * 3)


@pytest.mark.parametrize(
    ("text", "folded"),
    [
        ("N\u0301O_REPLY", "no_reply"),  # combining acute
        ("ŃÓ_RÉPLY", "no_reply"),  # precomposed
        ("N\u20ddO", "no"),  # enclosing circle
        ("NO\u0332REPLY", "no_reply"),  # combining low line
        ("NO\u2017REPLY", "no_reply"),  # double low line
        ("NO\u2500REPLY", "no-reply"),  # box drawing
        ("NO\u2e3aREPLY", "no-reply"),  # two-em dash
        ("नमस्ते", "नमस्ते"),  # marks of another script stay
    ],
)
def test_issue20_marks_and_line_characters_fold(text: str, folded: str) -> None:
    assert fold(text) == folded


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("\u202eYLPER_ON\u202c", "NO_REPLY"),
        ("\u202eYLPER_ON", "NO_REPLY"),
        ("a \u202ecb\u202c d\n\u202efe", "a bc d\nef"),
        ("\u2067YLPER_ON\u2069", "\u2067YLPER_ON\u2069"),  # an isolate keeps Latin order
        ("plain", "plain"),
    ],
)
def test_issue20_displayed_reverses_right_to_left_overrides(text: str, shown: str) -> None:
    assert displayed(text) == shown
