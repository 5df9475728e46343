"""Volatile tokens: the dates, times, ids and long numbers that change every round of a loop.

`normalise_text` replaces each with one placeholder, so rounds of an agent loop that
differ only by a timestamp or an id read the same (the call fingerprint and the tool-loop
guard use it).

Decisions the design left open:
- Normalisation works on UTF-8 bytes. All digits are first mapped to "0" in a copy (same
  offsets), so the regex engine's fast literal-prefix search visits digits only, and
  every volatile token is anchored at its first digit (the common kinds are tried first,
  by a pattern that gives the same spans in fewer steps, and two of them with only text
  between are one match); the few kinds with letters before that digit (hex ids and
  UUIDs such as "deadbeef12", month names such as "Nov 30 2026", an optional weekday)
  are widened to the left in Python. Provider ids keep their prefix
  ("call_Abc123" becomes "call_" + placeholder) and need a digit or a capital letter in
  their suffix, so words such as "run_tests" stay. A UUID whose first group has no
  digit, a date without a year ("Nov 30") and thousands separators ("12,345") are not
  normalised, nor is the model name. The placeholder (a NUL byte) counts as a word
  character in every boundary test, which keeps normalisation idempotent.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

_MARK = b"\x00"
# The token pattern runs on a copy where every digit is "0" (the "shape"): the literal "0"
# prefix makes the engine jump from digit to digit, and "0" is cheaper to match than
# [0-9]. The placeholder is a word character for every boundary test, so that text next
# to a replaced token is judged the same way in a second pass (idempotence).
_W = r"[0A-Za-z\x00]"
_H = "[0a-fA-F]"
_END = f"(?!{_W})"
_MONTHS = (
    "jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?"
    "|sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?"
)
_WEEKDAYS = (
    "mon(?:day)?|tue(?:s(?:day)?)?|wed(?:nesday)?|thu(?:r(?:s(?:day)?)?)?|fri(?:day)?"
    "|sat(?:urday)?|sun(?:day)?"
)


def _opt(pattern: str) -> str:
    """An optional group written as an empty alternative, which sre runs faster than `?`."""
    return f"(?:{pattern}|)"


_ORDINAL = _opt("st|nd|rd|th")
# After a run of 1-4 digits, what can follow in a date or time token: an ordinal, am/pm,
# or spaces and a month (two letters are enough to skip "page 12 of"). Explicit case
# classes: this runs at every number, and (?i:) is slower.
_SHORT_RUN_FOLLOWERS = (
    "[sS][tT]|[nN][dD]|[rR][dD]|[tT][hH]| ?[aApP]\\.?[mM]"
    "| +(?:[jJ][aAuU]|[fF][eE]|[mM][aA]|[aA][pPuU]|[sS][eE]|[oO][cC]|[nN][oO]|[dD][eE])"
)
_AMPM = r"(?i:[ap]\.?m\.?)"
_UUID_TAIL = f"-{_H}{{4}}-{_H}{{4}}-{_H}{{4}}-{_H}{{12}}{_END}"
# What follows "10:05" and "2026-11-30" in a time or an ISO date (seconds, fraction, am/pm;
# time and zone: 2026-11-30T10:05:33.120+01:00).
_TIME_TAIL = _opt(":00" + _opt("[.,]0+")) + _opt(f" ?{_AMPM}") + _END
_ISO_TAIL = (
    _opt("[T ]00:00" + _opt(":00" + _opt("[.,]0+")) + _opt("Z|[+-]00" + _opt(":?00"))) + _END
)

# Each alternative continues after the token's first digit.
_SHORT_RUN_TOKENS = "|".join(
    (
        # 10:05, 10:05:33.5, 10:05 pm (first: the most common, and the kinds are disjoint)
        f"0?:00{_TIME_TAIL}",
        f"000-00-00{_ISO_TAIL}",
        f"000/0{{1,2}}/0{{1,2}}{_END}",  # 2026/11/30
        # 30/11/2026, 11/30/26, 30-11-2026, 30.11.2026
        f"0?(?:/0{{1,2}}/(?:0{{4}}|00)|-0{{1,2}}-0{{4}}|\\.0{{1,2}}\\.0{{4}}){_END}",
        # 30 Nov 2026, 1st December, 2026 (a weekday before it is widened in Python)
        f"(?P<ddate>0?{_ORDINAL} +(?i:{_MONTHS})\\.?,? +0{{4}}{_END})",
        f"0? ?{_AMPM}{_END}",  # 3pm, 11 a.m.
    )
)
# Longest text between two tokens that are matched as a pair: a longer gap is not worth
# scanning twice when the second token turns out to be missing.
_PAIR_GAP_MAX = 64
# The common tokens, tried first: each gives exactly the span the general alternatives
# would give at that place (ids and numbers, ISO dates, times), in fewer steps. The
# lookbehinds sit after the digits so that a mismatch is found by the cheap literals.
_FAST_TOKENS = "|".join(
    (
        # A run of 5+ digits touching no hex letter and no "-": a long number or a hex id
        # made of digits only, the same span either way.
        "000(?:0(?<![a-fA-F]00000)0*+(?![a-fA-F-])"
        # ISO date; the usual UTC timestamp (2026-11-30T10:05:33Z) by literals alone, which
        # is what the general tail gives it too.
        f"|-00-00(?<!{_W}0000-00-00)(?:T00:00:00Z{_END}|{_ISO_TAIL}))",
        f"0:00(?<!{_W}00:00){_TIME_TAIL}",
        f":00(?<!{_W}0:00){_TIME_TAIL}",
    )
)
# Two common tokens with only digit-free text between them ("id": "…", "created": "…")
# are one match: the text between them (group "between") is the same in the data and
# the shape, so the loop in Python runs once instead of twice.
_TOKEN_RX = re.compile(
    (
        f"0(?<!00)(?:(?:{_FAST_TOKENS})(?:(?P<between>[^0]{{1,{_PAIR_GAP_MAX}}}+)"
        f"0(?<!00)(?:{_FAST_TOKENS})|)"
        # A token starts here only after a hex letter, or where up to four digits are
        # followed by a digit, a letter or a date or time separator: plain small numbers
        # ("amount": 717) fail here at once.
        r"|(?:(?<=[a-fA-F]0)|(?=0{0,3}+[0A-Za-z ,./:-]))(?:"
        # Tokens that start at a word boundary: UUIDs and hex ids whose first character is
        # a digit, then dates and times (a run of 1-4 digits and what may follow it).
        f"(?<!{_W}0)(?:"
        f"{_H}{{7}}(?:{_UUID_TAIL}|{_H}*{_END})"
        f"|(?=0{{0,3}}+(?:[-/.:]|{_SHORT_RUN_FOLLOWERS}))"
        f"(?:{_SHORT_RUN_TOKENS})"
        ")"
        # UUID or hex id with letters before its first digit: widened and checked in Python.
        f"|(?<=[a-fA-F]0)(?:(?P<uuidl>{_H}{{0,7}}{_UUID_TAIL})|(?P<hexl>{_H}*{_END}))"
        # Nov 30 2026, Nov. 30th, 2026: the month name before it is checked in Python.
        f"|(?P<mdate>(?<=[A-Za-z.] 0)0?{_ORDINAL},? +0{{4}}{_END})"
        # Numbers of 5+ digits, also inside words (ORD12345).
        "|0{4,}(?!0)"
        "))"
    ).encode()
)
_BETWEEN = _TOKEN_RX.groupindex["between"]
_NUMBER_RX = re.compile(b"0(?<!00)0{4,}(?!0)")
_MONTH_TAIL_RX = re.compile(
    (f"(?:(?<![A-Za-z])(?i:{_WEEKDAYS})\\.?,? +)?(?<![A-Za-z])(?i:{_MONTHS})\\.? \\Z").encode()
)
_WEEKDAY_TAIL_RX = re.compile(f"(?<![A-Za-z])(?i:{_WEEKDAYS})\\.?,? +\\Z".encode())
_DIGITS_TO_ZERO = bytes.maketrans(b"123456789", b"000000000")
_ZERO = ord("0")
_HEX_LETTERS = frozenset(b"abcdefABCDEF")
_WORD_BYTES = frozenset(b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz\x00")
# Longest month-first date prefix: "Wednesday, September " is 21 bytes.
_MONTH_LOOKBACK = 32
_WEEKDAY_LOOKBACK = 16


def _provider_rx(separator: str, prefixes: Sequence[str]) -> re.Pattern[bytes]:
    """Provider ids with this separator, found at the separator (a fast literal search).

    The match starts at the separator, so the prefix stays ("call_" + placeholder);
    lookbehinds must have a fixed width, hence one per prefix length, after a cheap one
    on the prefixes' last letters that turns away most separators (a date's dashes).
    """
    shortest = min(map(len, prefixes))
    tails = "|".join(sorted({re.escape(prefix[-shortest:] + separator) for prefix in prefixes}))
    by_width: dict[int, list[str]] = {}
    for prefix in prefixes:
        by_width.setdefault(len(prefix), []).append(re.escape(prefix))
    behind = "|".join(
        f"(?<=(?<![0-9A-Za-z\\x00])(?:{'|'.join(names)}){re.escape(separator)})"
        for names in by_width.values()
    )
    return re.compile(
        f"{re.escape(separator)}(?<={tails})(?:{behind})"
        "(?=[a-z]*[0-9A-Z])[A-Za-z0-9]{6,}".encode()
    )


# (separator byte, pattern, replacement); the separator as an int: `int in bytes` is a
# plain memchr, several times cheaper than `bytes in bytes` on short texts.
_PROVIDERS = tuple(
    (ord(separator), _provider_rx(separator, prefixes), (separator + "\x00").encode())
    for separator, prefixes in (
        (
            "_",
            (
                "call",
                "toolu",
                "srvtoolu",
                "msg",
                "run",
                "resp",
                "req",
                "fc",
                "rs",
                "file",
                "asst",
                "thread",
                "step",
                "batch",
            ),
        ),
        ("-", ("chatcmpl", "cmpl", "file")),
    )
)


def _widen(kind: str, data: bytes, shape: bytes, *, start: int, end: int, floor: int) -> int:
    """Where a token found at its first digit really starts, or -1 if it is no token."""
    if kind == "ddate":
        weekday = _WEEKDAY_TAIL_RX.search(data, max(floor, start - _WEEKDAY_LOOKBACK), start)
        return start if weekday is None else weekday.start()
    if kind == "mdate":
        month = _MONTH_TAIL_RX.search(data, max(floor, start - _MONTH_LOOKBACK), start)
        return -1 if month is None else month.start()
    begin = start
    while begin > floor and data[begin - 1] in _HEX_LETTERS:
        begin -= 1
    if begin > 0 and data[begin - 1] in _WORD_BYTES:
        return -1
    if kind == "hexl":
        return begin if end - begin >= 8 else -1
    return begin if shape.index(b"-", start) - begin == 8 else -1


def normalise_bytes(data: bytes) -> bytes:
    """`data` with every volatile token replaced by the placeholder."""
    shape = data.translate(_DIGITS_TO_ZERO)
    if _ZERO not in shape and data.islower():
        return data  # no digit and no capital: no token and no provider id
    for separator, pattern, replacement in _PROVIDERS:
        if separator in data:
            data, replaced = pattern.subn(replacement, data)
            if replaced:
                shape = data.translate(_DIGITS_TO_ZERO)
    if _ZERO not in shape:
        return data  # every token kind holds a digit
    first = _TOKEN_RX.search(shape)
    if first is None:
        return data
    # The text between tokens; joined with the placeholder at the end.
    gaps: list[bytes] = []
    append = gaps.append
    emitted = 0
    search_from = first.start()
    while True:
        for match in _TOKEN_RX.finditer(shape, search_from):
            group = match.lastindex
            if group is None:  # one token
                start, end = match.span()
                append(data[emitted:start])
                emitted = end
                continue
            start, end = match.span()
            if group == _BETWEEN:  # two tokens and the text between them
                append(data[emitted:start])
                append(match[_BETWEEN])
                emitted = end
                continue
            begin = _widen(match.lastgroup or "", data, shape, start=start, end=end, floor=emitted)
            if begin < 0:
                # Not that kind of token after all, but it may start with a long number;
                # either way, search again inside the span the match covered.
                number = _NUMBER_RX.match(shape, start)
                if number is None:
                    search_from = start + 1
                else:
                    append(data[emitted:start])
                    emitted = search_from = number.end()
                break
            append(data[emitted:begin])
            emitted = end
        else:
            break
    if not gaps:
        return data
    append(data[emitted:])
    return _MARK.join(gaps)


def normalise_text(text: str) -> str:
    """`text` with dates, times, UUIDs, hex and provider ids and long numbers replaced."""
    return normalise_bytes(text.encode("utf-8", "surrogatepass")).decode("utf-8", "surrogatepass")
