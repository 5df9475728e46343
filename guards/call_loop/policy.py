"""Circuits, the call-loop policy and uniqueness rules: what is counted where, and how much.

A circuit (`circuit_key`) is an agent (or key id) plus session, plus step when given.
`CallLoopPolicy` bounds the identical calls per circuit and window; a `UniquenessRule`
bounds the calls that share chosen fields, and `rule_key` / `rule_group` say which
calls it counts together and which group a "pause" rule pauses.

Decisions the design left open:
- A rule applies to a call that carries every field of the rule (a missing or empty field
  means the rule does not apply) and matches all its filters; "prompt" is the `prompt`
  field when given, else the call's fingerprint. The rule's key is the tuple of its field
  values. Action "pause" pauses the rule's group (the same key without the prompt: "even
  with a different prompt") for `pause_seconds`, not the whole circuit, so other
  customers keep going. Group keys read "rule=NAME/field=value/..."; key components are
  percent-quoted, so no circuit key ever starts with "rule=".
- Messages never contain secrets as long as the circuit root is an agent name or a key
  id, never the raw key: it is echoed in refusals and in `paused()`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal
from urllib.parse import quote

from guards.mode import GuardMode, parse_mode

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


_RULE_NAME_RX = re.compile(r"[A-Za-z0-9._-]{1,64}")
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


_RULE_KEYS = frozenset(
    {"name", "fields", "max_calls", "window_seconds", "filters", "action", "mode"}
)


@dataclass(frozen=True, slots=True)
class UniquenessRule:
    """At most `max_calls` calls sharing `fields` per window; then reject or pause the group.

    `filters` limits the rule to calls whose field equals the value, or starts with it
    when the value ends with "*" ("inv*"; "*" alone: any value). In `mode` "shadow" the
    rule counts and decides alike, and a call it would refuse goes on (`guards.mode`).
    """

    name: str
    fields: tuple[str, ...]
    max_calls: int
    window_seconds: float
    filters: Mapping[str, str] = field(default_factory=_no_filters, hash=False)
    action: RuleAction = "reject"
    mode: GuardMode = "enforce"

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _RULE_NAME_RX.fullmatch(self.name):
            shown = self.name[:40] if isinstance(self.name, str) else self.name
            raise ValueError(
                "name must be 1-64 ASCII letters, digits, '.', '-' or '_' (it is sent in "
                f"response headers), got {shown!r}"
            )
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
        object.__setattr__(self, "mode", _mode(self.mode))

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
            mode=_mode(data.get("mode", "enforce")),
        )


def _mode(value: object) -> GuardMode:
    """A rule's mode, exactly "enforce" or "shadow"; the error names the field."""
    try:
        return parse_mode(value)
    except ValueError as exc:
        raise ValueError(f"mode {exc}") from None


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


RuleKey = tuple[str, ...]
"""A uniqueness rule's key for a call: the call's values of the rule's fields, in order."""


def rules_by_name(rules: Iterable[UniquenessRule]) -> dict[str, UniquenessRule]:
    """The rules by name, in order; a name used twice is a ValueError (one would be lost)."""
    named: dict[str, UniquenessRule] = {}
    for rule in rules:
        if rule.name in named:
            raise ValueError(f"rules: the name {rule.name!r} is used twice")
        named[rule.name] = rule
    return named


def _unset_value(name: str, fingerprint: str) -> str | None:
    """A rule field's value when the call's fields have none: "prompt" is the fingerprint."""
    if name == "prompt":
        return fingerprint or None
    return None


def rule_key(rule: UniquenessRule, fingerprint: str, fields: Mapping[str, str]) -> RuleKey | None:
    """The rule's key for a call (its field values), or None when the rule does not apply."""
    # `or`: a field's own value costs no call (an empty value is none).
    for name, pattern in rule.filters.items():
        value = fields.get(name) or _unset_value(name, fingerprint)
        if value is None:
            return None
        if pattern.endswith("*"):
            if not value.startswith(pattern[:-1]):
                return None
        elif value != pattern:
            return None
    values: list[str] = []
    for name in rule.fields:
        value = fields.get(name) or _unset_value(name, fingerprint)
        if value is None:
            return None
        values.append(value)
    return tuple(values)


def is_group(key: str) -> bool:
    """True for a rule group's key; circuit roots are quoted, so they never start so."""
    return key.startswith("rule=")


def rule_group(rule: UniquenessRule, key: RuleKey) -> str:
    """The group a "pause" rule pauses ("rule=NAME/field=value"): the key without the prompt."""
    parts = [f"rule={_quoted(rule.name)}"]
    parts.extend(
        f"{name}={_quoted(value)}"
        for name, value in zip(rule.fields, key, strict=True)
        if name != "prompt"
    )
    return "/".join(parts)
