"""A progress bar on stderr while a replay reads its inputs (only on a terminal).

It counts bytes read against the inputs' size on disk (a zip member counts its
compressed size once read), redrawn at most every `interval` seconds on an injected
clock, and erased at the end so the report starts on a clean line.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TextIO

WIDTH = 30


class Progress:
    """A one-line bar: percent, bytes read, the bar itself."""

    def __init__(
        self,
        total: int,
        out: TextIO,
        *,
        clock: Callable[[], float] = time.monotonic,
        interval: float = 0.1,
    ) -> None:
        self._total = max(total, 1)
        self._out = out
        self._clock = clock
        self._interval = interval
        self._done = 0
        self._drawn_at = float("-inf")
        self._drawn = False

    def advance(self, count: int) -> None:
        """`count` more bytes read."""
        self._done += count
        now = self._clock()
        if now - self._drawn_at >= self._interval:
            self._drawn_at = now
            self._draw()

    def _draw(self) -> None:
        share = min(self._done / self._total, 1.0)
        filled = round(share * WIDTH)
        bar = "#" * filled + "-" * (WIDTH - filled)
        read_mb = self._done / 1e6
        self._out.write(f"\rreplay [{bar}] {share:4.0%}  {read_mb:,.1f} MB")
        self._out.flush()
        self._drawn = True

    def finish(self) -> None:
        """Erase the bar."""
        if self._drawn:
            self._out.write("\r" + " " * (WIDTH + 30) + "\r")
            self._out.flush()
