"""Reasoning blocks (`<think>`, `<thinking>`, `<reasoning>`) never reach a room.

`strip_reasoning(text)` removes every block, from its opening tag to the first closing
tag of the same name (matched case-insensitively; blocks do not nest), together with the
whitespace after it. A block still open when the reply ends is reasoning cut short: it
is removed with the rest of the reply, wherever it starts. (Keeping an unclosed tag after
some text as text would let the reasoning after it through, and a reply stripped of a
leading token line would start with it.) So a reply cannot show these tags at all, only
a stray closing tag.

`ReasoningFilter` does the same for a reply that arrives in pieces, holding back a
possible opening tag and an open block until they are decided: `strip_reasoning` is that
filter fed the whole text at once, so a stream and a whole reply cannot disagree.
"""

from __future__ import annotations

import re
from typing import Final

_NAMES: Final = ("think", "thinking", "reasoning")
_OPENER: Final = re.compile("<(" + "|".join(_NAMES) + ")>", re.IGNORECASE | re.ASCII)
_CLOSERS: Final = {name: re.compile(f"</{name}>", re.IGNORECASE | re.ASCII) for name in _NAMES}
_OPENER_TEXTS: Final = tuple(f"<{name}>" for name in _NAMES)
_LONGEST_OPENER: Final = max(map(len, _OPENER_TEXTS))
_LONGEST_CLOSER: Final = _LONGEST_OPENER + 1
_NON_SPACE: Final = re.compile(r"\S")


def _is_opener_prefix(tail: str) -> bool:
    """True when `tail` (from a `<` to the end) may still become an opening tag."""
    lowered = tail.lower()
    return any(opener.startswith(lowered) for opener in _OPENER_TEXTS)


class ReasoningFilter:
    """Removes reasoning blocks from a reply written piece by piece."""

    def __init__(self) -> None:
        # A possible opening tag cut at the end of the last piece.
        self._held = ""
        # The closing tag of the open block, and the block's last characters, in which
        # a closing tag cut by the end of a piece starts (the rest is never kept).
        self._closer: re.Pattern[str] | None = None
        self._tail = ""
        self._after_block = False

    def feed(self, chunk: str) -> str:
        """Take the next piece of the reply; return the text decided to be no reasoning."""
        out: list[str] = []
        if self._closer is None:
            text, self._held = self._held + chunk, ""
        else:
            window = self._tail + chunk
            closer = self._closer.search(window)
            if closer is None:
                self._tail = window[-(_LONGEST_CLOSER - 1) :]
                return ""
            self._close()
            text = window[closer.end() :]
        self._scan(text, out)
        return "".join(out)

    def finish(self) -> str:
        """The rest of the reply once it is complete: "" after a block that never closed."""
        rest, self._held = self._held, ""
        if self._closer is not None:
            self._close()
            return ""  # reasoning cut short: the rest of the reply is reasoning
        return rest

    def _scan(self, text: str, out: list[str]) -> None:
        """Pass on `text` up to the first block that stays open (held) or a cut tag."""
        pos = 0
        while True:
            if self._after_block:
                content = _NON_SPACE.search(text, pos)
                if content is None:
                    return
                pos = content.start()
                self._after_block = False
            opened = self._open_next(text, pos, out)
            if opened is None:
                return
            body, closer_rx = opened
            closer = closer_rx.search(text, body)
            if closer is None:
                self._tail = text[max(body, len(text) - _LONGEST_CLOSER + 1) :]
                return
            self._close()
            pos = closer.end()

    def _close(self) -> None:
        """The open block ended (or was decided): forget it; whitespace after it goes too."""
        self._closer = None
        self._tail = ""
        self._after_block = True

    def _open_next(self, text: str, pos: int, out: list[str]) -> tuple[int, re.Pattern[str]] | None:
        """Pass on the text before the next opening tag and open its block there.

        Returns where the block's body starts and its closing tag, or None when there is
        no tag; then the text is passed on up to a possible tag cut at its end, held.
        """
        opener = _OPENER.search(text, pos)
        if opener is None:
            cut = text.rfind("<", max(pos, len(text) - _LONGEST_OPENER + 1))
            if cut >= 0 and _is_opener_prefix(text[cut:]):
                out.append(text[pos:cut])
                self._held = text[cut:]
            else:
                out.append(text[pos:])
            return None
        out.append(text[pos : opener.start()])
        self._closer = _CLOSERS[opener[1].lower()]
        return opener.end(), self._closer


def strip_reasoning(text: str) -> str:
    """`text` without its reasoning blocks (see the module docstring); itself if it has none."""
    if "<" not in text or _OPENER.search(text) is None:
        return text  # without an opening tag nothing is removed
    reasoning = ReasoningFilter()
    return reasoning.feed(text) + reasoning.finish()
