"""Reading the config: safe YAML, `${VAR}` interpolation, validation once into a `Config`.

`load_config(path)` returns a frozen `Config` or raises `ConfigError` whose path names
the field (`bots.0.token`) and whose reason says how to fix it.

Decisions where DESIGN.md is silent: `${VAR}` (an error naming the field when unset) and
`${VAR:-default}` are filled in values after parsing, so a value never changes the YAML's
shape. No number is inf or nan and every duration is at most 366 days
(`gateway.config.limits`). The file must be UTF-8 and stay within
`gateway.config.safeyaml`'s bounds (nesting, alias expansion, digits); such errors name the file.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

import yaml
from pydantic import ValidationError

from gateway.app.errors import ConfigError, ConfigErrors
from gateway.config.base import field_errors
from gateway.config.root import Config
from gateway.config.safeyaml import YamlLimitError, load_yaml

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_PLACEHOLDER = re.compile(r"lwvar(\d+)lw")


def _shield(text: str) -> tuple[str, list[re.Match[str]]]:
    """Swap each `${...}` for a YAML-safe placeholder so `{a: ${X:-}}` still parses."""
    found: list[re.Match[str]] = []

    def swap(match: re.Match[str]) -> str:
        found.append(match)
        return f"lwvar{len(found) - 1}lw"

    return _VAR.sub(swap, text), found


def interpolate(
    value: object,
    env: Mapping[str, str],
    refs: list[re.Match[str]],
    missing: list[ConfigError],
    path: str = "",
) -> object:
    """Fill the placeholders of a parsed YAML tree from the environment, by field path.

    Each variable that is unset and has no default is added to `missing` (naming its
    field) and filled with "", so the rest of the tree is still filled and checked.
    """
    if isinstance(value, str):

        def substitute(placeholder: re.Match[str]) -> str:
            match = refs[int(placeholder.group(1))]
            name, default = match.group(1), match.group(2)
            found = env.get(name)
            if found:
                return found
            if default is not None:
                return default
            missing.append(
                ConfigError(
                    path,
                    f"environment variable {name} is not set (export it, or write "
                    f"${{{name}:-default}} to give a default)",
                )
            )
            return ""

        return _PLACEHOLDER.sub(substitute, value)
    if isinstance(value, Mapping):
        return {
            k: interpolate(v, env, refs, missing, f"{path}.{k}" if path else str(k))
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [
            interpolate(v, env, refs, missing, f"{path}.{i}" if path else str(i))
            for i, v in enumerate(value)
        ]
    return value


def parse_config(
    text: str, env: Mapping[str, str] | None = None, *, source: str = "the config"
) -> Config:
    """Parse, interpolate and validate the text of a YAML config (`source` names it in errors)."""
    shielded, refs = _shield(text)
    try:
        data = load_yaml(shielded)
    except YamlLimitError as exc:
        raise ConfigError("", f"{source} is refused: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(
            "", f"{source} is not valid YAML{where}: {getattr(exc, 'problem', exc)}"
        ) from None
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError("", "the config file must be a YAML mapping at the top level")
    env = os.environ if env is None else env
    missing: list[ConfigError] = []
    resolved = interpolate(data, env, refs, missing)
    try:
        config = Config.model_validate(resolved)
    except ValidationError as exc:
        filled = {env[ref.group(1)] for ref in refs if env.get(ref.group(1))}
        refused = [ConfigError(path, _masked(reason, filled)) for path, reason in field_errors(exc)]
    else:
        refused = []
    errors = missing + [error for error in refused if not _explained(error.path, missing)]
    if len(errors) > 1:
        raise ConfigErrors(errors)
    if errors:
        raise errors[0]
    return config


_MASK_FROM = 4
"""Values from the environment this long or longer are masked in errors (shorter: no secret)."""


def _masked(reason: str, filled: set[str]) -> str:
    """`reason` with every environment value it quotes masked: whole, as repr, or the start
    of its repr that a validator cut short (a mode or a union tag read from a secret)."""
    for value in sorted(filled, key=len, reverse=True):
        if len(value) < _MASK_FROM:
            continue
        reason = reason.replace(value, "***")
        shown = repr(value)
        for end in range(len(shown), _MASK_FROM, -1):
            if shown[:end] in reason:
                reason = reason.replace(shown[:end], "'***'")
                break
    return reason


def _explained(path: str, missing: list[ConfigError]) -> bool:
    """Whether a field's error follows from a variable missing there (its "" refused)."""
    return any(path == m.path or path.startswith(f"{m.path}.") for m in missing)


def load_config(path: str | Path, env: Mapping[str, str] | None = None) -> Config:
    """Read, interpolate and validate a YAML config file."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError("", f"cannot read config file {file}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            "", f"config file {file} is not UTF-8 text (byte {exc.start}); save it as UTF-8"
        ) from None
    return parse_config(text, env, source=f"config file {file}")
