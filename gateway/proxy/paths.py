"""The one canonical spelling of a proxied path: what is guarded is exactly what is forwarded.

The path after a route prefix (`/openai/v1/`, `/anthropic/`, `/gemini/`) reaches the
proxy percent-decoded once (aiohttp decodes the request path, `%2F` included). Its
canonical form:
- is refused (`PathError`, a 400) when the decoded path still holds a `%` (a
  double-encoded or non-UTF-8 byte), a `?`, `#` or `;` (an encoded query, fragment or
  path parameter), a backslash, or a space or control character (NUL included);
- has empty segments dropped (so `//` collapses, and a leading or trailing `/` goes),
  `.` segments dropped, and each `..` resolved against the segment before it;
- is refused when a `..` would climb above the route's root, so a path never leaves the
  upstream's `base_url`.
The guard reads the canonical path, and the upstream gets exactly it, percent-encoded
again where a path needs it (`upstream_path`), never re-normalised by the HTTP client.
"""

from __future__ import annotations

import re
from functools import lru_cache
from urllib.parse import quote

from gateway.app.errors import LoopwardenError

# Characters a decoded path may not hold, and why, for the error message.
_REFUSED = re.compile(r"[%?#;\\\x00-\x20\x7f]")
_WHY = {
    "%": "a percent sign (double encoding)",
    "?": "an encoded '?'",
    "#": "an encoded '#'",
    ";": "a ';' path parameter",
    "\\": "a backslash",
}
# What a path segment keeps unencoded (RFC 3986 pchar, minus the refused ';').
_SAFE = "/:@!$&'()*+,=~"


class PathError(LoopwardenError, ValueError):
    """A proxied path that has no canonical form under the upstream; the message says why."""


# Clients call a handful of paths: each is worked out once (a refused one every time).
@lru_cache(maxsize=256)
def canonical_path(decoded: str) -> str:
    """The canonical form of a decoded path after the route prefix (no leading `/`)."""
    refused = _REFUSED.search(decoded)
    if refused is not None:
        char = refused.group()
        raise PathError(f"the path holds {_WHY.get(char, 'a space or control character')}")
    segments: list[str] = []
    for segment in decoded.split("/"):
        if segment in ("", "."):
            continue
        if segment != "..":
            segments.append(segment)
        elif segments:
            segments.pop()
        else:
            raise PathError("the path climbs above its route with '..'")
    return "/".join(segments)


def upstream_path(canonical: str) -> str:
    """A canonical path percent-encoded for the upstream URL (non-ASCII as UTF-8)."""
    return quote(canonical, safe=_SAFE)
