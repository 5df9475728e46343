"""Fold text that reads the same to a person into one form, for comparisons only.

`fold(text)` drops every format character (Unicode category Cf: zero-width characters,
bidi marks, embeddings and isolates, the soft hyphen), the marks that render as nothing
on their own (CGJ U+034F, variation selectors) and the letters that render as blank
space (the Hangul fillers U+115F, U+1160, U+3164, U+FFA0 and the blank Braille pattern
U+2800). It then decomposes (NFKD) and drops the combining marks that can decorate any
letter (the blocks U+0300-036F, U+1AB0-1AFF, U+1DC0-1DFF, U+20D0-20FF, U+FE20-FE2F), so
an N with a combining acute reads as N; a combining low line (U+0332, U+0333) reads as
`_`. Marks of other blocks are part of their script's spelling and stay. It recomposes
(NFKC, so full-width `ＮＯ＿ＲＥＰＬＹ` becomes `NO_REPLY`), maps the common Cyrillic and
Greek look-alikes of Latin letters, the Unicode hyphens and dashes U+2010-U+2015 and the
line characters that stand in for an underscore (box drawing `─`, `⸺`; the double low
line `‗` decomposes to one) to ASCII, and case-folds. It is for deciding whether two
strings *look* alike (a silence token, a bot's name); the original text is what gets
sent. `is_blank(text)` says whether a text reads as nothing at all (whitespace and those
invisible characters only).

`displayed(text)` is the text in the order it shows where a right-to-left override (RLO
U+202E) reverses the run after it, up to its PDF (U+202C) or the end of the line: RLO,
`YLPER_ON`, PDF shows as `NO_REPLY`. An isolate (RLI) does not reorder Latin letters, so
only the override's runs are reversed.

The look-alike table covers the letters people and models actually substitute (the
Unicode confusables of A–Z that render identically in common fonts), not all of
Unicode's confusables.txt: a full skeleton would also fold distinct words together.
"""

from __future__ import annotations

import re
import unicodedata

# Cyrillic and Greek capitals and small letters that render like a Latin letter.
_CONFUSABLES = {
    "А": "A", "В": "B", "Е": "E", "К": "K", "М": "M", "Н": "H", "О": "O", "Р": "P",
    "С": "C", "Т": "T", "Х": "X", "У": "Y", "Ѕ": "S", "І": "I", "Ј": "J", "Ү": "Y",
    "а": "a", "е": "e", "о": "o", "р": "p", "с": "c", "у": "y", "х": "x", "ѕ": "s",
    "і": "i", "ј": "j", "һ": "h", "ԁ": "d", "ԛ": "q", "ԝ": "w", "ү": "y",
    "Α": "A", "Β": "B", "Ε": "E", "Ζ": "Z", "Η": "H", "Ι": "I", "Κ": "K", "Μ": "M",
    "Ν": "N", "Ο": "O", "Ρ": "P", "Τ": "T", "Υ": "Y", "Χ": "X",
    "ο": "o", "ν": "v", "ρ": "p", "ι": "i", "κ": "k", "α": "a", "τ": "t", "υ": "u",
    "\u2010": "-", "\u2011": "-", "\u2012": "-", "\u2013": "-", "\u2014": "-", "\u2015": "-",
    "\u2212": "-",
    # Line characters that stand in for the underscore (box drawing, the long dashes, the
    # modifier low macron; the double low line `‗` decomposes to a low line): they read
    # as a separator between words.
    "\u02cd": "_", "\u2500": "-", "\u2501": "-", "\u2504": "-", "\u2505": "-",
    "\u2508": "-", "\u2509": "-", "\u254c": "-", "\u254d": "-", "\u2574": "-", "\u2576": "-",
    "\u2578": "-", "\u257a": "-", "\u23af": "-", "\u2e3a": "-", "\u2e3b": "-", "\u2043": "-",
}  # fmt: skip
# str.translate looks every character up in a dict; a regex finds the few look-alikes
# in a text many times faster, and only those are looked up.
_LOOKALIKE = re.compile("[" + "".join(_CONFUSABLES) + "]")
# Every format character (category Cf) of Unicode 14 (Python 3.11's database; a test holds
# the table to it), the combining grapheme joiner and the variation selectors: all render
# as nothing on their own. One character class lets a regex drop them at C speed.
_INVISIBLE_CHARS = (
    "\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b-\u200f"
    "\u202a-\u202e\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb\U000110bd\U000110cd"
    "\U00013430-\U00013438\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0001"
    "\U000e0020-\U000e007f"
    "\u034f\ufe00-\ufe0f\U000e0100-\U000e01ef"
    # Letters and a symbol that render as blank space: the Hangul fillers, the half-width
    # one and the blank Braille pattern (not whitespace to Unicode, so spelt out).
    "\u115f\u1160\u3164\uffa0\u2800"
)
_INVISIBLE = re.compile(f"[{_INVISIBLE_CHARS}]")
# Anything that shows: neither whitespace nor invisible.
_SHOWN = re.compile(rf"[^\s{_INVISIBLE_CHARS}]")


# The combining marks that decorate any letter (the Combining Diacritical Marks blocks,
# their Extended and Supplement blocks, the marks for symbols, the half marks). Marks of
# other scripts are part of their spelling and stay, and so does a mark on a space: it is
# a spacing accent (`¨` decomposes to one) and shows.
_MARKS = "[\u0300-\u036f\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe20-\ufe2f]"
_ANY_MARK = re.compile(_MARKS)
_COMBINING = re.compile("(?<! )" + _MARKS)
# The combining low lines draw an underscore under the letter before them; after a space
# they are the decomposed spacing forms (`‗` U+2017 is a space and U+0333).
_LOW_LINES = re.compile(" ?[\u0332\u0333]")
# A right-to-left override (RLO) shows the run after it reversed, up to the pop (PDF) or
# the end of the line.
_OVERRIDE = re.compile("\u202e([^\u202c\n]*)\u202c?")


def fold(text: str) -> str:
    """`text` as it reads to a person: no invisible characters or marks, NFKC, look-alikes."""
    if text.isascii():
        # No ASCII character is Cf, changes under NFKC or has a look-alike entry.
        return text.casefold()
    decomposed = unicodedata.normalize("NFKD", _INVISIBLE.sub("", text))
    if _ANY_MARK.search(decomposed):
        decomposed = _COMBINING.sub("", _LOW_LINES.sub("_", decomposed))
    folded = unicodedata.normalize("NFKC", decomposed)
    return _LOOKALIKE.sub(_latin, folded).casefold()


def displayed(text: str) -> str:
    """`text` in the order it shows: each run of a right-to-left override reversed."""
    return _OVERRIDE.sub(_reversed_run, text) if "\u202e" in text else text


def _reversed_run(run: re.Match[str]) -> str:
    """An overridden run as it shows, right to left."""
    return run[1][::-1]


def _latin(lookalike: re.Match[str]) -> str:
    """The ASCII letter or dash a look-alike stands for."""
    return _CONFUSABLES[lookalike[0]]


def is_blank(text: str) -> bool:
    """True when `text` reads as nothing: only whitespace and invisible characters."""
    return _SHOWN.search(text) is None
