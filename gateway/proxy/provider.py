"""What differs between providers, behind one protocol: keys, URLs, calls, usage, errors.

Each provider module (openai, anthropic, gemini) is a `Provider`: how a client presents
its proxy key, how the upstream wants its key, which requests are LLM calls (and their
model and conversation), where usage is reported, and how errors look, so an official
SDK reads a refusal as its own provider's error.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from aiohttp import web
from multidict import CIMultiDict, MultiMapping

from gateway.app.jsonbody import parse_json
from gateway.config.limits import MAX_TOKENS

ErrorKind = Literal[
    "refused", "bad_request", "unauthorized", "not_found", "unreachable", "timeout", "unavailable"
]
"""What went wrong; `unavailable`: the proxy's own shared state is unreachable (503)."""
ERROR_STATUS: Mapping[ErrorKind, int] = {
    "refused": 429,
    "bad_request": 400,
    "unauthorized": 401,
    "not_found": 404,
    "unreachable": 502,
    "timeout": 504,
    "unavailable": 503,
}
Message = Mapping[str, object]

# Never forwarded upstream: hop-by-hop headers, the client's credentials (the proxy key),
# our own headers, and Accept-Encoding (an identity body lets the proxy read usage).
_REQUEST_DROP = frozenset(
    {
        "host",
        "content-length",
        "connection",
        "keep-alive",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "authorization",
        "x-api-key",
        "x-goog-api-key",
        "api-key",
        "cookie",
        "accept-encoding",
    }
)
# Never returned to the client: hop-by-hop headers, lengths and dates the proxy's server
# sets itself, cookies for the upstream's domain, and anything credential-like.
_RESPONSE_DROP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "content-length",
        "date",
        "server",
        "set-cookie",
        "authorization",
        "x-api-key",
        "x-goog-api-key",
        "api-key",
    }
)
OWN_HEADER_PREFIX = "x-loopwarden-"


@dataclass(frozen=True, slots=True)
class GuardedCall:
    """What the proxy reads from one LLM request: the model, the conversation, streaming.

    `max_output` is the request's own bound on output tokens (`max_tokens` or the
    provider's name for it), which the budgets' estimate uses; None when it set none.
    """

    model: str
    messages: Sequence[Message]
    stream: bool
    max_output: int | None = None


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens a response reported (None: not reported)."""

    input_tokens: int | None = None
    output_tokens: int | None = None

    def merge(self, other: Usage) -> Usage:
        """The larger count of each: streamed usage is cumulative."""
        return Usage(
            _larger(self.input_tokens, other.input_tokens),
            _larger(self.output_tokens, other.output_tokens),
        )


def _larger(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    if b is None:
        return a
    return max(a, b)


class Provider(Protocol):
    """One provider's wire conventions."""

    @property
    def name(self) -> str:
        """The route prefix and upstream name: "openai", "anthropic" or "gemini"."""

    def credential(self, headers: Mapping[str, str], query: Mapping[str, str]) -> str | None:
        """The key the client presented, as its SDK sends it."""

    def upstream_url(self, base_url: str, tail: str) -> str:
        """The upstream URL of a proxied path (`tail`: the encoded canonical path)."""

    def upstream_query(self, query: MultiMapping[str]) -> list[tuple[str, str]]:
        """The query string to forward (without any key the client put there)."""

    def upstream_auth(self, api_key: str | None, headers: Mapping[str, str]) -> dict[str, str]:
        """The headers that authenticate the proxy upstream (and required defaults)."""

    def describe(self, method: str, tail: str, body: bytes) -> GuardedCall | None:
        """The LLM call a request makes, or None for requests forwarded unguarded.

        Raises JsonBodyError when an LLM call's body is not acceptable JSON.
        """

    def usage(self, data: object) -> Usage | None:
        """The usage reported in one response object or stream event, if any."""

    def status(self, kind: ErrorKind) -> int:
        """The HTTP status of an error of this kind (its clients' retry rules differ)."""

    def error_body(self, kind: ErrorKind, code: str, message: str) -> Mapping[str, object]:
        """An error in the provider's own format."""


def error_response(
    provider: Provider,
    kind: ErrorKind,
    code: str,
    message: str,
    headers: Mapping[str, str] | None = None,
) -> web.Response:
    """An error answer in the provider's own format; a client error is never retried."""
    extra = dict(headers or {})
    if kind in ("bad_request", "unauthorized", "not_found"):
        extra.setdefault("x-should-retry", "false")
    return web.json_response(
        provider.error_body(kind, code, message), status=provider.status(kind), headers=extra
    )


def forward_headers(headers: Mapping[str, str]) -> CIMultiDict[str]:
    """The client's headers that go upstream (credentials and hop-by-hop ones dropped)."""
    kept: CIMultiDict[str] = CIMultiDict()
    for name, value in headers.items():
        lowered = name.lower()
        if lowered in _REQUEST_DROP or lowered.startswith(OWN_HEADER_PREFIX):
            continue
        kept.add(name, value)
    kept["Accept-Encoding"] = "identity"
    return kept


def response_headers(headers: Mapping[str, str], secrets: Sequence[str]) -> CIMultiDict[str]:
    """The upstream's response headers that go back to the client.

    Besides the dropped names, a header whose value holds an upstream key is dropped:
    an upstream echoing a credential must not hand it to the client.
    """
    kept: CIMultiDict[str] = CIMultiDict()
    shortest, holds_secret = _secret_search(tuple(secrets))
    for name, value in headers.items():
        if name.lower() in _RESPONSE_DROP:
            continue
        # A value shorter than every secret holds none: most headers are not searched.
        if len(value) >= shortest and holds_secret(value):
            continue
        kept.add(name, value)
    return kept


@functools.lru_cache(maxsize=16)
def _secret_search(secrets: tuple[str, ...]) -> tuple[int, Callable[[str], object]]:
    """The shortest secret's length, and one search for any of them (built once per set)."""
    if not secrets:
        return 0, _finds_nothing
    pattern = re.compile("|".join(re.escape(secret) for secret in secrets))
    return min(map(len, secrets)), pattern.search


def _finds_nothing(value: str) -> object:
    """The search when the upstream has no key: nothing to find."""
    return None


def bearer(headers: Mapping[str, str]) -> str | None:
    """The token of an `Authorization: Bearer …` header."""
    scheme, _, token = headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


def json_object(body: bytes) -> dict[str, object] | None:
    """A request body as a JSON object, None when empty or another JSON value.

    Hostile JSON (not UTF-8, too deep, a 5,000-digit number, NaN) raises JsonBodyError:
    an LLM call is never forwarded unguarded because the proxy could not read it.
    """
    if not body:
        return None
    data = parse_json(body)
    return data if isinstance(data, dict) else None


def message_list(value: object) -> list[Message] | None:
    """A conversation: a list of message objects (None when it is not one)."""
    if not isinstance(value, list):
        return None
    return [item if isinstance(item, dict) else {"content": item} for item in value]


def count(value: object) -> int | None:
    """A token count from a usage object or a request: a whole number 0 to MAX_TOKENS.

    Anything else (a bool, a float, a negative or absurd number) is no count: an
    upstream's malformed usage is then charged by the estimate, never credited.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if 0 <= value <= MAX_TOKENS else None


def first_count(data: Mapping[str, object], *names: str) -> int | None:
    """The first of these fields of a request body that holds a token count."""
    return next((found for name in names if (found := count(data.get(name))) is not None), None)


def total(*values: object) -> int | None:
    """The sum of the counts given, None when none was given."""
    counts = [c for c in map(count, values) if c is not None]
    return sum(counts) if counts else None
