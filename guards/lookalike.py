"""Fold text that reads the same to a person into one form, for comparisons only.

`fold(text)` drops every format character (Unicode category Cf: zero-width characters,
bidi marks, embeddings and isolates, the soft hyphen), removes combining marks that
render as nothing on their own (CGJ U+034F) and variation selectors, applies NFKC (so
full-width `ＮＯ＿ＲＥＰＬＹ` becomes `NO_REPLY`), maps the common Cyrillic and Greek
look-alikes of Latin letters and the Unicode hyphens and dashes U+2010–U+2015 to their
ASCII forms, and case-folds. It is for deciding whether two strings *look* alike (a
silence token, a bot's name); the original text is what gets sent.

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
_TABLE = str.maketrans(_CONFUSABLES)
# Combining grapheme joiner and variation selectors: invisible on their own, but not Cf.
_INVISIBLE_MARKS = re.compile("[\u034f\ufe00-\ufe0f\U000e0100-\U000e01ef]")
_PLAIN = re.compile(r"[\x20-\x7e\n\t]*")


def fold(text: str) -> str:
    """`text` as it reads to a person: no invisible characters, NFKC, Latin look-alikes."""
    if _PLAIN.fullmatch(text):
        return text.casefold()
    visible = "".join(ch for ch in text if unicodedata.category(ch) != "Cf")
    visible = _INVISIBLE_MARKS.sub("", visible)
    return unicodedata.normalize("NFKC", visible).translate(_TABLE).casefold()
