"""Text from chat or a caller, shown on one line as it was sent: invisible characters written out.

`visible(text)` is how the audit trail shows what people typed and who they said they
were, in its text lines (`GET /admin/audit`'s `result`), its JSON (`entries`, which the
console's Audit page shows) and the decision log. A character that could end the line,
move or hide what follows, or reorder it on screen is written as an escape: C0 and C1
control characters and DEL (`\\n`, `\\r`, `\\t`, `\\x1b`, `\\x85`, `\\x7f`), the line and
paragraph separators (`\\u2028`, `\\u2029`), bidi controls and other format characters
(`\\u202e`, `\\u200b`), spaces other than the ASCII one (`\\xa0`) and code points Python
does not know (`\\U000e0001`, a lone surrogate). So a chat message holding
`\\n2026-… INFO forged` stays one line that shows the `\\n`, and a `\\u202e` cannot turn
a name around. A backslash typed as such is kept: a line never breaks, so `\\n` typed as
two characters forges nothing.
"""

from __future__ import annotations

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def visible(text: str) -> str:
    """`text` with every character that is not printable written as its escape."""
    if text.isprintable():
        return text  # nearly always: nothing to write out, no copy
    return "".join(char if char.isprintable() else _escape(char) for char in text)


def _escape(char: str) -> str:
    """`\\n`, `\\x1b`, `\\u202e` or `\\U000e0001`: the character as Python would write it."""
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"
