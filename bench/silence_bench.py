"""Silence check cost per reply: `apply_silence` on a mix of replies, and a streamed reply.

Run: .venv/bin/python -m bench.silence_bench [--quick] (--quick: a tenth of the rounds).

- whole replies: a mix of what agents send (plain answers of 20-2,000 characters in
  ASCII and in other scripts, Markdown, a code block, a trailing token line, the bare
  token, look-alikes), each passed to `apply_silence`; the figure is µs per reply.
  Target: at most 20 µs per reply on average.
- stream: a 2,000-character answer fed to `SilenceStreamFilter` in 4-character pieces,
  as a model streams; the figure is µs per piece.

The best of three runs is reported, in CPU time of the running thread (time.thread_time),
so other load on the machine does not count.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from guards.silence import SilenceStreamFilter, apply_silence

REPEATS = 3
TARGET_US = 20.0

_ANSWER = "The deploy finished at 14:02; two checks are still running, see the log. "
_PROSE = "Le déploiement est terminé ; deux vérifications tournent encore. 部署已完成。"
REPLIES = (
    "Sure, I can help with that.",
    _ANSWER * 3,
    _ANSWER * 27,
    _PROSE * 4,
    "**Summary**\n\n- one\n- two\n\n```py\nprint('hello')\n```\n",
    "Here is the answer.\n\nNO_REPLY",
    "NO_REPLY",
    "ＮＯ＿ＲＥＰＬＹ",
    "Reply NO_REPLY if you have nothing to add.",
    "OK",
)


def _best(run: Callable[[], None]) -> float:
    """The best thread CPU time of REPEATS runs, in seconds."""
    best = float("inf")
    for _ in range(REPEATS):
        start = time.thread_time()
        run()
        best = min(best, time.thread_time() - start)
    return best


def whole_replies(rounds: int) -> float:
    """µs per `apply_silence` call over the reply mix."""

    def run() -> None:
        for _ in range(rounds):
            for reply in REPLIES:
                apply_silence(reply)

    return _best(run) / (rounds * len(REPLIES)) * 1e6


def stream(rounds: int) -> float:
    """µs per piece of a 2,000-character answer streamed in 4-character pieces."""
    text = (_ANSWER * 27)[:2000]
    pieces = [text[i : i + 4] for i in range(0, len(text), 4)]

    def run() -> None:
        for _ in range(rounds):
            filter_ = SilenceStreamFilter()
            for piece in pieces:
                filter_.feed(piece)
            filter_.finish()

    return _best(run) / (rounds * len(pieces)) * 1e6


def main() -> None:
    """Print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a tenth of the rounds")
    quick = parser.parse_args().quick
    per_reply = whole_replies(300 if quick else 3000)
    per_piece = stream(3 if quick else 30)
    verdict = "ok" if per_reply <= TARGET_US else "over target"
    print(f"apply_silence: {per_reply:.2f} µs per reply (target {TARGET_US:.0f}: {verdict})")
    print(f"SilenceStreamFilter: {per_piece:.2f} µs per 4-character piece")


if __name__ == "__main__":
    main()
