"""Repeated LLM calls: fingerprint each call and stop a circuit that keeps sending the same one.

A call's fingerprint (`fingerprint_call`) is the model, the last two messages and the
attachments' content hashes, after the volatile tokens that change every round without
changing the question (dates, times, UUIDs, hex ids, provider ids, numbers of 5+ digits)
are replaced by one placeholder. A circuit (`circuit_key`) is an agent (or key id) plus
session, plus step when given. `CallLoopGuard.check` refuses the call that would be the
(max_repeats + 1)-th identical one on its circuit inside the window (`loop_detected`) and
pauses the circuit: until the pause ends or `reopen`, every call on it gets `loop_paused`.
Uniqueness rules (`UniquenessRule`) cap calls that share chosen fields (`duplicate_call`).

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
- Message structure: dict keys are sorted; `id`, `tool_call_id`, `tool_use_id`,
  `filename`, `file_name`, media/mime types and `cache_control` are dropped in messages
  and content parts, never inside tool arguments or tool output (there an "id" is data).
  A tool or participant `name` is kept: it is part of the question. Base64 payloads
  (data URLs anywhere; `data`, `file_data`, `b64_json` in content parts) hash by their
  decoded bytes. A string attachment that is neither a data URL nor base64 (a remote URL)
  hashes by its text: a pure guard cannot fetch it.
- Step: with a step (the `step=` argument here; in `check` the "step" field, with the
  "model" field), a call is identified by model + step and its text is ignored, so
  "attempt 3" and "attempt 4" sent with the same step are the same call; `circuit_key`
  also puts the step in the circuit.
- Counting: `check` counts an allowed call at once (so concurrent repeats are caught
  before they reach the provider) and hands back a receipt; `record_outcome` uncounts it
  when the provider failed (429, 408, 5xx, or no status with an error: timeout, dropped
  connection). Other 4xx and successes stay counted. Refused calls are never counted.
- Opening a pause forgets no count: calls before it still count in their window, so even
  a pause shorter than the window never lets more than max_repeats through per window.
  `reopen` (an admin's decision) lifts a pause and forgets the counts before it.
- A rule applies to a call that carries every field of the rule (a missing or empty field
  means the rule does not apply) and matches all its filters; "prompt" is the `prompt`
  field when given, else the call's fingerprint. The rule's key is the tuple of its field
  values. Action "pause" pauses the rule's group (the same key without the prompt: "even
  with a different prompt") for `pause_seconds`, not the whole circuit, so other
  customers keep going; the call that trips it gets `duplicate_call`, later calls of the
  group `loop_paused`. `paused()` and `reopen()` list and take both circuit keys and
  rule-group keys ("rule=NAME/field=value/...").
- Memory: call windows are one LRU table keyed by (circuit, call); entries whose last
  event left the window are swept a few per call, a table that shrank to a quarter of its
  peak is replaced a few entries per call (no call copies it whole), and `max_circuits`
  caps each table (the LRU entry goes first). `now` must not go backwards.
- Messages never contain secrets as long as the circuit root is an agent name or a key
  id, never the raw key: it is echoed in refusals and in `paused()`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import math
import re
import threading
import time
from bisect import bisect_left
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal
from urllib.parse import quote, unquote_to_bytes

CallCode = Literal["ok", "loop_detected", "loop_paused", "duplicate_call"]
RuleAction = Literal["reject", "pause"]

RULE_FIELDS: tuple[str, ...] = (
    "session",
    "step",
    "agent",
    "customer",
    "user",
    "feature",
    "model",
    "prompt",
)
MIN_RULE_WINDOW = 1.0
MAX_RULE_WINDOW = 86_400.0

# User-facing refusal texts (the proxy puts them in the provider-shaped 429 body).
MSG_LOOP_DETECTED = (
    "loopwarden: likely agent loop ({circuit} keeps repeating the same request). "
    "Calls paused for {seconds} seconds."
)
MSG_LOOP_PAUSED = (
    "loopwarden: calls on {circuit} are paused after a likely loop; retry in {seconds} seconds."
)
MSG_RULE_PAUSED = (
    "loopwarden: calls like this one are paused by rule {rule}; retry in {seconds} seconds."
)
MSG_DUPLICATE = (
    "loopwarden: rule {rule} allows {limit} such call(s) per {window} seconds; "
    "retry in {seconds} seconds."
)
MSG_DUPLICATE_PAUSED = (
    "loopwarden: rule {rule} allows {limit} such call(s) per {window} seconds; "
    "calls like this one are paused for {seconds} seconds."
)

# --------------------------------------------------------------------------------------
# Normalisation of volatile tokens
# --------------------------------------------------------------------------------------

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


def _normalise(data: bytes) -> bytes:
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
    return _normalise(text.encode("utf-8", "surrogatepass")).decode("utf-8", "surrogatepass")


# --------------------------------------------------------------------------------------
# Fingerprints
# --------------------------------------------------------------------------------------

_DIGEST_SIZE = 16
# Dropped in messages and content parts: provider-assigned per call, or a wrapper around
# bytes that are hashed by content anyway.
_VOLATILE_KEYS = frozenset(
    {
        "id",
        "tool_call_id",
        "tool_use_id",
        "filename",
        "file_name",
        "media_type",
        "mime_type",
        "mimeType",
        "cache_control",
    }
)
# Values under these keys are still message structure (parts, tool calls, payload
# wrappers); under any other key they are data and kept whole.
_STRUCTURAL_KEYS = frozenset(
    {
        "content",
        "parts",
        "tool_calls",
        "function_call",
        "function",
        "functionCall",
        "functionResponse",
        "source",
        "image_url",
        "input_audio",
        "inline_data",
        "inlineData",
        "file",
        "file_data",
        "fileData",
        "document",
        "image",
    }
)
_PAYLOAD_KEYS = frozenset({"data", "file_data", "b64_json"})
_DATA_URL_HEADER_MAX = 256


def _blob(content: bytes) -> bytes:
    """The content hash of one binary payload."""
    return hashlib.blake2b(content, digest_size=_DIGEST_SIZE, person=b"lw-blob").digest()


def _decode_base64(text: str) -> bytes | None:
    """The bytes of a base64 (or base64url) string, or None when it is not base64."""
    if not text:
        return None
    candidate = text
    if "-" in candidate or "_" in candidate:
        candidate = candidate.replace("-", "+").replace("_", "/")
    try:
        return base64.b64decode(candidate, validate=True)
    except (binascii.Error, ValueError):
        pass
    squeezed = "".join(candidate.split())
    if squeezed == candidate:
        return None
    try:
        return base64.b64decode(squeezed, validate=True)
    except (binascii.Error, ValueError):
        return None


def _data_url_bytes(text: str) -> bytes | None:
    """The content of a `data:` URL, whatever its media type, or None if it is not one."""
    if not text.startswith("data:"):
        return None
    comma = text.find(",", 5, _DATA_URL_HEADER_MAX)
    if comma < 0:
        return None
    payload = text[comma + 1 :]
    if text[5:comma].endswith(";base64"):
        return _decode_base64(payload)
    return unquote_to_bytes(payload)


def _attachment_digest(attachment: bytes | str) -> bytes:
    """An attachment's content hash: raw bytes, a data URL or base64 hash by their bytes."""
    if isinstance(attachment, bytes | bytearray | memoryview):
        return _blob(bytes(attachment))
    content = _data_url_bytes(attachment)
    if content is None:
        content = _decode_base64(attachment)
    if content is None:
        content = attachment.encode("utf-8", "surrogatepass")
    return _blob(content)


def _frame(out: list[bytes], tag: bytes, payload: bytes) -> None:
    """Append one item as tag, decimal length, ":" and payload: no two structures collide."""
    out.append(b"%s%d:" % (tag, len(payload)))
    out.append(payload)


def _framed_key(name: str) -> bytes:
    """A dict key's frame (tag "K"), as `_frame` writes it."""
    raw = name.encode("utf-8", "surrogatepass")
    return b"K%d:%s" % (len(raw), raw)


# The frames of the keys messages use most, built once: keys are framed at every use.
_KEY_FRAMES = {
    name: _framed_key(name)
    for name in (
        _VOLATILE_KEYS
        | _STRUCTURAL_KEYS
        | _PAYLOAD_KEYS
        | {"role", "type", "text", "name", "arguments", "input", "url", "detail", "is_error"}
    )
}


def _encode(value: object, out: list[bytes], structural: bool, payload: bool) -> None:
    """Append the canonical encoding of a message value (see the module docstring).

    `structural`: the value is message structure (volatile keys are dropped); `payload`:
    a string here may be base64 content. This is the hot path of `fingerprint_call`: the
    JSON types are handled first, by cheap exact checks, and the rest by the same rules
    (isinstance on an ABC is slow).
    """
    if isinstance(value, str):
        if payload or value.startswith("data:"):
            _encode_text(value, out, payload)
        else:
            raw = value.encode("utf-8", "surrogatepass")
            # A word holds no digit, "_" or "-", so no token: roles, types, names.
            text = raw if value.isalpha() else _normalise(raw)
            out.append(b"S%d:" % len(text))
            out.append(text)
    elif isinstance(value, dict):
        _encode_mapping(value, out, structural)
    elif type(value) is list or type(value) is tuple:
        out.append(b"[")
        for item in value:
            _encode(item, out, structural, False)
        out.append(b"]")
    elif value is None or value is True or value is False:
        out.append(b"n" if value is None else b"t" if value else b"f")
    elif isinstance(value, Mapping):
        _encode_mapping(value, out, structural)
    elif isinstance(value, bytes | bytearray | memoryview):
        out.append(b"B" + _blob(bytes(value)))
    elif isinstance(value, list | tuple):
        _encode(list(value), out, structural, payload)
    else:
        _frame(out, b"V", _normalise(repr(value).encode("utf-8", "surrogatepass")))


def _encode_text(value: str, out: list[bytes], payload: bool) -> None:
    """Append a string: the hash of the bytes it wraps, else its normalised text."""
    content = _data_url_bytes(value) if value.startswith("data:") else None
    if content is None and payload:
        content = _decode_base64(value)
    if content is None:
        _frame(out, b"S", _normalise(value.encode("utf-8", "surrogatepass")))
    else:
        out.append(b"B" + _blob(content))


def _encode_mapping(value: Mapping[object, object], out: list[bytes], structural: bool) -> None:
    """Append a mapping in key order, without the volatile keys of message structure."""
    append = out.append
    append(b"{")
    frames = _KEY_FRAMES
    for key in sorted(value, key=str):
        name = key if isinstance(key, str) else str(key)
        inner = payload = False
        if structural:
            if name in _VOLATILE_KEYS:
                continue
            inner = name in _STRUCTURAL_KEYS
            payload = inner and name in _PAYLOAD_KEYS
        append(frames.get(name) or _framed_key(name))
        item = value[key]
        if item is None:
            append(b"n")
        elif not payload and isinstance(item, str) and item.isalpha():  # as in `_encode`
            raw = item.encode("utf-8", "surrogatepass")
            append(b"S%d:" % len(raw))
            append(raw)
        else:
            _encode(item, out, inner, payload)
    append(b"}")


def _step_fingerprint(model: str, step: str) -> str:
    """The identity of a call sent with an explicit step: model + step, text ignored."""
    out: list[bytes] = []
    _frame(out, b"M", model.encode("utf-8", "surrogatepass"))
    _frame(out, b"P", step.encode("utf-8", "surrogatepass"))
    digest = hashlib.blake2b(b"".join(out), digest_size=_DIGEST_SIZE, person=b"lw-step")
    return digest.hexdigest()


def fingerprint_call(
    model: str,
    messages: Sequence[Mapping[str, object]],
    attachments: Sequence[bytes | str] = (),
    *,
    step: str | None = None,
) -> str:
    """The identity of an LLM call: model, last two messages and attachment content hashes.

    Volatile tokens in the text are normalised first (see `normalise_text`), so rounds
    that differ only by a timestamp or an id get the same fingerprint. With a `step`, the
    call is identified by model + step alone: the same step is the same call.
    """
    if step:
        return _step_fingerprint(model, step)
    out: list[bytes] = []
    _frame(out, b"M", model.encode("utf-8", "surrogatepass"))
    for message in messages[-2:]:
        _encode(message, out, True, False)
    out.append(b"A")
    for attachment in attachments:
        out.append(_attachment_digest(attachment))
    digest = hashlib.blake2b(b"".join(out), digest_size=_DIGEST_SIZE, person=b"lw-call")
    return digest.hexdigest()


# --------------------------------------------------------------------------------------
# Circuits, policy, rules
# --------------------------------------------------------------------------------------


def _quoted(value: str) -> str:
    """A key component with "/", "=" and "%" escaped, so keys split unambiguously."""
    return quote(value, safe="")


@dataclass(frozen=True, slots=True)
class Circuit:
    """Where repeats are counted: an agent (or key id) plus session, plus step when given."""

    root: str
    session: str | None = None
    step: str | None = None

    def __post_init__(self) -> None:
        if not self.root:
            raise ValueError("root must name the agent or key id, got an empty string")

    @property
    def key(self) -> str:
        """The circuit's key, e.g. "billing-bot/session=run-42/step=page-3"."""
        key = _quoted(self.root)
        if self.session:
            key += "/session=" + _quoted(self.session)
        if self.step:
            key += "/step=" + _quoted(self.step)
        return key

    def __str__(self) -> str:
        return self.key


def circuit_key(key_or_agent: str, session: str | None, step: str | None = None) -> str:
    """The circuit key of an agent (or key id) and session, plus step when given."""
    return Circuit(key_or_agent, session, step).key


def _parse_number(name: str, value: object) -> float:
    """A finite number from config: numbers or numeric strings; bools are not numbers."""
    number = math.nan
    if isinstance(value, int | float) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            number = math.nan
    if not math.isfinite(number):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return number


def _parse_count(name: str, value: object) -> int:
    """A whole number from config."""
    number = _parse_number(name, value)
    if not number.is_integer():
        raise ValueError(f"{name} must be a whole number, got {value!r}")
    return int(number)


_DURATION_RX = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([smhd]?)\s*", re.IGNORECASE)
_UNIT_SECONDS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86_400.0}


def _parse_duration(name: str, value: object) -> float:
    """Seconds from config: a number, or text such as "90", "30s", "10m", "24h", "1d"."""
    if isinstance(value, str):
        match = _DURATION_RX.fullmatch(value)
        if match is None:
            raise ValueError(f"{name} must be seconds or a duration like 10m or 24h, got {value!r}")
        return float(match.group(1)) * _UNIT_SECONDS[match.group(2).lower()]
    return _parse_number(name, value)


@dataclass(frozen=True, slots=True)
class CallLoopPolicy:
    """How many identical calls a circuit may send per window, and how long it then pauses."""

    max_repeats: int = 5
    window_seconds: float = 60.0
    pause_seconds: float = 300.0

    def __post_init__(self) -> None:
        repeats = self.max_repeats
        if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
            raise ValueError(
                f"max_repeats must be a whole number, 1 or more (e.g. 5), got {repeats!r}"
            )
        if not (math.isfinite(self.window_seconds) and self.window_seconds > 0):
            raise ValueError(
                "window_seconds must be a finite number of seconds above 0 (e.g. 60), "
                f"got {self.window_seconds!r}"
            )
        if not (math.isfinite(self.pause_seconds) and self.pause_seconds >= 0):
            raise ValueError(
                "pause_seconds must be a finite number of seconds, 0 or more (e.g. 300), "
                f"got {self.pause_seconds!r}"
            )

    @classmethod
    def from_dict(cls, data: Mapping[str, object] | None) -> CallLoopPolicy:
        """A policy from config; None or {} gives the defaults, unknown keys are ignored."""
        default = cls()
        if not data:
            return default
        repeats = data.get("max_repeats")
        window = data.get("window_seconds")
        pause = data.get("pause_seconds")
        return cls(
            max_repeats=(
                default.max_repeats if repeats is None else _parse_count("max_repeats", repeats)
            ),
            window_seconds=(
                default.window_seconds
                if window is None
                else _parse_duration("window_seconds", window)
            ),
            pause_seconds=(
                default.pause_seconds if pause is None else _parse_duration("pause_seconds", pause)
            ),
        )


_NO_FILTERS: Mapping[str, str] = MappingProxyType({})


def _no_filters() -> Mapping[str, str]:
    """The default of a mapping field: shared, read-only and empty."""
    return _NO_FILTERS


_RULE_KEYS = frozenset({"name", "fields", "max_calls", "window_seconds", "filters", "action"})


@dataclass(frozen=True, slots=True)
class UniquenessRule:
    """At most `max_calls` calls sharing `fields` per window; then reject or pause the group.

    `filters` limits the rule to calls whose field equals the value, or starts with it
    when the value ends with "*" ("inv*"; "*" alone: any value).
    """

    name: str
    fields: tuple[str, ...]
    max_calls: int
    window_seconds: float
    filters: Mapping[str, str] = field(default_factory=_no_filters, hash=False)
    action: RuleAction = "reject"

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError(f"name must be a non-empty string, got {self.name!r}")
        fields = (self.fields,) if isinstance(self.fields, str) else tuple(self.fields)
        if not fields:
            raise ValueError(f"fields must list at least one of {', '.join(RULE_FIELDS)}")
        for name in fields:
            if name not in RULE_FIELDS:
                raise ValueError(f"fields: {name!r} is not one of {', '.join(RULE_FIELDS)}")
        if len(set(fields)) != len(fields):
            raise ValueError(f"fields must not repeat a field, got {list(fields)!r}")
        object.__setattr__(self, "fields", fields)
        limit = self.max_calls
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"max_calls must be a whole number, 1 or more, got {limit!r}")
        window = self.window_seconds
        if (
            not isinstance(window, int | float)
            or isinstance(window, bool)
            or not (MIN_RULE_WINDOW <= window <= MAX_RULE_WINDOW)
        ):
            raise ValueError(
                "window_seconds must be from 1 second to 24 hours (1-86400), "
                f"got {self.window_seconds!r}"
            )
        filters: dict[str, str] = {}
        for name, pattern in self.filters.items():
            if name not in RULE_FIELDS:
                raise ValueError(f"filters: {name!r} is not one of {', '.join(RULE_FIELDS)}")
            if not isinstance(pattern, str) or not pattern:
                raise ValueError(f"filters: {name} must be a non-empty string, got {pattern!r}")
            filters[name] = pattern
        object.__setattr__(self, "filters", MappingProxyType(filters))
        if self.action not in ("reject", "pause"):
            raise ValueError(f"action must be reject or pause, got {self.action!r}")

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> UniquenessRule:
        """A rule from config; unknown keys are errors, since a typo would drop a limit."""
        unknown = sorted(set(map(str, data)) - _RULE_KEYS)
        if unknown:
            raise ValueError(f"{unknown[0]}: unknown rule field (expected {sorted(_RULE_KEYS)})")
        for required in ("name", "fields", "max_calls", "window_seconds"):
            if data.get(required) is None:
                raise ValueError(f"{required} is required")
        raw_fields = data["fields"]
        fields = (
            (raw_fields,)
            if isinstance(raw_fields, str)
            else tuple(map(str, raw_fields))
            if isinstance(raw_fields, list | tuple)
            else ()
        )
        action = data.get("action", "reject")
        if action not in ("reject", "pause"):
            raise ValueError(f"action must be reject or pause, got {action!r}")
        return cls(
            name=_text("name", data["name"]),
            fields=fields,
            max_calls=_parse_count("max_calls", data["max_calls"]),
            window_seconds=_parse_duration("window_seconds", data["window_seconds"]),
            filters=_text_mapping("filters", data.get("filters") or {}),
            action="pause" if action == "pause" else "reject",
        )


def _text(name: str, value: object) -> str:
    """A non-empty string from config."""
    if isinstance(value, str) and value.strip():
        return value
    raise ValueError(f"{name} must be a non-empty string, got {value!r}")


def _text_mapping(name: str, value: object) -> dict[str, str]:
    """A mapping of strings from config (values are checked by the rule)."""
    if isinstance(value, Mapping):
        return {str(key): item for key, item in value.items()}
    raise ValueError(f"{name} must map field names to values, got {value!r}")


@dataclass(frozen=True, slots=True)
class LoggedCall:
    """One call from the request log, as `preview_rule` replays it."""

    at: float
    fingerprint: str
    fields: Mapping[str, str] = field(default_factory=_no_filters, hash=False)


@dataclass(frozen=True, slots=True)
class CallReceipt:
    """What `check` counted for an allowed call, so `record_outcome` can uncount it."""

    at: float
    call: tuple[str, str]
    rule_keys: tuple[tuple[str, tuple[str, ...]], ...]


@dataclass(frozen=True, slots=True)
class CallDecision:
    """The verdict on one LLM call: send it or not, why, and when to try again (seconds).

    `count` is the number of identical calls in the window with this one ("ok",
    "loop_detected"), of calls with this rule key ("duplicate_call"), or of calls the
    running pause refused so far ("loop_paused"). `receipt` (allowed calls only) goes
    back to `record_outcome`.
    """

    allowed: bool
    code: CallCode
    retry_after: float
    count: int
    circuit: str
    message: str
    rule: str | None = None
    receipt: CallReceipt | None = None


@dataclass(frozen=True, slots=True)
class PausedCircuit:
    """A paused circuit or rule group for status commands and the dashboard.

    `reason` is "loop_detected" or "rule:NAME"; `count` is how many calls the pause has
    refused so far, the one that opened it included.
    """

    circuit: str
    remaining: float
    reason: str
    count: int


def is_provider_failure(status: int | None, error: str | None = None) -> bool:
    """True for outcomes that are not the caller's doing: 408, 429, 5xx, no answer at all."""
    if status is None:
        return error is not None
    return status in (408, 429) or status >= 500


# --------------------------------------------------------------------------------------
# Call identities, rule keys and verdicts: pure, and shared with the stateful call stores
# (gateway/calls/), so that every backend answers exactly as the guard does
# --------------------------------------------------------------------------------------

RuleKey = tuple[str, ...]
"""A uniqueness rule's key for a call: the call's values of the rule's fields, in order."""


def call_identity(fingerprint: str, fields: Mapping[str, str]) -> str:
    """What makes two calls the same: the fingerprint, or model + step when a step is sent."""
    step = fields.get("step")
    return _step_fingerprint(fields.get("model", ""), step) if step else fingerprint


def rules_by_name(rules: Iterable[UniquenessRule]) -> dict[str, UniquenessRule]:
    """The rules by name, in order; a name used twice is a ValueError (one would be lost)."""
    named: dict[str, UniquenessRule] = {}
    for rule in rules:
        if rule.name in named:
            raise ValueError(f"rules: the name {rule.name!r} is used twice")
        named[rule.name] = rule
    return named


def _field_value(name: str, fingerprint: str, fields: Mapping[str, str]) -> str | None:
    """A call's value for a rule field; "prompt" falls back to the fingerprint."""
    value = fields.get(name)
    if value:
        return value
    if name == "prompt":
        return fingerprint or None
    return None


def rule_key(rule: UniquenessRule, fingerprint: str, fields: Mapping[str, str]) -> RuleKey | None:
    """The rule's key for a call (its field values), or None when the rule does not apply."""
    for name, pattern in rule.filters.items():
        value = _field_value(name, fingerprint, fields)
        if value is None:
            return None
        if pattern.endswith("*"):
            if not value.startswith(pattern[:-1]):
                return None
        elif value != pattern:
            return None
    values: list[str] = []
    for name in rule.fields:
        value = _field_value(name, fingerprint, fields)
        if value is None:
            return None
        values.append(value)
    return tuple(values)


def rule_group(rule: UniquenessRule, key: RuleKey) -> str:
    """The group a "pause" rule pauses ("rule=NAME/field=value"): the key without the prompt."""
    parts = [f"rule={_quoted(rule.name)}"]
    parts.extend(
        f"{name}={_quoted(value)}"
        for name, value in zip(rule.fields, key, strict=True)
        if name != "prompt"
    )
    return "/".join(parts)


def seconds_text(value: float) -> str:
    """Seconds for a message: whole seconds, rounded up ("many" when there is no end)."""
    return str(math.ceil(value)) if math.isfinite(value) else "many"


def _refusal(
    code: CallCode, circuit: str, count: int, retry_after: float, message: str, *, rule: str | None
) -> CallDecision:
    """A refused call's verdict: never counted, so without a receipt."""
    return CallDecision(
        allowed=False,
        code=code,
        retry_after=retry_after,
        count=count,
        circuit=circuit,
        message=message,
        rule=rule,
    )


def paused_verdict(circuit: str, remaining: float, count: int, rule: str | None) -> CallDecision:
    """A call refused because its circuit (rule None) or its rule group is paused."""
    if rule is None:
        message = MSG_LOOP_PAUSED.format(circuit=circuit, seconds=seconds_text(remaining))
    else:
        message = MSG_RULE_PAUSED.format(rule=rule, seconds=seconds_text(remaining))
    return _refusal("loop_paused", circuit, count, remaining, message, rule=rule)


def loop_verdict(circuit: str, count: int, pause: float) -> CallDecision:
    """The call that repeats too often: refused, and its circuit is paused for `pause`."""
    message = MSG_LOOP_DETECTED.format(circuit=circuit, seconds=seconds_text(pause))
    return _refusal("loop_detected", circuit, count, pause, message, rule=None)


def duplicate_verdict(
    circuit: str, rule: UniquenessRule, count: int, retry_after: float
) -> CallDecision:
    """A call over a rule's limit ("pause" rules: `retry_after` is the pause)."""
    template = MSG_DUPLICATE_PAUSED if rule.action == "pause" else MSG_DUPLICATE
    message = template.format(
        rule=rule.name,
        limit=rule.max_calls,
        window=f"{rule.window_seconds:g}",
        seconds=seconds_text(retry_after),
    )
    return _refusal("duplicate_call", circuit, count, retry_after, message, rule=rule.name)


def allowed_verdict(
    circuit: str,
    identity: str,
    count: int,
    at: float,
    rule_keys: tuple[tuple[str, RuleKey], ...],
) -> CallDecision:
    """An allowed, counted call, with the receipt that lets a provider failure uncount it."""
    return CallDecision(
        allowed=True,
        code="ok",
        retry_after=0.0,
        count=count,
        circuit=circuit,
        message="",
        receipt=CallReceipt(at=at, call=(circuit, identity), rule_keys=rule_keys),
    )


# --------------------------------------------------------------------------------------
# Bookkeeping
# --------------------------------------------------------------------------------------

NEVER = -math.inf
"""The fresh start of a hold that never was reopened: every counted call is live."""
# Entries whose last event left the window, freed per call (n idle entries: n/4 calls).
_SWEEP_PER_CALL = 4
# Tables are replaced once they shrink to a quarter of their peak (dicts never shrink),
# if that peak was at least this big (a small table gives back nothing worth the work).
_REBUILD_MIN = 1024
# Entries of a replaced table moved over (or dropped, when expired) per call.
_MOVE_PER_CALL = 4
# A key holds at most its limit of event times (refused calls are not recorded). Up to
# this limit they are a list (dropping the oldest shifts a few pointers); above it a
# deque, so that a rule allowing thousands of calls per window stays O(1) per call.
_LIST_MAX_LIMIT = 64

_Times = list[float] | deque[float]


def _list_times(first: float) -> _Times:
    """Event times for a small limit: a list."""
    return [first]


def _deque_times(first: float) -> _Times:
    """Event times for a large limit: a deque, O(1) at both ends."""
    return deque((first,))


class _Windows:
    """Event times per key in one sliding window; LRU-ordered, swept and capped.

    Python dicts never give memory back, so a table that has shrunk to a quarter of its
    peak is replaced, without a stall (copying costs about a microsecond per entry, 20 ms
    for 25,000): it becomes `_draining`, all of it less recently used than `_table`, and
    is emptied a few entries per call, its live entries moving to the front of the new
    table in order and its expired ones dropped, then let go with the arrays sized for
    its peak. guards/bot_loop.py replaces its pair table the same way.
    """

    __slots__ = ("_cap", "_draining", "_new_times", "_peak", "_table", "_window")

    def __init__(self, window: float, cap: int, limit: int) -> None:
        self._window = window
        self._cap = cap
        self._new_times = _list_times if limit <= _LIST_MAX_LIMIT else _deque_times
        # The number of entries held at the peak since the table was last replaced.
        self._peak = 0
        # Ordered by last event: `now` never goes back, so the front expires first.
        self._table: OrderedDict[tuple[str, ...], _Times] = OrderedDict()
        self._draining: OrderedDict[tuple[str, ...], _Times] | None = None

    def __len__(self) -> int:
        draining = self._draining
        return len(self._table) + (len(draining) if draining else 0)

    def _in_draining(
        self, key: tuple[str, ...]
    ) -> tuple[OrderedDict[tuple[str, ...], _Times], _Times] | None:
        """The key's event times in the draining table, and that table, if it is there."""
        draining = self._draining
        times = None if draining is None else draining.get(key)
        return None if draining is None or times is None else (draining, times)

    def live(self, key: tuple[str, ...], now: float, floor: float) -> Sequence[float]:
        """The times in the window (an event at t counts in [t, t + window)), after floor."""
        table = self._table
        times = table.get(key)
        if times is None:
            found = self._in_draining(key)
            if found is None:
                return ()
            table, times = found
        window = self._window
        while times and (times[0] + window <= now or times[0] < floor):
            del times[0]
        if not times:
            del table[key]
        return times

    def add(self, key: tuple[str, ...], now: float) -> int:
        """Record one event at `now`; the number of live events of the key after it."""
        table = self._table
        times = table.get(key)
        if times is not None:
            times.append(now)
            table.move_to_end(key)
            return len(times)
        draining = self._draining
        times = None if draining is None else draining.pop(key, None)
        if times is not None:  # used again: now the most recently used entry of all
            times.append(now)
            table[key] = times
            return len(times)
        table[key] = self._new_times(now)
        size = len(table) + (len(draining) if draining else 0)
        if size > self._cap:
            (draining or table).popitem(last=False)
            size -= 1
        self._peak = max(self._peak, size)
        return 1

    def discard(self, key: tuple[str, ...], at: float) -> bool:
        """Forget one event recorded at `at`, if it is still held."""
        table = self._table
        times = table.get(key)
        if times is None:
            found = self._in_draining(key)
            if found is None:
                return False
            table, times = found
        index = bisect_left(times, at)
        if index == len(times) or times[index] != at:
            return False
        del times[index]
        if not times:
            del table[key]
        return True

    def sweep(self, now: float) -> None:
        """Free a few entries whose last event left the window; replace a shrunken table.

        The front (least recently used) entry of all is the first to expire. A draining
        table gives up its most recently used entries first: the live ones go to the front
        of the new table, which keeps the order of the whole.
        """
        window = self._window
        draining = self._draining
        if draining is not None:
            table = self._table
            for _ in range(_MOVE_PER_CALL):
                if not draining:
                    break
                key, times = draining.popitem()
                if times[-1] + window > now:
                    table[key] = times
                    table.move_to_end(key, last=False)
        front = draining or self._table
        for _ in range(_SWEEP_PER_CALL):
            if not front:
                break
            key = next(iter(front))
            if front[key][-1] + window > now:
                break
            del front[key]
        if draining is not None and not draining:
            self._draining = None  # let go of it and its arrays sized for the peak
        if self._draining is None and self._peak >= _REBUILD_MIN:
            size = len(self._table)
            if size * 4 <= self._peak:
                self._draining, self._table = self._table, OrderedDict()
                self._peak = size


@dataclass(frozen=True, slots=True)
class Hold:
    """A pause and/or fresh start on a circuit or rule group (events before are forgotten).

    `count` is the number of calls the running pause has refused, the one that opened it
    included; `expires_at` is when the hold changes no decision any more.
    """

    paused_until: float
    fresh_from: float
    expires_at: float
    reason: str
    rule: str | None
    count: int


def pause_hold(
    earlier: Hold | None, now: float, pause: float, *, reason: str, rule: str | None
) -> Hold:
    """A pause from now; an earlier reopen's fresh start (and its lifetime) carries over."""
    if earlier is None:
        return Hold(now + pause, NEVER, now + pause, reason, rule, 1)
    expires = max(earlier.expires_at, now + pause)
    return Hold(now + pause, earlier.fresh_from, expires, reason, rule, 1)


def reopen_hold(earlier: Hold | None, now: float, window: float) -> Hold:
    """No pause, and a fresh start now that lasts as long as a counted call could."""
    reason = earlier.reason if earlier is not None else "reopened"
    rule = earlier.rule if earlier is not None else None
    return Hold(now, now, now + window, reason, rule, 0)


class _Holds:
    """Holds by key, swept by halving rebuilds (amortised O(1)) and capped."""

    __slots__ = ("_cap", "_limit", "_table")

    _MIN_LIMIT = 64

    def __init__(self, cap: int) -> None:
        self._cap = cap
        self._limit = self._MIN_LIMIT
        self._table: dict[str, Hold] = {}

    def __bool__(self) -> bool:
        return bool(self._table)

    def get(self, key: str, now: float) -> Hold | None:
        hold = self._table.get(key)
        if hold is not None and hold.expires_at <= now:
            del self._table[key]
            return None
        return hold

    def refused(self, key: str, hold: Hold) -> Hold:
        """Count one more call refused by the running pause `hold` (it keeps its place)."""
        counted = Hold(
            hold.paused_until,
            hold.fresh_from,
            hold.expires_at,
            hold.reason,
            hold.rule,
            hold.count + 1,
        )
        self._table[key] = counted
        return counted

    def put(self, key: str, hold: Hold, now: float) -> None:
        table = self._table
        table.pop(key, None)
        table[key] = hold
        if len(table) > self._limit:
            live = {name: item for name, item in table.items() if item.expires_at > now}
            if len(live) > self._cap:
                # Keep the most recently set holds: insertion order is the LRU order here.
                live = dict(list(live.items())[-self._cap :])
            self._table = live
            self._limit = max(self._MIN_LIMIT, 2 * len(live))

    def items(self) -> list[tuple[str, Hold]]:
        return list(self._table.items())


class _RuleBook:
    """One uniqueness rule and its sliding windows, by rule key."""

    __slots__ = ("rule", "windows")

    def __init__(self, rule: UniquenessRule, cap: int) -> None:
        self.rule = rule
        self.windows = _Windows(rule.window_seconds, cap, rule.max_calls)


def preview_rule(
    rule: UniquenessRule, calls: Iterable[LoggedCall], *, pause_seconds: float = 300.0
) -> int:
    """How many of these logged calls the rule alone would have refused (or paused).

    The calls are replayed in time order through a guard holding only this rule; each
    call gets a circuit of its own, so loop detection never interferes.
    """
    guard = CallLoopGuard(CallLoopPolicy(max_repeats=1, pause_seconds=pause_seconds), (rule,))
    refused = 0
    for index, call in enumerate(sorted(calls, key=_logged_at)):
        decision = guard.check(
            circuit=str(index), fingerprint=call.fingerprint, fields=call.fields, now=call.at
        )
        refused += not decision.allowed
    return refused


def _logged_at(call: LoggedCall) -> float:
    """Sort key of a logged call: its time."""
    return call.at


# --------------------------------------------------------------------------------------
# The guard
# --------------------------------------------------------------------------------------

_EMPTY_FIELDS: Mapping[str, str] = MappingProxyType({})


class CallLoopGuard:
    """Refuses repeated LLM calls per circuit and enforces uniqueness rules; thread-safe."""

    def __init__(
        self,
        policy: CallLoopPolicy | None = None,
        rules: Iterable[UniquenessRule] = (),
        *,
        clock: Callable[[], float] | None = None,
        max_circuits: int = 100_000,
    ) -> None:
        if max_circuits < 1:
            raise ValueError(f"max_circuits must be 1 or more, got {max_circuits!r}")
        self._policy = policy or CallLoopPolicy()
        self._clock = clock or time.monotonic
        self._lock = threading.Lock()
        self._calls = _Windows(self._policy.window_seconds, max_circuits, self._policy.max_repeats)
        self._books = {
            name: _RuleBook(rule, max_circuits) for name, rule in rules_by_name(rules).items()
        }
        self._circuit_holds = _Holds(max_circuits)
        self._group_holds = _Holds(max_circuits)
        self._longest_window = max(
            [self._policy.window_seconds, *(b.rule.window_seconds for b in self._books.values())]
        )

    @property
    def policy(self) -> CallLoopPolicy:
        """The policy this guard enforces."""
        return self._policy

    @property
    def rules(self) -> tuple[UniquenessRule, ...]:
        """The uniqueness rules this guard enforces, in order."""
        return tuple(book.rule for book in self._books.values())

    def __len__(self) -> int:
        """The number of (circuit, call) windows held."""
        return len(self._calls)

    def check(
        self,
        *,
        circuit: str,
        fingerprint: str,
        fields: Mapping[str, str] = _EMPTY_FIELDS,
        now: float | None = None,
    ) -> CallDecision:
        """Decide one call and, when it is allowed, count it (see `record_outcome`)."""
        identity = call_identity(fingerprint, fields)
        with self._lock:
            when = self._clock() if now is None else now
            self._calls.sweep(when)
            for book in self._books.values():
                book.windows.sweep(when)
            hold = self._circuit_holds.get(circuit, when)
            if hold is not None and hold.paused_until > when:
                hold = self._circuit_holds.refused(circuit, hold)
                return paused_verdict(circuit, hold.paused_until - when, hold.count, hold.rule)
            keyed: list[tuple[_RuleBook, RuleKey, Hold | None]] = []
            for book in self._books.values():
                key = rule_key(book.rule, fingerprint, fields)
                if key is None:
                    continue
                group_hold = None
                if self._group_holds:
                    group = rule_group(book.rule, key)
                    group_hold = self._group_holds.get(group, when)
                    if group_hold is not None and group_hold.paused_until > when:
                        group_hold = self._group_holds.refused(group, group_hold)
                        remaining = group_hold.paused_until - when
                        return paused_verdict(circuit, remaining, group_hold.count, group_hold.rule)
                keyed.append((book, key, group_hold))
            call = (circuit, identity)
            floor = NEVER if hold is None else hold.fresh_from
            repeats = len(self._calls.live(call, when, floor))
            if repeats >= self._policy.max_repeats:
                return self._open_loop_pause(circuit, repeats + 1, hold, when)
            for book, key, group_hold in keyed:
                times = book.windows.live(
                    key, when, NEVER if group_hold is None else group_hold.fresh_from
                )
                if len(times) >= book.rule.max_calls:
                    return self._refuse_duplicate(
                        circuit=circuit,
                        book=book,
                        key=key,
                        times=times,
                        earlier=group_hold,
                        now=when,
                    )
            count = self._calls.add(call, when)
            rule_keys = tuple((book.rule.name, key) for book, key, _ in keyed)
            for book, key, _ in keyed:
                book.windows.add(key, when)
            return allowed_verdict(circuit, identity, count, when, rule_keys)

    def record_outcome(
        self, decision: CallDecision, *, status: int | None = None, error: str | None = None
    ) -> bool:
        """Uncount an allowed call the provider failed (429, 408, 5xx, timeout, dropped).

        Other outcomes (success, other 4xx) stay counted: sending again a body the
        provider rejects is a loop. True when the call was uncounted.
        """
        receipt = decision.receipt
        if receipt is None or not is_provider_failure(status, error):
            return False
        with self._lock:
            removed = self._calls.discard(receipt.call, receipt.at)
            for name, key in receipt.rule_keys:
                book = self._books.get(name)
                if book is not None:
                    book.windows.discard(key, receipt.at)
            return removed

    def reopen(self, circuit: str, *, now: float | None = None) -> bool:
        """Lift the pause of a circuit (or rule group) and forget its counts so far.

        True when a running pause was lifted.
        """
        with self._lock:
            when = self._clock() if now is None else now
            is_group = circuit.startswith("rule=")
            holds = self._group_holds if is_group else self._circuit_holds
            hold = holds.get(circuit, when)
            lifted = hold is not None and hold.paused_until > when
            window = self._longest_window if is_group else self._policy.window_seconds
            holds.put(circuit, reopen_hold(hold, when, window), when)
            return lifted

    def paused(self, *, now: float | None = None) -> list[PausedCircuit]:
        """The circuits and rule groups paused now, by key."""
        with self._lock:
            when = self._clock() if now is None else now
            found = [
                PausedCircuit(
                    circuit=key,
                    remaining=hold.paused_until - when,
                    reason=hold.reason,
                    count=hold.count,
                )
                for holds in (self._circuit_holds, self._group_holds)
                for key, hold in holds.items()
                if hold.paused_until > when
            ]
        return sorted(found, key=_paused_key)

    def _open_loop_pause(
        self, circuit: str, count: int, earlier: Hold | None, now: float
    ) -> CallDecision:
        """Refuse the call that repeats too often and pause its circuit."""
        pause = self._policy.pause_seconds
        self._circuit_holds.put(
            circuit, pause_hold(earlier, now, pause, reason="loop_detected", rule=None), now
        )
        return loop_verdict(circuit, count, pause)

    def _refuse_duplicate(
        self,
        *,
        circuit: str,
        book: _RuleBook,
        key: RuleKey,
        times: Sequence[float],
        earlier: Hold | None,
        now: float,
    ) -> CallDecision:
        """Refuse a call over a rule's limit; a "pause" rule also pauses the rule's group."""
        rule = book.rule
        if rule.action == "pause":
            retry_after = self._policy.pause_seconds
            hold = pause_hold(earlier, now, retry_after, reason=f"rule:{rule.name}", rule=rule.name)
            self._group_holds.put(rule_group(rule, key), hold, now)
        else:
            retry_after = times[0] + rule.window_seconds - now
        return duplicate_verdict(circuit, rule, len(times) + 1, retry_after)


def _paused_key(paused: PausedCircuit) -> str:
    """Sort key of a paused entry: its key."""
    return paused.circuit
