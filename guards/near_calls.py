"""Near-duplicate tool calls: results that differ only in ids, arguments only a little.

LoopGuard compares each tool call with the one before it. Two questions it asks are
answered here, cheaply and on bounded input.

Which result fields are volatile (`blank_volatile_fields`): in a result that is a dict or
list, or text or bytes that parse as a JSON object or array, the value of every field
named as an identity or a time is replaced by one placeholder, whatever its length:
`id`, `*_id`, `*Id`, `*_ids`, `uuid`, `guid`, `ts`, `*_ts`, `timestamp`, `date`, `*_date`,
`*_at` (`sent_at`), `etag`, `nonce`, and any name with the word `created`, `updated` or
`modified`. A dict under such a name is searched further; any other value there is
blanked. So `{"ok": true, "messageId": 4521}` and `…4522}` are the same result, while a
changed status or text still differs. The price: a tool whose results differ only in
such fields (a queue handing out jobs with equal bodies) looks stuck; report progress
in another field or call `mark_progress`.

Whether two calls of one tool are nearly the same call (`near_args`), given their
canonical arguments (`canonical_args`):
- the same keys, except keys holding a flag (true, false or null) that only one of them
  has: a flag added or dropped;
- under a target key, equal values: a key with a word such as path, file, dir, cwd, url,
  name, id, key, session, chat, channel, thread, to, target, recipient, user, email,
  repo, branch, table, host, source or dest (`file_path`, `sessionKey`, `chat_id`).
  Another file or another session is another call, so writing ten files that each
  answer `ok` is ten different calls;
- every other value equal or changed slightly: a number for a number (a counter), a
  flag for a flag, text for similar text, a dict for a dict by these same rules, a list
  for a list of the same length item by item;
- two texts are similar when, in their first 512 characters: the same identity tokens
  appear (URLs, paths, e-mail addresses and @names, dotted names such as `a.txt` or
  `example.com`, and words mixing letters and digits such as `file1`, `v2`, `Q3`);
  numbers (a counter `3`, a slice `[:500]`, `10s`, a date) and command-line flags (`-v`,
  `--force`) are ignored; and the remaining words are the same set when the shorter
  text has fewer than 5 of them (`rm -rf build` and `rm -rf dist` are different calls),
  else at least half of all the words are shared (Jaccard >= 0.5): a rewording.
Arguments with canonical text over 32 KiB, or a dict of more than 64 keys, are near only
when equal, and a comparison looks at no more than 256 values: it stays bounded.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Hashable
from typing import Final

_PLACEHOLDER: Final = "\x00"
# Words whose presence in a result field's name makes it volatile; then the words that
# make it volatile only as the last word ("message_id", but not "identity").
_VOLATILE_WORDS: Final = frozenset({"created", "updated", "modified"})
_VOLATILE_LAST_WORDS: Final = frozenset(
    {"id", "ids", "uuid", "guid", "ts", "timestamp", "date", "etag", "nonce"}
)
# fmt: off
_TARGET_WORDS: Final = frozenset({
    "account", "address", "bucket", "branch", "channel", "chat", "cwd", "database", "db",
    "dest", "destination", "dir", "directory", "dirs", "email", "file", "filename",
    "filepath", "files", "folder", "guid", "host", "hostname", "href", "id", "ids", "issue",
    "key", "link", "name", "names", "path", "paths", "peer", "recipient", "recipients", "ref",
    "repo", "repository", "room", "session", "source", "src", "table", "target", "thread",
    "ticket", "to", "topic", "uri", "url", "urls", "user", "username", "uuid", "workdir",
})
# fmt: on
_WORD_RE: Final = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")
_TEXT_PREFIX: Final = 512
_MAX_KEYS: Final = 64
_MAX_VALUES: Final = 256
_MAX_ARGS_TEXT: Final = 32 * 1024
_SHORT_TEXT_WORDS: Final = 5
_MAX_UNIT_LETTERS: Final = 3  # "10s", "500ms", "2024-01-01T10" are numbers
# A URL, else a run of characters between separators (spaces, quotes, brackets, operators).
_CHUNK_RE: Final = re.compile(r"""[A-Za-z][\w+.-]*://[^\s'"`<>]+|[^\s'"`()<>\[\]{},;:=#|&*!?$^]+""")
_FLAG_RE: Final = re.compile(r"--?[^\W\d_]")
_DOTTED_RE: Final = re.compile(r"\w\.\w")
_JSON_START_RE: Final = re.compile(r"\s*[\[{]")
# A JSON key that may be volatile (some that are not match too): parse only if one does.
_VOLATILE_KEY_HINT_RE: Final = re.compile(
    r'(?:id|ids|uuid|guid|ts|timestamp|date|etag|nonce|at)"\s*:|created|updated|modified',
    re.IGNORECASE,
)


def _words(name: str) -> list[str]:
    """The lower-case words of a snake_case, camelCase or kebab-case name."""
    return [word.lower() for word in _WORD_RE.findall(name)]


@functools.lru_cache(maxsize=1024)
def is_volatile_field(name: str) -> bool:
    """True when a result field of this name is an identity or a time, fresh every call."""
    if name.lower() == "etag":
        return True
    words = _words(name)
    if not words:
        return False
    last = words[-1]
    return (
        last in _VOLATILE_LAST_WORDS
        or (last == "at" and len(words) > 1)
        or not _VOLATILE_WORDS.isdisjoint(words)
    )


@functools.lru_cache(maxsize=1024)
def is_target_key(name: str) -> bool:
    """True when an argument of this name says what the call acts on (a path, a session)."""
    return not _TARGET_WORDS.isdisjoint(_words(name))


def _blank(value: object) -> object:
    """A parsed JSON value with the value of every volatile field replaced."""
    if type(value) is dict:
        return {
            key: _PLACEHOLDER if type(item) is not dict and is_volatile_field(key) else _blank(item)
            for key, item in value.items()
        }
    if type(value) is list:
        return [_blank(item) for item in value]
    return value


def blank_volatile_fields(text: str) -> str:
    """`text` with its volatile fields blanked if it is a JSON object or array, else as is."""
    if not _JSON_START_RE.match(text) or not _VOLATILE_KEY_HINT_RE.search(text):
        return text
    try:
        return _json_text(_blank(json.loads(text)))
    except (ValueError, RecursionError):  # not JSON after all, or absurdly deep
        return text


@functools.lru_cache(maxsize=64)
def _text_shape(prefix: str) -> tuple[frozenset[str], frozenset[str]]:
    """The identity tokens and the plain lower-case words of a text (numbers, flags dropped)."""
    identities: set[str] = set()
    words: set[str] = set()
    for chunk in _CHUNK_RE.findall(prefix):
        if "/" in chunk or "\\" in chunk or "@" in chunk:
            if any(c.isalpha() for c in chunk):  # a URL, a path, an address; not "1/2"
                identities.add(chunk)
            continue
        if _FLAG_RE.match(chunk):
            continue
        core = chunk.strip(".+-")
        if not core:
            continue
        if core[0].isdigit():
            # A number (a counter, a size, a time, a date) unless it is a hex id.
            if sum(c.isalpha() for c in core) > _MAX_UNIT_LETTERS:
                identities.add(core)
        elif any(c.isdigit() for c in core) or _DOTTED_RE.search(core):
            identities.add(core)  # "file1", "Q3", "a.txt", "example.com"
        else:
            words.add(core.lower())
    return frozenset(identities), frozenset(words)


def near_text(a: str, b: str) -> bool:
    """True when two texts differ only by counters, flags or rewording (module docstring)."""
    if a == b:
        return True
    identities_a, words_a = _text_shape(a[:_TEXT_PREFIX])
    identities_b, words_b = _text_shape(b[:_TEXT_PREFIX])
    if identities_a != identities_b:
        return False
    if min(len(words_a), len(words_b)) < _SHORT_TEXT_WORDS:
        return words_a == words_b
    return 2 * len(words_a & words_b) >= len(words_a | words_b)


def _is_flag(value: object) -> bool:
    return value is None or type(value) is bool


class _Budget:
    """How many more values one comparison may look at: nested arguments stay bounded."""

    __slots__ = ("left",)

    def __init__(self) -> None:
        self.left = _MAX_VALUES

    def spend(self) -> bool:
        self.left -= 1
        return self.left >= 0


def _near_value(a: object, b: object, budget: _Budget) -> bool:
    """True when two values of one non-target argument differ only slightly."""
    if not budget.spend():
        return False
    if a == b and type(a) is type(b):
        return True
    if isinstance(a, str) and isinstance(b, str):
        return near_text(a, b)
    if _is_flag(a) or _is_flag(b):
        return _is_flag(a) and _is_flag(b)
    if isinstance(a, int | float) and isinstance(b, int | float):
        return True  # a counter
    if isinstance(a, dict) and isinstance(b, dict):
        return _near_mapping(a, b, budget)
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return all(_near_value(x, y, budget) for x, y in zip(a, b, strict=True))
    return False


def _near_mapping(a: dict[str, object], b: dict[str, object], budget: _Budget) -> bool:
    """True when two argument mappings are nearly the same (module docstring)."""
    if len(a) > _MAX_KEYS or len(b) > _MAX_KEYS:
        return False
    for key in a.keys() ^ b.keys():
        if not _is_flag(a[key] if key in a else b[key]):
            return False
    for key, value in a.items():
        if key not in b:
            continue
        other = b[key]
        if value == other and type(value) is type(other):
            continue
        if is_target_key(key) or not _near_value(value, other, budget):
            return False
    return True


# Built once: json.dumps with options builds a new encoder on every call.
_json_text: Final = json.JSONEncoder(
    ensure_ascii=False, sort_keys=True, separators=(",", ":")
).encode


@functools.lru_cache(maxsize=8)
def _parsed_args(text: str) -> dict[str, object] | None:
    """Canonical JSON arguments as a dict (anything else under the key ""), None if not JSON.

    Remembered: a call's arguments are compared with the call before and then the next.
    """
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return value if type(value) is dict else {"": value}


def _as_mapping(canonical: Hashable) -> dict[str, object] | None:
    """Canonical arguments as a dict; None when too big to compare."""
    if isinstance(canonical, frozenset):
        return dict(canonical)
    if not isinstance(canonical, str) or len(canonical) > _MAX_ARGS_TEXT:
        return None
    return _parsed_args(canonical)


def _targets_in(flat: frozenset[tuple[str, object]], text: str) -> bool:
    """False when a target of flat arguments is surely not in canonical JSON arguments."""
    for key, value in flat:
        if is_target_key(key) and f"{_json_text(key)}:{_json_text(value)}" not in text:
            return False
    return True


def near_args(a: Hashable, b: Hashable) -> bool:
    """True when two canonical argument sets of one tool are nearly the same call.

    Args:
        a: `canonical_args` of the earlier call.
        b: `canonical_args` of the later call.
    """
    if a == b:
        return True
    # A changed target is the usual answer: found before any JSON is parsed.
    if isinstance(a, frozenset):
        if isinstance(b, frozenset):
            for key, _ in a ^ b:
                if is_target_key(key):
                    return False
        elif isinstance(b, str) and not _targets_in(a, b):
            return False
    elif isinstance(a, str) and isinstance(b, frozenset) and not _targets_in(b, a):
        return False
    mapping_a, mapping_b = _as_mapping(a), _as_mapping(b)
    if mapping_a is None or mapping_b is None:
        return False
    return _near_mapping(mapping_a, mapping_b, _Budget())
