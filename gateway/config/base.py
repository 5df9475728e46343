"""What every config section shares: the frozen model, secrets, and errors that name a field.

Secrets are `SecretStr` and never printed; an empty one (`${VAR:-}` unset) is an error
where it is required (`Token`) and not set where it is optional (`OptionalSecret`). No
float field anywhere takes inf or nan. `first_error` turns a pydantic error into the
dotted field path and a reason that never echoes the value (`ConfigError`'s two parts).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    SecretStr,
    ValidationError,
)
from pydantic_core import ErrorDetails

from gateway.config.limits import long_enough


def _required_secret(value: SecretStr) -> SecretStr:
    if not value.get_secret_value():
        raise ValueError("must not be empty (is its environment variable set?)")
    return value


def _empty_is_none(value: object) -> object:
    return None if value in ("", None) else value


Token = Annotated[SecretStr, AfterValidator(_required_secret)]
"""A secret that must be given: an empty value (`${VAR:-}` unset) is an error."""

OptionalSecret = Annotated[SecretStr | None, BeforeValidator(_empty_is_none)]
"""A secret that may be left out: an empty value (`${VAR:-}` unset) means not set."""

ChosenSecret = Annotated[OptionalSecret, AfterValidator(long_enough)]
"""An optional secret the operator makes up (not a platform's token): 16 characters or more."""


class Frozen(BaseModel):
    # No float field anywhere takes inf or nan: a guard cannot run with either.
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class FieldError(ValueError):
    """A cross-field error that knows its path, relative to the model whose validator raised it."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: {reason}")


UNKNOWN_FIELD = "unknown field (check the spelling; see the README's config reference)"


def first_error(exc: ValidationError) -> tuple[str, str]:
    """The dotted location and message of a pydantic error, without echoing input values."""
    return field_errors(exc)[0]


def field_errors(exc: ValidationError) -> list[tuple[str, str]]:
    """Each of pydantic's errors as `first_error` gives one, duplicates left out."""
    described = (_described(error) for error in exc.errors(include_url=False, include_input=False))
    return list(dict.fromkeys(described))


def _described(error: ErrorDetails) -> tuple[str, str]:
    """One pydantic error's dotted location and message, without its input value."""
    loc = [str(part) for part in error["loc"]]
    # Discriminated unions put the tag in the location (bots.0.discord.token): drop it. The
    # unions are `bots.<n>` and `agents.<name>`, so the tag is the third part; anywhere else
    # a part spelled like a tag is a real field (admins.discord, an agent named openai).
    if len(loc) > 2 and loc[0] in _UNIONS:
        del loc[2]
    ctx = error.get("ctx") or {}
    ctx_error = ctx.get("error")
    if isinstance(ctx_error, FieldError):
        return ".".join([*loc, ctx_error.path]), ctx_error.reason
    message = str(error["msg"]).removeprefix("Value error, ")
    if error["type"] == "missing":
        message = "required field is missing"
    elif error["type"] == "extra_forbidden":
        message = UNKNOWN_FIELD
    elif error["type"] in ("union_tag_invalid", "union_tag_not_found"):
        field = str(ctx["discriminator"]).strip("'")
        expected = ctx.get("expected_tags") or _UNIONS[loc[0]]
        found = f"unknown {field} {ctx['tag']!r}" if "tag" in ctx else "required field is missing"
        message = f"{found} (one of {expected})"
        loc.append(field)
    return ".".join(loc), message


_UNIONS = {
    "bots": "'discord', 'telegram', 'slack', 'mattermost', 'room'",
    "agents": "'scripted', 'python', 'openai', 'http'",
}
