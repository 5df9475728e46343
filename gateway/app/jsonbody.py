"""Parse a JSON body from outside (webhooks, admin API, proxy, websockets) safely.

Every route that reads JSON a client sent goes through `parse_json`, so every route gives
the same answer to hostile input: bytes that are not UTF-8, nesting deeper than
`MAX_DEPTH`, an integer longer than Python's digit limit, `NaN`/`Infinity` or a float
that overflows to infinity, a string holding a lone surrogate (`"\\ud800"` is valid JSON
but no Unicode text, so every store and log line would fail on it), and bodies over the
route's byte limit are all refused with `JsonBodyError`, whose message says why (never the
body itself). The C parser's own recursion limit stops the deepest documents; an
iterative walk then holds the rest to `MAX_DEPTH`, so code that walks a parsed value
recursively is safe.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator

from aiohttp import web

from gateway.app.errors import LoopwardenError

MAX_DEPTH = 64


class JsonBodyError(LoopwardenError, ValueError):
    """A request body is not acceptable JSON; the message says why, for a 400 answer."""


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise JsonBodyError(f"number {text[:20]!r} is out of range")
    return value


def _no_constant(name: str) -> float:
    raise JsonBodyError(f"{name} is not a JSON number")


# One decoder for every body: `json.loads` with hooks builds a new one per call.
_DECODER = json.JSONDecoder(parse_float=_finite_float, parse_constant=_no_constant)


# A `\uD800`-style escape: only then can a parsed string hold a lone surrogate.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _strings(value: object) -> Iterator[str]:
    """Every string in a parsed value, keys included (iterative walk)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def _deeper_than(value: object, limit: int) -> bool:
    """Whether a parsed value nests containers more than `limit` deep (iterative walk)."""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        children: list[object] | object = list(item.values()) if isinstance(item, dict) else item
        if isinstance(children, list):
            stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


def parse_json(
    body: bytes | str, *, max_bytes: int | None = None, max_depth: int = MAX_DEPTH
) -> object:
    """The value of a JSON document, or `JsonBodyError` saying why it is refused."""
    if max_bytes is not None and len(body) > max_bytes:
        raise JsonBodyError(f"body is larger than {max_bytes} bytes")
    if isinstance(body, bytes):
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise JsonBodyError(f"body is not UTF-8 (byte {exc.start})") from None
    else:
        text = body
    try:
        value = _DECODER.decode(text)
    except RecursionError:
        raise JsonBodyError(f"JSON is nested deeper than {max_depth} levels") from None
    except JsonBodyError:
        raise
    except json.JSONDecodeError as exc:
        raise JsonBodyError(
            f"not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    except ValueError as exc:
        raise JsonBodyError(f"not acceptable JSON: {str(exc).split(':')[0]}") from None
    if _SURROGATE_ESCAPE.search(text):
        for string in _strings(value):
            try:
                string.encode("utf-8")
            except UnicodeEncodeError:
                raise JsonBodyError("a string holds a lone surrogate (not Unicode text)") from None
    brackets = text.count("[") + text.count("{")
    if brackets > max_depth and isinstance(value, dict | list) and _deeper_than(value, max_depth):
        raise JsonBodyError(f"JSON is nested deeper than {max_depth} levels")
    return value


async def read_body(request: web.Request, max_bytes: int) -> bytes | None:
    """The request body, or None as soon as it is longer than `max_bytes` (a 413 to answer)."""
    try:
        # A clone reads the same stream under its own limit: the application has one limit
        # for all routes, and the admin API takes far less than a webhook.
        return await request.clone(client_max_size=max_bytes).read()
    except web.HTTPRequestEntityTooLarge:
        return None
