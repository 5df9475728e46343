"""Per-turn tool-call guard: stop an agent that calls the same tool forever.

Six signals, checked before a call runs and again after it is recorded:
- per-tool counts against the thresholds of the tool's bucket (idempotent or mutating);
- the no-progress streak: the trailing run of identical fingerprints (tool, canonical
  arguments, the whole result), kept as a counter plus the last fingerprint;
- the similar run: the trailing run of calls of one tool, each nearly the same call as
  the one before (`guards.near_calls.near_args`: the same targets such as paths and
  sessions, with only counters, flags or the wording of text changed) and with the same
  result after normalisation. WARN at `no_progress_similar_warn` (4), HALT at
  `no_progress_similar_halt` (10). Another tool's call, a changed result, a changed
  target or `mark_progress` ends it. A run of identical calls only is left to the
  no-progress streak and its thresholds; the similar run counts once one call in it
  differs. Each call is compared with the one before only, on bounded text, so this
  stays O(1);
- the failure streak: per tool, its calls that failed since its last success, whatever
  their arguments; WARN at `failure_warn` (3), HALT at `failure_halt` (8). A success of
  that tool or `mark_progress` ends it (so does `reset_turn`); another tool's calls in
  between do not;
- short cycles: the same 2-4 fingerprints repeating, kept as one match counter per
  period over a ring of the last four fingerprints;
- the turn timer (`max_time_per_turn`).

Results are compared after their volatile fields are blanked (in a JSON object or
array, or text or bytes holding one: the value of `id`, `*_id`, `*Id`, `ts`,
`timestamp`, `date`, `*_at`, `created*`, `updated*`, `etag`…, whatever its length; see
`guards.near_calls`) and after the volatile-token normalisation of `fingerprint_call`
(dates, times, UUIDs, hex and provider ids, numbers of 5+ digits): identical
`send_message` calls whose results differ only by a fresh message id, even 4521 and
4522, are a no-progress streak, while a changed status is progress. A counter whose only
change is a number of 5+ digits (bytes downloaded) or an id field therefore looks stuck:
report progress in words as well, or call `mark_progress`.

A count BLOCK or HALT only happens when the run this call would extend is stuck: the
streak at least `no_progress_warn`, or the similar run at least
`no_progress_similar_warn`; a busy tool whose results keep changing, or whose calls
change their targets, gets WARN at most.

Decisions the design left open:
- The turn timer starts at the first check or record after construction or
  `reset_turn()`, so a guard built long before its first turn does not start out late.
- A pre-check that answers BLOCK counts the blocked call itself (in the tool's count,
  and in the streak as a repeat of that call's last fingerprint), so an agent that just
  skips the call and retries escalates to HALT. Recording the block result (the dict
  `apply_decision` returns, marked `loop_blocked`) afterwards is accepted and not counted
  twice; recorded without such a pre-check, it is counted. Either way `record()` answers
  BLOCK with code `blocked` (the call did not run; the next pre-check decides).
- A failure and a success with the same text are different results.
- Severity picks the decision; among equals: time, then no-progress, then the similar
  run, then failure, then cycle, then count.
- A pre-check of a call nearly the same as the last one sees the similar run it would
  extend (its result is not known yet), as a pre-check of an identical call sees the
  streak; a blocked call nearly the same as the last one counts as a repeat of that
  one's result under its own arguments, so retrying it reworded escalates to HALT.
- A failed call is one recorded with `success=False`; a blocked call is none (it did
  not run), so it neither extends nor ends a failure streak.
- `record()` reuses the canonical arguments that the `check()` just before it computed
  for the same tool and the same args object, so arguments are canonicalised once per
  call; args changed in place between the two record the call that was checked.
- Results are hashed with Python's keyed SipHash (see `result_hash`), not blake2b: it
  covers the whole result as well and costs a fraction, which the 5 us budget needs.
  Normalising costs more than a whole call, so it only runs when a call made in the
  last four returns a result that differs from its earlier one as recorded.
- WARN annotates dict and string results only; other results are returned unchanged.
- Results count as equal when their JSON with sorted keys is, except that 1 and 1.0
  differ there (a result that changed type changed); in arguments they are equal.
- Non-JSON values are fingerprinted by `repr`; an object whose `repr` fails or recurses
  too deep gets its identity, so it can never build a streak (fail open, not closed).
- At most 1,024 tool names are counted separately per turn (counts and failure streaks);
  further names share one count.
- `get_stats()` is a read-only mapping as well as an object: PraisonAI's `get_stats()`
  returns a dict (`stats["turn_elapsed"]`, `stats["tool_counts"]`, `stats["config"]`),
  so code written for theirs reads ours.
- `from_dict` treats a key whose value is None as absent and accepts numeric strings,
  because admin commands and environment variables deliver text.
"""

from __future__ import annotations

import enum
import functools
import json
import math
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Iterator, Mapping
from dataclasses import dataclass, fields, replace
from types import MappingProxyType
from typing import Any, Final, Literal

from guards.call_loop import normalise_text
from guards.near_calls import blank_volatile_fields, near_args

Bucket = Literal["idempotent", "mutating"]

# Tools known to be safe to repeat whose names carry no read verb.
# fmt: off
IDEMPOTENT_TOOLS: Final = frozenset({
    "date", "df", "du", "env", "free", "git_blame", "git_branch", "git_log", "git_remote",
    "head", "help", "hostname", "man", "printenv", "ps", "pwd", "sql_select", "tail", "top",
    "uname", "uptime", "which", "whoami",
})
# fmt: on

# Tools known to change state although their names carry a read verb.
MUTATING_TOOLS: Final = frozenset({"check_in", "check_out"})

# A name with any of these words is mutating, even if it also has a read verb.
# fmt: off
MUTATING_VERBS: Final = frozenset({
    "ack", "acknowledge", "add", "append", "apply", "approve", "archive", "assign", "ban",
    "buy", "call", "cancel", "charge", "checkout", "chmod", "chown", "clear", "clone",
    "close", "commit", "confirm", "copy", "cp", "create", "decrement", "del", "delete",
    "deploy", "destroy", "disable", "download", "drop", "edit", "enable", "enqueue",
    "erase", "eval", "exec", "execute", "flush", "forget", "grant", "import", "increment",
    "insert", "install", "invite", "invoke", "kick", "kill", "launch", "login", "logout",
    "merge", "migrate", "mkdir", "modify", "mount", "move", "mute", "mv", "notify",
    "overwrite", "patch", "pay", "pin", "post", "provision", "publish", "pull", "purchase",
    "purge", "push", "put", "rebase", "reboot", "refund", "register", "reject", "remove",
    "rename", "replace", "reply", "reset", "restart", "restore", "revert", "revoke", "rm",
    "rmdir", "rollback", "rotate", "run", "save", "schedule", "sell", "send", "set",
    "shutdown", "sign", "spawn", "start", "stop", "store", "submit", "subscribe", "sync",
    "terminate", "touch", "transfer", "trigger", "truncate", "unban", "uninstall", "unlink",
    "unlock", "unmount", "unmute", "unpin", "unset", "unsubscribe", "update", "upload",
    "upsert", "vote", "wipe", "write",
})
# fmt: on

# A name with one of these words and no mutating verb is idempotent.
# fmt: off
READ_VERBS: Final = frozenset({
    "browse", "cat", "check", "compare", "count", "describe", "diff", "exists", "fetch",
    "find", "get", "glob", "grep", "info", "inspect", "list", "look", "lookup", "ls",
    "monitor", "peek", "ping", "poll", "preview", "query", "read", "recall", "retrieve",
    "scan", "search", "show", "sleep", "stat", "status", "verify", "view", "wait", "watch",
})
# fmt: on

# Periods of the cycle rule; the ring of recent fingerprints is as long as the longest.
_PERIODS: Final = (2, 3, 4)
_LONGEST_PERIOD: Final = max(_PERIODS)
_MAX_TRACKED_TOOLS: Final = 1024
_OTHER_TOOLS: Final = "\x00other-tools"
_BLOCKED_RESULT: Final = "loop-blocked"  # not an int: no result hash equals it
_WORD_RE: Final = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")
_TRUE_WORDS: Final = frozenset({"true", "1", "yes", "on"})
_FALSE_WORDS: Final = frozenset({"false", "0", "no", "off"})
# Flat dicts whose values are all of these types are keyed by their items (no JSON): the
# common case of model-made arguments. bool and float are left out because True == 1
# and 1.0 needs normalising first.
_PLAIN_ARG_TYPES: Final[frozenset[type]] = frozenset({str, int, type(None)})
# JSON leaves that normalising leaves as they are.
_PLAIN_JSON_TYPES: Final[frozenset[type]] = frozenset({str, int, bool, type(None)})


class GuardAction(enum.Enum):
    """What the caller does with a tool call: run it, run it with a warning, skip it, stop."""

    ALLOW = "allow"
    WARN = "warn"
    BLOCK = "block"
    HALT = "halt"


_INT_FIELDS: Final = (
    "idempotent_warn_threshold",
    "idempotent_block_threshold",
    "idempotent_halt_threshold",
    "mutating_warn_threshold",
    "mutating_block_threshold",
    "mutating_halt_threshold",
    "no_progress_warn",
    "no_progress_halt",
    "cycle_warn_laps",
    "cycle_halt_laps",
    "failure_warn",
    "failure_halt",
    "no_progress_similar_warn",
    "no_progress_similar_halt",
)
_ORDERED_FIELDS: Final = (
    ("idempotent_warn_threshold", "idempotent_block_threshold"),
    ("idempotent_block_threshold", "idempotent_halt_threshold"),
    ("mutating_warn_threshold", "mutating_block_threshold"),
    ("mutating_block_threshold", "mutating_halt_threshold"),
    ("no_progress_warn", "no_progress_halt"),
    ("cycle_warn_laps", "cycle_halt_laps"),
    ("failure_warn", "failure_halt"),
    ("no_progress_similar_warn", "no_progress_similar_halt"),
)


@dataclass(frozen=True, slots=True)
class LoopGuardConfig:
    """Thresholds of the tool-call guard: counts, stuck and failure streaks, cycles, time."""

    enabled: bool = True
    idempotent_warn_threshold: int = 5
    idempotent_block_threshold: int = 8
    idempotent_halt_threshold: int = 12
    mutating_warn_threshold: int = 3
    mutating_block_threshold: int = 5
    mutating_halt_threshold: int = 7
    max_time_per_turn: float = 120.0
    no_progress_warn: int = 4
    no_progress_halt: int = 8
    cycle_warn_laps: int = 3
    cycle_halt_laps: int = 5
    failure_warn: int = 3
    failure_halt: int = 8
    no_progress_similar_warn: int = 4
    no_progress_similar_halt: int = 10

    def __post_init__(self) -> None:
        if type(self.enabled) is not bool:
            raise ValueError(f"enabled must be true or false, got {self.enabled!r}")
        for name in _INT_FIELDS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a whole number of 1 or more, got {value!r}")
        if self.cycle_warn_laps < 2:
            # One lap of A, B is just two different calls, not a cycle.
            raise ValueError(f"cycle_warn_laps must be 2 or more, got {self.cycle_warn_laps!r}")
        for low, high in _ORDERED_FIELDS:
            if getattr(self, low) > getattr(self, high):
                raise ValueError(
                    f"{high} must be at least {low} ({getattr(self, low)}), "
                    f"got {getattr(self, high)!r}"
                )
        seconds = self.max_time_per_turn
        if (
            isinstance(seconds, bool)
            or not isinstance(seconds, int | float)
            or not (math.isfinite(seconds) and seconds > 0)
        ):
            raise ValueError(
                "max_time_per_turn must be a finite number of seconds above 0 (e.g. 120), "
                f"got {seconds!r}"
            )

    @classmethod
    def from_dict(cls, data: Mapping[str, object] | None) -> LoopGuardConfig:
        """Build a config from YAML/admin input: unknown keys ignored, bad values named."""
        if not data:
            return cls()
        changes: dict[str, Any] = {}
        for spec in fields(cls):
            value = data.get(spec.name)
            if value is None:
                continue
            if spec.name == "enabled":
                changes[spec.name] = _parse_bool(spec.name, value)
            elif spec.name == "max_time_per_turn":
                changes[spec.name] = _parse_float(spec.name, value)
            else:
                changes[spec.name] = _parse_int(spec.name, value)
        return replace(cls(), **changes)


def _parse_bool(name: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str | int):
        word = str(value).strip().lower()
        if word in _TRUE_WORDS:
            return True
        if word in _FALSE_WORDS:
            return False
    raise ValueError(f"{name} must be true or false, got {value!r}")


def _parse_int(name: str, value: object) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    raise ValueError(f"{name} must be a whole number, got {value!r}")


def _parse_float(name: str, value: object) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            pass
    raise ValueError(f"{name} must be a number of seconds, got {value!r}")


@dataclass(frozen=True, slots=True)
class LoopGuardDecision:
    """The guard's answer for one call; `metadata` holds the counts behind it."""

    action: GuardAction
    code: str
    message: str
    metadata: Mapping[str, object]


# The frozen __init__ sets each field through object.__setattr__; the slot descriptors
# do the same in about half the time, and two decisions are built per tool call.
_new_object: Final = object.__new__
_set_action: Final = vars(LoopGuardDecision)["action"].__set__
_set_code: Final = vars(LoopGuardDecision)["code"].__set__
_set_message: Final = vars(LoopGuardDecision)["message"].__set__
_set_metadata: Final = vars(LoopGuardDecision)["metadata"].__set__


def _decision(
    action: GuardAction, code: str, message: str, metadata: Mapping[str, object]
) -> LoopGuardDecision:
    """`LoopGuardDecision(...)` for the per-call path."""
    decision: LoopGuardDecision = _new_object(LoopGuardDecision)
    _set_action(decision, action)
    _set_code(decision, code)
    _set_message(decision, message)
    _set_metadata(decision, metadata)
    return decision


_DISABLED: Final = LoopGuardDecision(
    GuardAction.ALLOW, "disabled", "loop guard disabled", MappingProxyType({})
)


class ToolExecutionError(Exception):
    """Raised on HALT: the turn must stop, and retrying the same call will not help."""

    def __init__(self, message: str, tool_name: str = "", is_retryable: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.tool_name = tool_name
        self.is_retryable = is_retryable

    @classmethod
    def from_decision(cls, decision: LoopGuardDecision) -> ToolExecutionError:
        """The error that carries out a HALT decision."""
        tool = decision.metadata.get("tool")
        return cls(
            f"[loop-guard] {decision.message}",
            tool_name=tool if isinstance(tool, str) else "",
            is_retryable=False,
        )


@dataclass(frozen=True, slots=True, eq=False)
class LoopGuardStats(Mapping[str, object]):
    """A snapshot of the current turn, for status commands and dashboards.

    Read it by attribute or as a read-only mapping (`stats["tool_counts"]`), as
    PraisonAI's `get_stats()` dict is read: `turn_elapsed`, `tool_counts` and `config`
    (with its `idempotent_thresholds` and `mutating_thresholds`) are among the keys.
    """

    enabled: bool
    turn_elapsed: float
    tool_counts: Mapping[str, int]
    streak: int
    similar: int
    laps: int
    progress_marks: int
    last_progress: str | None
    failures: Mapping[str, int]
    config: Mapping[str, object]

    def __getitem__(self, key: str) -> object:
        if key not in _STATS_KEYS:
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(_STATS_ORDER)

    def __len__(self) -> int:
        return len(_STATS_ORDER)


_STATS_ORDER: Final = tuple(spec.name for spec in fields(LoopGuardStats))
_STATS_KEYS: Final = frozenset(_STATS_ORDER)


def _stats_config(cfg: LoopGuardConfig) -> Mapping[str, object]:
    """The config as `get_stats()` shows it: every field, and PraisonAI's threshold lists."""
    return MappingProxyType(
        {
            **{spec.name: getattr(cfg, spec.name) for spec in fields(cfg)},
            "idempotent_thresholds": (
                cfg.idempotent_warn_threshold,
                cfg.idempotent_block_threshold,
                cfg.idempotent_halt_threshold,
            ),
            "mutating_thresholds": (
                cfg.mutating_warn_threshold,
                cfg.mutating_block_threshold,
                cfg.mutating_halt_threshold,
            ),
        }
    )


def _split_words(name: str) -> list[str]:
    """The lower-case words of snake_case, camelCase, kebab-case and dotted names."""
    return [word.lower() for word in _WORD_RE.findall(name)]


@functools.lru_cache(maxsize=1024)
def classify_tool_name(name: str) -> Bucket:
    """Bucket a tool by the built-in sets, then by the verbs in its name (unknown: mutating)."""
    words = _split_words(name)
    normalised = "_".join(words)
    if normalised in IDEMPOTENT_TOOLS:
        return "idempotent"
    if normalised in MUTATING_TOOLS:
        return "mutating"
    if not MUTATING_VERBS.isdisjoint(words):
        return "mutating"
    if not READ_VERBS.isdisjoint(words):
        return "idempotent"
    return "mutating"


def _safe_repr(value: object) -> str:
    """`repr`, or the object's identity when its repr fails or recurses too deep."""
    try:
        return repr(value)
    except Exception:  # noqa: BLE001 - any broken __repr__ must not break the guard
        return f"<{type(value).__qualname__} object at {id(value):#x}>"


def _json_encoder() -> Callable[[object], str]:
    """Compact JSON with sorted keys, non-JSON values by repr.

    json.dumps builds a new C encoder on every call, which costs more than encoding a
    small dict; this builds it once. Without the C accelerator, the plain encoder.
    """
    make_c_encoder = getattr(json.encoder, "c_make_encoder", None)
    if make_c_encoder is None:
        return json.JSONEncoder(
            ensure_ascii=False,
            check_circular=False,
            sort_keys=True,
            separators=(",", ":"),
            default=_safe_repr,
        ).encode
    # (markers, default, encoder, indent, key_separator, item_separator, sort_keys,
    # skipkeys, allow_nan): no cycle markers, cycles end in RecursionError.
    chunks = make_c_encoder(
        None, _safe_repr, json.encoder.encode_basestring, None, ":", ",", True, False, True
    )

    def encode(value: object) -> str:
        return "".join(chunks(value, 0))

    return encode


_encode_json: Final = _json_encoder()


def _key_text(key: object) -> str:
    """A mapping key as JSON would write it, with 1 and 1.0 alike."""
    if isinstance(key, str):
        return str.__str__(key)
    normal = _normalise(key)
    return normal if isinstance(normal, str) else _encode_json(normal)


def _normalise(value: object) -> object:
    """A JSON-native copy: 1.0 as 1, tuples as lists, str keys, anything else by repr."""
    if value is None or type(value) is str or type(value) is int or type(value) is bool:
        return value
    # Plain leaves are kept without a call: this runs once per node of nested arguments.
    if type(value) is dict:
        return {
            key if type(key) is str else _key_text(key): (
                item if type(item) in _PLAIN_JSON_TYPES else _normalise(item)
            )
            for key, item in value.items()
        }
    if type(value) is list or type(value) is tuple:
        return [item if type(item) in _PLAIN_JSON_TYPES else _normalise(item) for item in value]
    if type(value) is float:
        return int(value) if value.is_integer() else value
    if isinstance(value, Mapping):
        return {_key_text(key): _normalise(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_normalise(item) for item in value]
    # Subclasses (str/int enums, numpy-like floats) as JSON would write their value.
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return _normalise(float(value))
    return _safe_repr(value)


def _normalise_or_repr(value: object) -> object:
    try:
        return _normalise(value)
    except RecursionError:  # a self-referencing or absurdly deep structure
        return _safe_repr(value)


def _is_flat(mapping: dict[object, object], value_types: frozenset[type]) -> bool:
    """True when every key is a str and every value's exact type is one of `value_types`."""
    for key, value in mapping.items():
        if type(key) is not str or type(value) not in value_types:
            return False
    return True


def canonical_args(args: object) -> Hashable:
    """A hashable form of tool arguments, equal exactly for JSON-equivalent values.

    Keys are sorted at every depth, 1 == 1.0 (but not True), tuples are lists and
    non-JSON values count by repr. Flat dicts of str/int/None (the usual model-made
    arguments) become a frozenset of items, which needs no sorting; everything else
    becomes canonical JSON text.
    """
    if type(args) is dict and _is_flat(args, _PLAIN_ARG_TYPES):
        return frozenset(args.items())
    normal = _normalise_or_repr(args)
    if type(normal) is dict and _is_flat(normal, _PLAIN_ARG_TYPES):
        return frozenset(normal.items())
    return _encode_json(normal)


def _result_text(result: object) -> str:
    """JSON text of a result with sorted keys (others by repr), normalised only if needed.

    Unlike arguments, a result that turned 1 into 1.0 counts as changed; the encoder
    alone handles everything else and fails only on keys it cannot sort or on cycles.
    """
    try:
        return _encode_json(result)
    except (TypeError, ValueError, RecursionError):
        return _encode_json(_normalise_or_repr(result))


# A recorded result as it is compared: (success, kind, text or bytes).
_Result = tuple[bool, str, str | bytes]


def _result_of(result: object, success: bool) -> _Result:
    """What a result is compared by: the outcome, its kind and its text (bytes as they are)."""
    # The kind keeps "x" as text, b"x" as bytes and '"x"' as JSON text apart.
    if type(result) is str:
        return success, "s", result
    if type(result) is bytes:
        return success, "b", result
    return success, "j", _result_text(result)


def _normal_hash(recorded: _Result) -> int:
    """The hash of a recorded result after blanking volatile fields and tokens."""
    success, kind, text = recorded
    if isinstance(text, bytes):
        text = text.decode("utf-8", "surrogateescape")
    return hash((success, kind, normalise_text(blank_volatile_fields(text))))


def result_hash(result: object, *, success: bool = True) -> int:
    """A hash of the whole result (falsy ones too), after normalisation, and of the outcome.

    Text and bytes are hashed as they are, anything else as canonical JSON, once the
    volatile fields of a JSON object or array (ids, timestamps, etags: see
    `guards.near_calls`) are blanked and dates, times, UUIDs, hex and provider ids and
    numbers of 5+ digits are replaced (as `fingerprint_call` does), by Python's str/bytes
    hash: SipHash with a per-process
    random key, over the whole input, several times cheaper than blake2b for typical
    results. A collision (2**-64 per pair) could only make two different results look
    alike, never hide a repeated one.
    """
    return _normal_hash(_result_of(result, success))


_CallKey = tuple[str, Hashable]
# (call, label of the result): the label is the raw hash of the first of a run of results
# that are equal after normalisation (see LoopGuard._label), so plain tuple comparison
# tells same calls with same results apart.
_Fingerprint = tuple[_CallKey, int | str]
# runs[i]: how many trailing fingerprints equal the one _PERIODS[i] places before them.
_NO_RUNS: Final = (0,) * len(_PERIODS)
_NO_CYCLE: Final = (0, 0)  # (laps, period) of the recorded tail
_NOTHING: Final = object()


def _advance_cycles(
    ring: deque[_Fingerprint], runs: tuple[int, ...], fp: _Fingerprint
) -> tuple[tuple[int, ...], tuple[int, int]]:
    """The cycle runs once `fp` is appended to `ring`, and the longest cycle (2+ laps)."""
    size = len(ring)
    advanced = []
    best = _NO_CYCLE
    for period, previous in zip(_PERIODS, runs, strict=True):
        run = previous + 1 if size >= period and ring[-period] == fp else 0
        advanced.append(run)
        laps = (run + period) // period  # A,B,A,B: run 2, two laps
        if laps >= 2 and laps > best[0]:
            best = (laps, period)
    return tuple(advanced), best


def _tally(counts: dict[str, int], tool: str) -> None:
    """Count one more for `tool`; past the cap on names, in the count they share."""
    count = counts.get(tool)
    if count is not None:
        counts[tool] = count + 1
    elif len(counts) < _MAX_TRACKED_TOOLS:
        counts[tool] = 1
    else:
        counts[_OTHER_TOOLS] = counts.get(_OTHER_TOOLS, 0) + 1


def _tallied(counts: dict[str, int], tool: str) -> int:
    """The count of `tool` (the shared one for a name past the cap)."""
    count = counts.get(tool)
    if count is None:
        return counts.get(_OTHER_TOOLS, 0) if len(counts) >= _MAX_TRACKED_TOOLS else 0
    return count


class LoopGuard:
    """Per-turn tool-call guard; thread-safe, O(1) per call, deterministic under `clock`."""

    def __init__(
        self, config: LoopGuardConfig | None = None, *, clock: Callable[[], float] | None = None
    ) -> None:
        cfg = config if config is not None else LoopGuardConfig()
        self._config = cfg
        self._enabled = cfg.enabled
        self._clock = clock if clock is not None else time.monotonic
        self._lock = threading.Lock()
        self._thresholds: dict[Bucket, tuple[int, int, int]] = {
            "idempotent": (
                cfg.idempotent_warn_threshold,
                cfg.idempotent_block_threshold,
                cfg.idempotent_halt_threshold,
            ),
            "mutating": (
                cfg.mutating_warn_threshold,
                cfg.mutating_block_threshold,
                cfg.mutating_halt_threshold,
            ),
        }
        self._registered: dict[str, Bucket] = {}
        # Per tool name, the thresholds of its bucket: looked up twice per call.
        self._tool_thresholds: dict[str, tuple[int, int, int]] = {}
        # The last pre-checked call's args object and key; holding the object keeps its
        # identity from being reused by another object.
        self._checked: tuple[object, _CallKey] = (_NOTHING, ("", ""))
        # The call the last pre-check blocked (and counted), until the next record.
        self._pending_block: _CallKey | None = None
        self._counts: dict[str, int] = {}
        # Per tool, how many of its calls failed since its last success.
        self._failures: dict[str, int] = {}
        self._stats_config = _stats_config(cfg)
        self._turn_start: float | None = None
        self._last: _Fingerprint | None = None
        self._streak = 0
        # The trailing run of calls each nearly the same as the one before with the same
        # result, once it holds a call not identical to the one before; 0 until then.
        self._similar = 0
        # The last `near_args` answer, by the identity of the two call keys: the pre-check
        # and the record of one call ask the same question.
        self._near_memo: tuple[object, object, bool] = (_NOTHING, _NOTHING, False)
        self._ring: deque[_Fingerprint] = deque(maxlen=_LONGEST_PERIOD)
        # Beside the ring: each fingerprint's call and recorded result (None if blocked).
        self._ring_keys: deque[_CallKey] = deque(maxlen=_LONGEST_PERIOD)
        self._ring_results: deque[_Result | None] = deque(maxlen=_LONGEST_PERIOD)
        # The last normalised hash computed, by the identity of its recorded result.
        self._normal: tuple[_Result | None, int] = (None, 0)
        self._runs = _NO_RUNS
        self._cycle = _NO_CYCLE
        self._marks = 0
        self._last_mark: str | None = None

    @property
    def config(self) -> LoopGuardConfig:
        """The thresholds this guard enforces."""
        return self._config

    def register_tool(self, name: str, *, idempotent: bool) -> None:
        """Classify a tool explicitly; this wins over the built-in sets and the name."""
        self._registered[name] = "idempotent" if idempotent else "mutating"
        self._tool_thresholds.pop(name, None)

    def classify(self, tool_name: str) -> Bucket:
        """The tool's bucket: registered, else built-in sets, else the verbs of its name."""
        bucket = self._registered.get(tool_name)
        return bucket if bucket is not None else classify_tool_name(tool_name)

    def _thresholds_of(self, tool_name: str) -> tuple[int, int, int]:
        """The thresholds of the tool's bucket, remembered for up to 1,024 names."""
        thresholds = self._thresholds[self.classify(tool_name)]
        if len(self._tool_thresholds) < _MAX_TRACKED_TOOLS:
            self._tool_thresholds[tool_name] = thresholds
        return thresholds

    def check(
        self, tool_name: str, args: object, *, pre: bool = True, now: float | None = None
    ) -> LoopGuardDecision:
        """Decide on a call: before it runs (`pre`, counting it) or after it was recorded."""
        if not self._enabled:
            return _DISABLED
        key = (tool_name, canonical_args(args))
        if pre:
            # record() of this same call reuses the canonical arguments (set atomically).
            self._checked = (args, key)
        thresholds = self._tool_thresholds.get(tool_name) or self._thresholds_of(tool_name)
        with self._lock:
            t = self._clock() if now is None else now
            if self._turn_start is None:
                self._turn_start = t
            decision = self._decide(key, thresholds, pre, t - self._turn_start)
            if pre and decision.action is GuardAction.BLOCK:
                # The blocked call counts as made, whether or not the caller records it:
                # an agent that just skips it and retries escalates to HALT.
                _tally(self._counts, tool_name)
                self._repeat_last(key)
                self._pending_block = key
            return decision

    def record(
        self,
        tool_name: str,
        args: object,
        *,
        success: bool,
        result: object = None,
        now: float | None = None,
    ) -> LoopGuardDecision:
        """Record a call that ran (or was blocked) and return the post-check decision."""
        if not self._enabled:
            return _DISABLED
        checked_args, key = self._checked
        if checked_args is not args or key[0] != tool_name:
            key = (tool_name, canonical_args(args))
        if type(result) is dict and result.get("loop_blocked") is True:
            return self._record_blocked(key, now)
        # Text, the usual result, without a call.
        recorded = (success, "s", result) if type(result) is str else _result_of(result, success)
        raw = hash(recorded)
        thresholds = self._tool_thresholds.get(tool_name) or self._thresholds_of(tool_name)
        with self._lock:
            t = self._clock() if now is None else now
            if self._turn_start is None:
                self._turn_start = t
            self._pending_block = None
            counts = self._counts
            count = counts.get(tool_name)
            if count is None:
                _tally(counts, tool_name)
            else:
                counts[tool_name] = count + 1
            if not success:
                _tally(self._failures, tool_name)
            elif self._failures:
                self._end_failures(tool_name)
            self._push(key, raw, recorded)
            return self._decide(key, thresholds, False, t - self._turn_start)

    def mark_progress(self, label: str) -> None:
        """Mark a real checkpoint: only later calls can build a streak, cycle or failure run."""
        with self._lock:
            self._forget_tail()
            self._failures = {}
            self._marks += 1
            self._last_mark = label

    def reset_turn(self) -> None:
        """Start a new turn: counts, streaks, cycle, progress marks and the timer are cleared."""
        with self._lock:
            self._forget_tail()
            self._pending_block = None
            self._counts = {}
            self._failures = {}
            self._turn_start = None
            self._marks = 0
            self._last_mark = None

    def get_stats(self, *, now: float | None = None) -> LoopGuardStats:
        """A snapshot of this turn: elapsed time, counts, streaks and laps (also a mapping)."""
        with self._lock:
            start = self._turn_start
            elapsed = 0.0 if start is None else (self._clock() if now is None else now) - start
            return LoopGuardStats(
                enabled=self._config.enabled,
                turn_elapsed=elapsed,
                tool_counts=MappingProxyType(dict(self._counts)),
                streak=self._streak,
                similar=self._similar or self._streak,
                laps=self._cycle[0],
                progress_marks=self._marks,
                last_progress=self._last_mark,
                failures=MappingProxyType(dict(self._failures)),
                config=self._stats_config,
            )

    def _forget_tail(self) -> None:
        self._last = None
        self._streak = 0
        self._similar = 0
        self._ring.clear()
        self._ring_keys.clear()
        self._ring_results.clear()
        self._normal = (None, 0)
        self._runs = _NO_RUNS
        self._cycle = _NO_CYCLE

    def _record_blocked(self, key: _CallKey, now: float | None) -> LoopGuardDecision:
        """Record a call that was blocked and did not run; counted once, by its pre-check."""
        with self._lock:
            if self._turn_start is None:
                self._turn_start = self._clock() if now is None else now
            pending, self._pending_block = self._pending_block, None
            if pending != key:
                # A block result that no pre-check counted (none ran, or one for another call).
                _tally(self._counts, key[0])
                self._repeat_last(key)
            return self._blocked(key)

    def _end_failures(self, tool: str) -> None:
        """A success of `tool` ends its failure run (lock held)."""
        failures = self._failures
        if failures.pop(tool, None) is None and len(failures) >= _MAX_TRACKED_TOOLS:
            failures.pop(_OTHER_TOOLS, None)  # its failures were in the shared count

    def _repeat_last(self, key: _CallKey) -> None:
        """Push a blocked call: a repeat of its call's last fingerprint, so retrying escalates.

        A blocked call nearly the same as the last one repeats that one's result under its
        own arguments, so retrying it reworded escalates the similar run as well.
        """
        last = self._last
        if last is not None and (
            last[0] == key or (last[0][0] == key[0] and self._near(last[0], key))
        ):
            self._push(key, last[1], self._ring_results[-1])
        else:
            self._push(key, _BLOCKED_RESULT, None)

    def _push(self, key: _CallKey, label: int | str, recorded: _Result | None) -> None:
        """Append a recorded call: update the streak and the per-period cycle runs."""
        ring = self._ring
        last = self._last
        fp = (key, label)
        if fp == last:
            streak, fresh = self._streak + 1, False  # the same call and result: stuck
        elif key in self._ring_keys:
            fp = (key, self._label(key, label, recorded))
            streak = self._streak + 1 if fp == last else 1
            fresh = fp not in ring
        else:
            streak, fresh = 1, True  # usually: a call unlike the last four
        if streak > 1:
            if self._similar:
                self._similar += 1
        elif (
            last is not None
            and last[0][0] == key[0]
            and last[0] != key
            and self._resembles_last(key, recorded)
        ):
            self._similar = (self._similar or self._streak) + 1
        elif self._similar:
            self._similar = 0
        # A fresh fingerprint ends every cycle run. Inside a streak as long as the ring, no
        # cycle can show and the runs restart from zero once the streak breaks. Two laps of
        # period p with the last p calls identical would be a streak of 2p >= 4, so a tail
        # of identical calls is never taken for a cycle: it is a streak.
        if fresh or streak >= _LONGEST_PERIOD:
            self._runs = _NO_RUNS
            self._cycle = _NO_CYCLE
        else:
            self._runs, self._cycle = _advance_cycles(ring, self._runs, fp)
        ring.append(fp)
        self._ring_keys.append(key)
        self._ring_results.append(recorded)
        self._last = fp
        self._streak = streak

    def _resembles_last(self, key: _CallKey, recorded: _Result | None) -> bool:
        """True when a call of the last call's tool with other arguments nearly repeats it.

        Its arguments must be nearly the same (`near_args`) and its result the same after
        normalisation. Arguments are compared first: they are bounded and usually differ
        in a target, which settles it before any result is normalised.
        """
        earlier = self._ring_results[-1] if self._ring_results else None
        if recorded is None or earlier is None or self._last is None:
            return False
        # Another outcome or kind of result never normalises to the same (`_normal_hash`).
        if earlier[:2] != recorded[:2] or not self._near(self._last[0], key):
            return False
        return earlier == recorded or self._normal_of(earlier) == self._normal_of(recorded)

    def _near(self, earlier: _CallKey, key: _CallKey) -> bool:
        """`near_args` of two calls of one tool, remembered for the same two keys."""
        memo = self._near_memo
        if memo[0] is earlier and memo[1] is key:
            return memo[2]
        near = near_args(earlier[1], key[1])
        self._near_memo = (earlier, key, near)
        return near

    def _label(self, key: _CallKey, raw: int | str, recorded: _Result | None) -> int | str:
        """The label of a result of a call in the ring: an equal earlier result's label.

        Results are equal when they are after normalisation. Normalising costs more than
        the rest of a call, so it happens only here: for a call made in the last four
        whose result differs from every earlier result of it as recorded.
        """
        if recorded is None or (key, raw) in self._ring:
            return raw
        normal = None
        # Newest first: in a streak the last call matches. Each earlier result is
        # normalised before this one, so that this one is remembered for the next call.
        for (earlier_key, label), earlier in zip(
            reversed(self._ring), reversed(self._ring_results), strict=True
        ):
            if earlier is None or earlier_key != key:
                continue
            earlier_normal = self._normal_of(earlier)
            if normal is None:
                normal = self._normal_of(recorded)
            if earlier_normal == normal:
                return label
        return raw

    def _normal_of(self, recorded: _Result) -> int:
        """`_normal_hash(recorded)`, remembering the last one: the next call compares with it."""
        cached, normal = self._normal
        if cached is not recorded:
            normal = _normal_hash(recorded)
            self._normal = (recorded, normal)
        return normal

    def _decide(
        self, key: _CallKey, thresholds: tuple[int, int, int], pre: bool, elapsed: float
    ) -> LoopGuardDecision:
        cfg = self._config
        tool = key[0]
        count = self._counts.get(tool)
        if count is None:
            count = _tallied(self._counts, tool)
        if pre:
            count += 1
        failures = _tallied(self._failures, tool) if self._failures else 0
        last = self._last
        if last is not None and last[0] == key:
            extends = True
            streak = self._streak
            similar = self._similar
        else:
            extends = False
            streak = similar = 0
            if pre and last is not None and last[0][0] == tool:
                # The similar run this call, if it runs, would extend.
                run = self._similar or self._streak
                if run >= cfg.no_progress_similar_warn and self._near(last[0], key):
                    similar = run
        laps, period = self._cycle
        # The cycle counts only if this call is the one that continues it.
        if laps and not (self._ring[-period][0] == key if pre else extends):
            laps = 0
        if (
            count < thresholds[0]
            and streak < cfg.no_progress_warn
            and (not similar or similar < cfg.no_progress_similar_warn)
            and laps < cfg.cycle_warn_laps
            and (not failures or failures < cfg.failure_warn)
            and elapsed <= cfg.max_time_per_turn
        ):
            return _decision(
                GuardAction.ALLOW,
                "ok",
                "allowed",
                {"tool": tool, "tool_count": count, "streak": streak},
            )
        if elapsed > cfg.max_time_per_turn:
            return _time_exceeded(tool, count, streak, elapsed, cfg.max_time_per_turn)
        if streak >= cfg.no_progress_halt:
            return _no_progress(GuardAction.HALT, tool, count, streak, cfg.no_progress_halt)
        if similar and similar >= cfg.no_progress_similar_halt:
            return _no_progress_similar(
                GuardAction.HALT,
                tool,
                count,
                streak=streak,
                similar=similar,
                threshold=cfg.no_progress_similar_halt,
            )
        if failures >= cfg.failure_halt:
            return self._failure_decision(GuardAction.HALT, tool, count, failures)
        if laps >= cfg.cycle_halt_laps:
            return self._cycle_decision(GuardAction.HALT, tool, count, laps, period)
        _, block_at, halt_at = thresholds
        if streak >= cfg.no_progress_warn:
            if count >= halt_at:
                return _count_decision(GuardAction.HALT, tool, count, streak, halt_at, pre=pre)
            if count >= block_at:
                return _count_decision(GuardAction.BLOCK, tool, count, streak, block_at, pre=pre)
            return _no_progress(GuardAction.WARN, tool, count, streak, cfg.no_progress_warn)
        if similar and similar >= cfg.no_progress_similar_warn:
            # Nearly the same calls are a stuck run too: count BLOCK and HALT happen.
            if count >= halt_at:
                return _count_decision(
                    GuardAction.HALT, tool, count, streak, halt_at, pre=pre, similar=similar
                )
            if count >= block_at:
                return _count_decision(
                    GuardAction.BLOCK, tool, count, streak, block_at, pre=pre, similar=similar
                )
            return _no_progress_similar(
                GuardAction.WARN,
                tool,
                count,
                streak=streak,
                similar=similar,
                threshold=cfg.no_progress_similar_warn,
            )
        if failures >= cfg.failure_warn:
            return self._failure_decision(GuardAction.WARN, tool, count, failures)
        if laps >= cfg.cycle_warn_laps:
            return self._cycle_decision(GuardAction.WARN, tool, count, laps, period)
        return _count_warn(tool, count, streak, thresholds)

    def _blocked(self, key: _CallKey) -> LoopGuardDecision:
        tool = key[0]
        count = _tallied(self._counts, tool)
        streak = self._streak
        return _decision(
            GuardAction.BLOCK,
            "blocked",
            f"{tool} was blocked and did not run (call {count} this turn; the same call and "
            f"result {streak} times in a row). Retrying it the same way will stop the turn: "
            "change the arguments, use another tool, or answer with what you have.",
            {"tool": tool, "tool_count": count, "streak": streak},
        )

    def _failure_decision(
        self, action: GuardAction, tool: str, count: int, failures: int
    ) -> LoopGuardDecision:
        cfg = self._config
        if action is GuardAction.HALT:
            code = "failure_halt"
            threshold = cfg.failure_halt
            tail = "the turn is stopped because the tool keeps failing."
        else:
            code = "failure_warn"
            threshold = cfg.failure_warn
            tail = (
                f"the turn stops at {cfg.failure_halt} failures in a row. Read the error "
                "before retrying: change the arguments, use another tool, or answer with "
                "what you have."
            )
        return _decision(
            action,
            code,
            f"{tool} failed {failures} times in a row (threshold {threshold}); {tail}",
            {
                "tool": tool,
                "tool_count": count,
                "failures": failures,
                "threshold": threshold,
            },
        )

    def _cycle_decision(
        self, action: GuardAction, tool: str, count: int, laps: int, period: int
    ) -> LoopGuardDecision:
        cfg = self._config
        names = ", ".join(fp[0][0] for fp in list(self._ring)[-period:])
        if action is GuardAction.HALT:
            code = "cycle_halt"
            tail = "the turn is stopped because the calls are going round in a circle."
            threshold = cfg.cycle_halt_laps
        else:
            code = "cycle_warn"
            tail = (
                f"the turn stops at {cfg.cycle_halt_laps} laps. Repeating the cycle will not "
                "change the results: try something else or answer with what you have."
            )
            threshold = cfg.cycle_warn_laps
        return _decision(
            action,
            code,
            f"The same {period} tool calls ({names}) returned the same results {laps} times "
            f"over (threshold {threshold} laps); {tail}",
            {
                "tool": tool,
                "tool_count": count,
                "laps": laps,
                "period": period,
                "threshold": threshold,
            },
        )


def _time_exceeded(
    tool: str, count: int, streak: int, elapsed: float, limit: float
) -> LoopGuardDecision:
    return _decision(
        GuardAction.HALT,
        "time_exceeded",
        f"This turn has run {elapsed:.1f} s, over its limit of {limit:g} s, so it is stopped "
        f"at {tool} (call {count} of it). Answer with what you have.",
        {"tool": tool, "tool_count": count, "streak": streak, "elapsed": elapsed, "limit": limit},
    )


def _no_progress(
    action: GuardAction, tool: str, count: int, streak: int, threshold: int
) -> LoopGuardDecision:
    if action is GuardAction.HALT:
        code = "no_progress_halt"
        advice = "the turn is stopped because the tool is stuck."
    else:
        code = "no_progress_warn"
        advice = (
            "Repeating it will not change the result: change the arguments, try another "
            "tool, or answer with what you have."
        )
    return _decision(
        action,
        code,
        f"{tool} returned the same result for the same arguments {streak} times in a row "
        f"(threshold {threshold}); {advice}",
        {"tool": tool, "tool_count": count, "streak": streak, "threshold": threshold},
    )


def _no_progress_similar(
    action: GuardAction, tool: str, count: int, *, streak: int, similar: int, threshold: int
) -> LoopGuardDecision:
    if action is GuardAction.HALT:
        code = "no_progress_similar_halt"
        advice = "the turn is stopped because the tool is stuck."
    else:
        code = "no_progress_similar_warn"
        advice = (
            "Rewording the call or changing a counter or flag will not change the result: "
            "try another approach or tool, or answer with what you have."
        )
    return _decision(
        action,
        code,
        f"{tool} returned the same result {similar} times in a row for nearly the same "
        f"arguments (threshold {threshold}); {advice}",
        {
            "tool": tool,
            "tool_count": count,
            "streak": streak,
            "similar": similar,
            "threshold": threshold,
        },
    )


def _count_decision(
    action: GuardAction,
    tool: str,
    count: int,
    streak: int,
    threshold: int,
    *,
    pre: bool,
    similar: int | None = None,
) -> LoopGuardDecision:
    """A count BLOCK or HALT; `similar` is the run behind it when it is not `streak`."""
    if action is GuardAction.HALT:
        code = "count_halt"
        verdict = "the turn is stopped."
    else:
        code = "count_block"
        verdict = (
            f"{'this call was not run' if pre else 'its result is withheld'}. Change the "
            "arguments, use another tool, or answer with what you have; retrying will stop "
            "the turn."
        )
    metadata: dict[str, object] = {
        "tool": tool,
        "tool_count": count,
        "streak": streak,
        "threshold": threshold,
    }
    run = f"{streak} times in a row"
    if similar is not None:
        metadata["similar"] = similar
        run = f"{similar} times in a row for nearly the same arguments"
    return _decision(
        action,
        code,
        f"{tool} was called {count} times this turn (threshold {threshold}) and returned "
        f"the same result {run}; {verdict}",
        metadata,
    )


def _count_warn(
    tool: str, count: int, streak: int, thresholds: tuple[int, int, int]
) -> LoopGuardDecision:
    warn_at, block_at, halt_at = thresholds
    if count >= block_at:
        threshold = halt_at if count >= halt_at else block_at
        why = (
            f"(threshold {threshold}); it is still allowed because its results keep changing, "
            "but finish soon or change approach."
        )
    else:
        threshold = warn_at
        why = (
            f"(warn threshold {warn_at}, block from {block_at} if the results stop "
            "changing). Make sure each call is needed."
        )
    return _decision(
        GuardAction.WARN,
        "count_warn",
        f"{tool} was called {count} times this turn {why}",
        {"tool": tool, "tool_count": count, "streak": streak, "threshold": threshold},
    )


def apply_decision(decision: LoopGuardDecision, result: object) -> object:
    """Apply a decision to a tool result: annotate (WARN), replace (BLOCK) or raise (HALT)."""
    action = decision.action
    if action is GuardAction.ALLOW:
        return result
    if action is GuardAction.HALT:
        raise ToolExecutionError.from_decision(decision)
    if action is GuardAction.BLOCK:
        return {"error": f"[loop-guard] {decision.message}", "loop_blocked": True}
    if isinstance(result, Mapping):
        note = {"action": action.value, "code": decision.code, "message": decision.message}
        return {**result, "_loop_guard": note}
    if isinstance(result, str):
        return f"{result} [loop-guard] {decision.message}"
    return result
