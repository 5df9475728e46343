"""Agent run envelopes: a reply that is a JSON object wrapping the agent's final text.

Some agent runtimes hand over their whole run result instead of its text (openclaw
#79084: `{"runId": …, "status": "ok", "summary": "completed", "result": {"payloads":
[{"text": "NO_REPLY"}], "meta": {…}}}`). `final_text(text)` is the text such an
envelope carries, or None when `text` is not one:

- `text`, once surrounding whitespace is removed, is one JSON object (strict JSON: no
  NaN, no trailing text) of at most `ENVELOPE_MAX` characters;
- its final text is found by following, from the object, the first key present of
  `result`, `payloads`, `output`, `choices`, `message`, `final`, `text`, `content`; a
  list stands for its last item, and the walk ends at a string. So the openclaw envelope,
  `{"text": …}`, an Anthropic-style `{"content": [{"type": "text", "text": …}]}`, an
  OpenAI `{"choices": [{"message": {"content": …}}]}` and a Responses `{"output": […]}`
  all carry their final text; `{"action": …}` (no such key) carries none.

`is_unfinished_object(text)` says whether a reply being written is the start of a JSON
object that may still be completed within `ENVELOPE_MAX` characters, so a stream can
hold it back until that is decided. Both are pure and bounded: a text longer than
`ENVELOPE_MAX` is never parsed.
"""

from __future__ import annotations

import json
import re
from typing import Final

ENVELOPE_MAX: Final = 65_536
_TEXT_KEYS: Final = (
    "result",
    "payloads",
    "output",
    "choices",
    "message",
    "final",
    "text",
    "content",
)
# What may follow where the decoder stopped in a JSON text cut short: an unterminated
# string, a literal or number being written, or the rest of a \uXXXX escape.
_PARTIAL_TOKEN: Final = re.compile(
    r'"(?:[^"\\\x00-\x1f]|\\.)*\\?|t(?:r(?:ue?)?)?|f(?:a(?:l(?:se?)?)?)?|n(?:u(?:ll?)?)?'
    r"|-?[0-9.eE+-]*|u[0-9a-fA-F]{0,3}"
)


def final_text(text: str) -> str | None:
    """The final text of an agent run envelope (see the module docstring), or None."""
    body = text.strip()
    if not body.startswith("{") or len(body) > ENVELOPE_MAX:
        return None
    try:
        value = json.loads(body, parse_constant=_refuse)
    except (ValueError, RecursionError):
        return None
    while not isinstance(value, str):
        if isinstance(value, list) and value:
            value = value[-1]
        elif isinstance(value, dict):
            key = next((key for key in _TEXT_KEYS if key in value), None)
            if key is None:
                return None
            value = value[key]
        else:
            return None
    return value


def is_unfinished_object(text: str) -> bool:
    """True for the start of a JSON object cut short, not yet longer than ENVELOPE_MAX."""
    body = text.strip()
    if not body.startswith("{") or len(body) > ENVELOPE_MAX:
        return False
    try:
        json.loads(body, parse_constant=_refuse)
    except json.JSONDecodeError as error:
        return error.pos >= len(body) or _PARTIAL_TOKEN.fullmatch(body, error.pos) is not None
    except (ValueError, RecursionError):
        return False
    return False  # a whole JSON text: finished


def _refuse(constant: str) -> object:
    """NaN and Infinity are not JSON: such a text is no envelope."""
    raise ValueError(f"not JSON: {constant}")
