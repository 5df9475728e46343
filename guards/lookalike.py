"""Fold text that reads the same to a person into one form, for comparisons only.

`fold(text)` drops every format character (Unicode category Cf: zero-width characters,
bidi marks, embeddings and isolates, the soft hyphen), removes combining marks that
render as nothing on their own (CGJ U+034F) and variation selectors, applies NFKC (so
full-width `ＮＯ＿ＲＥＰＬＹ` becomes `NO_REPLY`), maps the common Cyrillic and Greek
look-alikes of Latin letters and the Unicode hyphens and dashes U+2010–U+2015 to their
ASCII forms, and case-folds. It is for deciding whether two strings *look* alike (a
silence token, a bot's name); the original text is what gets sent. `is_blank(text)` says
whether a text reads as nothing at all (whitespace and those invisible characters only).

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
)
_INVISIBLE = re.compile(f"[{_INVISIBLE_CHARS}]")
# Anything that shows: neither whitespace nor invisible.
_SHOWN = re.compile(rf"[^\s{_INVISIBLE_CHARS}]")


def fold(text: str) -> str:
    """`text` as it reads to a person: no invisible characters, NFKC, Latin look-alikes."""
    if text.isascii():
        # No ASCII character is Cf, changes under NFKC or has a look-alike entry.
        return text.casefold()
    folded = unicodedata.normalize("NFKC", _INVISIBLE.sub("", text))
    return _LOOKALIKE.sub(_latin, folded).casefold()


def _latin(lookalike: re.Match[str]) -> str:
    """The ASCII letter or dash a look-alike stands for."""
    return _CONFUSABLES[lookalike[0]]


def is_blank(text: str) -> bool:
    """True when `text` reads as nothing: only whitespace and invisible characters."""
    return _SHOWN.search(text) is None
