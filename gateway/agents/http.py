"""The `http` agent: any service answers the turn, POSTed to its `url` as signed JSON.

The body is `{bot, room, thread, message: {id, sender_id, sender_name, sender_is_bot,
text, mentions_bot, is_direct}, history: [{role, name, text}]}` (DESIGN.md §3), signed like
Slack: `X-Loopwarden-Timestamp` (unix seconds) and `X-Loopwarden-Signature: v1=<hex
HMAC-SHA256 of "v1:<timestamp>:<body>">` with the agent's `secret`. The service answers
200 `{"reply": "text"}`, or `{"reply": null}` / 204 for silence; the reply then passes the
silence filter and delivery like any agent's. A receiver checks a request with
`verify_signature`.

Decisions where DESIGN.md is silent:
- `Idempotency-Key` is the message id made unique across rooms and bots,
  `<bot>:<platform>:<channel>:<message id>` (Telegram numbers messages per chat, and two
  hosted bots see the same message): the same on every retry of the turn, different for
  every other turn.
- The body is ASCII JSON (`\\u` escapes), so any message text, even one holding a lone
  surrogate, encodes; each attempt is signed with its own timestamp, so a retry after a
  backoff is still inside the receiver's tolerance.
- Only 200 and 204 are answers. A 5xx, a timeout (`timeout` per attempt, reading the
  body included) or a dropped connection is retried up to `max_attempts` in all, after
  0.5 s, 1 s, 2 s… (at most 8 s); any other status, 429 and other 2xx included, ends the
  turn at once.
- Redirects are not followed, to the same host or another: the room's transcript goes
  only to the configured `url`. A 3xx ends the turn, and the log says to set `url` to the
  final address.
- An answer is read up to `MAX_ANSWER_BYTES` (1 MiB), declared or sent, and must be a
  JSON object (`gateway.app.jsonbody.parse_json`: UTF-8, nesting, huge numbers) whose `reply`
  is a string or null; other keys are ignored, so a service may add its own.
- A failed turn posts `messages.HTTP_AGENT_DOWN` and logs one warning naming the agent,
  the url's origin (its path may carry a token, as n8n webhook paths do) and why; never
  the secret or the answer's body.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING
from urllib.parse import quote

import aiohttp
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt
from tenacity.wait import wait_exponential
from yarl import URL

from gateway.app import messages
from gateway.app.errors import LoopwardenError
from gateway.app.jsonbody import JsonBodyError, parse_json
from gateway.app.types import AgentResult, InboundMessage
from gateway.config import HttpAgentConfig

if TYPE_CHECKING:
    from gateway.app.context import TurnContext

log = logging.getLogger("loopwarden.agents.http")

TIMESTAMP_HEADER = "X-Loopwarden-Timestamp"
SIGNATURE_HEADER = "X-Loopwarden-Signature"
IDEMPOTENCY_HEADER = "Idempotency-Key"
SIGNATURE_VERSION = "v1"
MAX_ANSWER_BYTES = 1 << 20
DEFAULT_TOLERANCE = 300.0
"""Seconds a signed request stays acceptable to `verify_signature`: older ones are replays."""

# Plain ASCII digits, at most 12: no look-alike digit, sign, space or 5,000-digit number.
_TIMESTAMP = re.compile(r"[0-9]{1,12}")
_READ_CHUNK = 64 * 1024

Sleep = Callable[[float], Awaitable[None]]
Clock = Callable[[], float]
SessionFactory = Callable[[], aiohttp.ClientSession]


def sign(secret: str | bytes, timestamp: str, body: bytes) -> str:
    """The X-Loopwarden-Signature of `body` sent at `timestamp`: `v1=<hex HMAC-SHA256>`."""
    key = secret.encode() if isinstance(secret, str) else secret
    signed = f"{SIGNATURE_VERSION}:{timestamp}:".encode() + body
    return f"{SIGNATURE_VERSION}=" + hmac.new(key, signed, hashlib.sha256).hexdigest()


def verify_signature(
    secret: str | bytes,
    headers: Mapping[str, str],
    body: bytes | str,
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    now: float | None = None,
) -> bool:
    """True when `headers` sign `body` with `secret`, sent within `tolerance` s of `now`.

    For the services that receive `http` agent turns. `headers` is any mapping (a dict,
    aiohttp's `request.headers`), read case-insensitively; `body` is the raw request body.
    A missing or repeated header, a timestamp that is not plain digits, or one further
    than `tolerance` seconds from `now` (default: the current time) is refused, so a
    captured request cannot be replayed later. The signatures are compared in constant time.
    """
    timestamp = _single_header(headers, TIMESTAMP_HEADER)
    given = _single_header(headers, SIGNATURE_HEADER)
    if timestamp is None or given is None or not _TIMESTAMP.fullmatch(timestamp):
        return False
    current = time.time() if now is None else now
    if not abs(current - int(timestamp)) <= tolerance:  # `not <=` also refuses a nan
        return False
    raw = body.encode() if isinstance(body, str) else body
    expected = sign(secret, timestamp, raw)
    return hmac.compare_digest(expected.encode(), given.encode("utf-8", "replace"))


def _single_header(headers: Mapping[str, str], name: str) -> str | None:
    """The one value of header `name` (any case); None when it is absent or given twice."""
    wanted = name.lower()
    found: list[object] = [value for key, value in headers.items() if str(key).lower() == wanted]
    if len(found) != 1 or not isinstance(found[0], str):
        return None
    return found[0]


def turn_payload(turn: TurnContext) -> dict[str, object]:
    """The JSON the service receives for one turn: the message and the room's history."""
    msg = turn.message
    return {
        "bot": turn.bot.id,
        "room": msg.room,
        "thread": msg.thread_id,
        "message": {
            "id": msg.message_id,
            "sender_id": msg.sender_id,
            "sender_name": msg.sender_name,
            "sender_is_bot": msg.sender_is_bot,
            "text": msg.text,
            "mentions_bot": msg.mentions_bot,
            "is_direct": msg.is_direct,
        },
        "history": [
            {"role": entry.role, "name": entry.name, "text": entry.text} for entry in turn.history
        ],
    }


def idempotency_key(msg: InboundMessage) -> str:
    """`<bot>:<platform>:<channel>:<message id>`, percent-encoded to stay a valid header."""
    return quote(f"{msg.bot_id}:{msg.message_key}", safe=":@")


class _CallFailed(LoopwardenError):
    """One attempt that got no usable answer: why (for the log) and whether to try again."""

    def __init__(self, reason: str, *, transient: bool) -> None:
        super().__init__(reason)
        self.transient = transient


def _is_transient(exc: BaseException) -> bool:
    return isinstance(exc, _CallFailed) and exc.transient


class HttpAgent:
    """Answers a turn by POSTing it to a service and reading back its `reply`."""

    def __init__(
        self,
        name: str,
        config: HttpAgentConfig,
        *,
        session_factory: SessionFactory = aiohttp.ClientSession,
        sleep: Sleep = asyncio.sleep,
        clock: Clock = time.time,
    ) -> None:
        self.name = name
        self._url = config.url
        self._origin = str(URL(config.url).origin())
        self._secret = config.secret.get_secret_value()
        self._timeout = config.timeout
        self._max_attempts = config.max_attempts
        self._session_factory = session_factory
        self._session: aiohttp.ClientSession | None = None
        self._sleep = sleep
        self._clock = clock

    async def respond(self, turn: TurnContext) -> AgentResult:
        """POST the turn, retrying 5xx and timeouts; any other failure is a short notice."""
        body = json.dumps(turn_payload(turn), separators=(",", ":")).encode()
        key = idempotency_key(turn.message)
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self._max_attempts),
            wait=wait_exponential(multiplier=0.5, max=8),
            retry=retry_if_exception(_is_transient),
            sleep=self._sleep,
            reraise=True,
        )
        try:
            reply: str | None = await retrying(self._attempt, body, key)
        except _CallFailed as exc:
            attempts = retrying.statistics.get("attempt_number", 1)
            log.warning(
                "agent %s: %s %s (attempt %d of %d); the turn ends with a notice",
                self.name,
                self._origin,
                exc,
                attempts,
                self._max_attempts,
            )
            return AgentResult(text=messages.HTTP_AGENT_DOWN)
        return AgentResult(text=reply)

    async def aclose(self) -> None:
        """Close the HTTP session (a later turn opens a new one)."""
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    def _client(self) -> aiohttp.ClientSession:
        """The agent's one HTTP session, created on first use (it needs a running loop)."""
        if self._session is None or self._session.closed:
            self._session = self._session_factory()
        return self._session

    async def _attempt(self, body: bytes, key: str) -> str | None:
        """One signed POST; its reply, or _CallFailed saying why there is none."""
        timestamp = str(int(self._clock()))
        headers = {
            "Content-Type": "application/json",
            TIMESTAMP_HEADER: timestamp,
            SIGNATURE_HEADER: sign(self._secret, timestamp, body),
            IDEMPOTENCY_HEADER: key,
        }
        try:
            async with self._client().post(
                self._url,
                data=body,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=self._timeout),
                allow_redirects=False,
            ) as response:
                return await _read_reply(response)
        except TimeoutError:
            took = f"did not answer within {self._timeout:g} s"
            raise _CallFailed(took, transient=True) from None
        except aiohttp.ClientError as exc:
            raise _CallFailed(f"connection failed ({type(exc).__name__})", transient=True) from None


async def _read_reply(response: aiohttp.ClientResponse) -> str | None:
    """The `reply` of a service's answer (None: silence), or _CallFailed saying what is wrong."""
    status = response.status
    if status == 204:
        return None
    if status >= 500:
        raise _CallFailed(f"answered HTTP {status}", transient=True)
    if 300 <= status < 400:
        raise _CallFailed(
            f"answered a redirect (HTTP {status}), which is not followed; "
            "set url to the final address",
            transient=False,
        )
    if status != 200:
        raise _CallFailed(f"answered HTTP {status} (expected 200 or 204)", transient=False)
    try:
        answer = parse_json(await _read_capped(response))
    except JsonBodyError as exc:
        raise _CallFailed(f"answered a body that is refused: {exc}", transient=False) from None
    if not isinstance(answer, dict) or "reply" not in answer:
        raise _CallFailed('answered something other than {"reply": ...}', transient=False)
    reply = answer["reply"]
    if reply is not None and not isinstance(reply, str):
        kind = type(reply).__name__
        raise _CallFailed(
            f'answered a "reply" of type {kind}, not a string or null', transient=False
        )
    return reply


async def _read_capped(response: aiohttp.ClientResponse) -> bytes:
    """The answer's body, refused (JsonBodyError) once it is over MAX_ANSWER_BYTES."""
    too_large = JsonBodyError(f"body is larger than {MAX_ANSWER_BYTES} bytes")
    declared = response.content_length
    if declared is not None and declared > MAX_ANSWER_BYTES:
        raise too_large
    body = bytearray()
    async for chunk in response.content.iter_chunked(_READ_CHUNK):
        body += chunk
        if len(body) > MAX_ANSWER_BYTES:
            raise too_large
    return bytes(body)
