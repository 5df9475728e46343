"""A local fake LLM provider speaking OpenAI, Anthropic and Gemini, over real loopback HTTP.

Serves what the proxy forwards to: OpenAI `POST /v1/chat/completions` (a completion, or
SSE chunks ending in `data: [DONE]`, with a usage chunk when `stream_options.
include_usage`) and `GET /v1/models`; Anthropic `POST /v1/messages` (a message, or the
SSE events message_start … message_stop); Gemini `POST /v1beta/models/{model}:
generateContent` and `:streamGenerateContent` (SSE with `alt=sse`, else a JSON array)
and `GET /v1beta/models`.
Every answer carries usage, so cost can be checked. Any other path is recorded too and
answered 404, so a test sees every request that reached the upstream host.

Hooks: `requests` records everything received; `fail_next(status, n)` answers the next n
LLM calls with an error in the provider's format (with a `reason` phrase if given);
`drop_next(n)` closes the connection
of the next n LLM calls without answering; `stall_next(n)` leaves the next n unanswered
until the fake shuts down; `break_next_stream()` sends one chunk of the
next stream and then drops the connection; `gate` (an asyncio.Event) holds every stream
after its first chunk until the test sets it; `echo_auth` puts the credential the fake
received into a response header and the body (an SSE comment in streams), as a careless
provider might; `echo_encoded` also echoes it percent-encoded and base64-encoded, and
escapes every `/` in JSON bodies as `\\/` (as PHP does); `encoding` ("gzip",
"deflate", or any other name, sent as a label on a plain body) compresses every answer
whatever the request's Accept-Encoding says.

Scripted answers, for tests of an agent's own loop: `enqueue(*responses)` queues answers
to OpenAI chat completions, served in order before the default reply, and `responder`,
when set, answers every one of them (`text_response`, `tool_call_response`,
`error_response` and `hang_response` build them); the failure hooks above come first. A
request with `stream: true` gets a scripted completion as SSE chunks: its content in
`chunks` pieces, each tool call as a first delta (index, id, name) and its arguments in
pieces, then the finish reason and `[DONE]`; `stream_bodies` queues raw SSE bodies (for
unreadable streams), served before everything else scripted.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any
from urllib.parse import quote

from aiohttp import web
from aiohttp.web_response import ContentCoding

from tests.fakes.loopback import LOOPBACK_HOST, serve_loopback

Json = dict[str, Any]

INPUT_TOKENS = 11
OUTPUT_TOKENS = 7
_ids = itertools.count(1)


@dataclass(frozen=True, slots=True)
class Received:
    """One request the fake received."""

    method: str
    path: str
    raw_path: str
    query: Mapping[str, str]
    headers: Mapping[str, str]
    body: bytes

    def json(self) -> Json:
        """The body as JSON (an empty object when there is none)."""
        data: Json = json.loads(self.body) if self.body else {}
        return data

    @property
    def messages(self) -> list[Json]:
        """The chat messages of the request."""
        messages: list[Json] = self.json().get("messages", [])
        return messages

    @property
    def tool_messages(self) -> list[Json]:
        """The `role: tool` messages (the tool results fed back to the model)."""
        return [m for m in self.messages if m.get("role") == "tool"]


@dataclass(frozen=True, slots=True)
class FakeResponse:
    """One scripted answer: a status, a JSON body and headers; `hang` never answers."""

    status: int = 200
    body: Mapping[str, Any] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)
    hang: bool = False


Responder = Callable[[Received], FakeResponse]


def text_response(content: str | None, *, finish_reason: str = "stop") -> FakeResponse:
    """A completion whose message is plain text."""
    message: Json = {"role": "assistant", "content": content}
    return _completion(message, finish_reason)


def tool_call_response(*calls: tuple[str, Mapping[str, Any] | str]) -> FakeResponse:
    """A completion asking for tool calls, each `(name, arguments)`, with fresh call ids."""
    tool_calls = [
        {
            "id": f"call_{next(_ids):024x}",
            "type": "function",
            "function": {
                "name": name,
                "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
            },
        }
        for name, arguments in calls
    ]
    message: Json = {"role": "assistant", "content": None, "tool_calls": tool_calls}
    return _completion(message, "tool_calls")


def error_response(
    status: int, *, retry_after: float | None = None, message: str = "fake error"
) -> FakeResponse:
    """An OpenAI-format error, with a Retry-After header when given."""
    headers = {} if retry_after is None else {"Retry-After": f"{retry_after:g}"}
    body = {"error": {"message": message, "type": "fake_error", "code": str(status)}}
    return FakeResponse(status=status, body=body, headers=headers)


def hang_response() -> FakeResponse:
    """An answer that never comes (the client's timeout must fire)."""
    return FakeResponse(hang=True)


def _completion(message: Json, finish_reason: str) -> FakeResponse:
    body = {
        "id": f"chatcmpl-{next(_ids)}",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": "fake-model",
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }
    return FakeResponse(body=body)


@dataclass
class FakeLLM:
    """The fake provider; use as `async with FakeLLM() as fake:` and read `fake.url`."""

    reply: str = "pong"
    chunks: int = 3
    echo_auth: bool = False
    echo_encoded: bool = False
    encoding: str | None = None
    gate: asyncio.Event | None = None
    responder: Responder | None = None
    requests: list[Received] = field(default_factory=list)
    url: str = ""
    _script: deque[FakeResponse] = field(default_factory=deque)
    stream_bodies: deque[bytes] = field(default_factory=deque)
    _failures: list[tuple[int, float | None, str | None]] = field(default_factory=list)
    _drops: int = 0
    _breaks: int = 0
    _stalls: int = 0
    _released: asyncio.Event = field(default_factory=asyncio.Event)
    _runner: web.AppRunner | None = None
    first_chunk_sent: asyncio.Event = field(default_factory=asyncio.Event)

    async def __aenter__(self) -> FakeLLM:
        app = web.Application(middlewares=[self._encoded])
        app.router.add_post("/v1/chat/completions", self._openai)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/messages", self._anthropic)
        app.router.add_post("/v1beta/models/{call}", self._gemini)
        app.router.add_get("/v1beta/models", self._gemini_models)
        app.router.add_route("*", "/{anything:.*}", self._unknown)
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None)
        port = await serve_loopback(self._runner)
        self.url = f"http://{LOOPBACK_HOST}:{port}"
        return self

    @property
    def base_url(self) -> str:
        """The OpenAI-style base URL (`…/v1`) to configure an agent or SDK with."""
        return f"{self.url}/v1"

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.gate is not None:
            self.gate.set()
        self._released.set()
        if self._runner is not None:
            await self._runner.cleanup()

    # Hooks

    def fail_next(
        self,
        status: int,
        count: int = 1,
        *,
        retry_after: float | None = None,
        reason: str | None = None,
    ) -> None:
        """Answer the next `count` LLM calls with `status` (and `reason` as its phrase)."""
        self._failures.extend([(status, retry_after, reason)] * count)

    def enqueue(self, *responses: FakeResponse) -> None:
        """Queue scripted answers to chat completions, served in order."""
        self._script.extend(responses)

    def drop_next(self, count: int = 1) -> None:
        """Close the connection of the next `count` LLM calls without an answer."""
        self._drops += count

    def stall_next(self, count: int = 1) -> None:
        """Answer the next `count` LLM calls only when the fake shuts down."""
        self._stalls += count

    def break_next_stream(self) -> None:
        """Send one chunk of the next stream, then drop the connection."""
        self._breaks += 1

    def calls(self, path: str) -> list[Received]:
        """The requests received on one path."""
        return [r for r in self.requests if r.path == path]

    # Plumbing

    async def _record(self, request: web.Request) -> Received:
        received = Received(
            method=request.method,
            path=request.path,
            raw_path=request.rel_url.raw_path,
            query=dict(request.query),
            headers=dict(request.headers),
            body=await request.read(),
        )
        self.requests.append(received)
        return received

    def _credential(self, received: Received) -> str:
        headers = {k.lower(): v for k, v in received.headers.items()}
        return (
            headers.get("authorization")
            or headers.get("x-api-key")
            or headers.get("x-goog-api-key")
            or ""
        )

    async def _scripted(
        self, request: web.Request, received: Received, error: Json
    ) -> web.StreamResponse | None:
        """A scripted failure for this call, if one is due."""
        if self._stalls:
            self._stalls -= 1
            await self._released.wait()
            return web.Response(status=599)
        if self._drops:
            self._drops -= 1
            if request.transport is not None:
                request.transport.close()
            return web.Response(status=599)
        if self._failures:
            status, retry_after, reason = self._failures.pop(0)
            headers = {"Retry-After": str(retry_after)} if retry_after is not None else {}
            return web.json_response(error, status=status, reason=reason, headers=headers)
        return None

    @web.middleware
    async def _encoded(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        response = await handler(request)
        if not response.prepared:
            self._encode(response)
        return response

    def _encode(self, response: web.StreamResponse) -> None:
        """Compress (or label) an answer as `encoding` says, before it is prepared."""
        if self.encoding in ("gzip", "deflate"):
            response.enable_compression(force=ContentCoding(self.encoding))
        elif self.encoding is not None:
            response.headers["Content-Encoding"] = self.encoding

    async def _unknown(self, request: web.Request) -> web.Response:
        await self._record(request)
        return web.json_response({"error": "no such path"}, status=404)

    def _json(self, data: object, received: Received) -> web.Response:
        """A JSON answer; with `echo_encoded`, every `/` escaped as PHP does."""
        if not self.echo_encoded:
            return web.json_response(data, headers=self._headers(received))
        text = json.dumps(data).replace("/", "\\/")
        return web.json_response(text=text, headers=self._headers(received))

    def _echoes(self, received: Received) -> list[str]:
        """The credential as echoed: as is, and with `echo_encoded` encoded too."""
        credential = self._credential(received)
        if not self.echo_encoded:
            return [credential]
        encoded = credential.encode()
        return [
            credential,
            quote(credential, safe=""),
            base64.b64encode(encoded).decode(),
            base64.urlsafe_b64encode(b"x" + encoded).decode(),
        ]

    def _headers(self, received: Received) -> dict[str, str]:
        if not self.echo_auth:
            return {}
        names = ["x-echo-auth", "x-echo-auth-pct", "x-echo-auth-b64", "x-echo-auth-b64url"]
        return dict(zip(names, self._echoes(received), strict=False))

    def _text(self, received: Received, *, stream: bool = False) -> str:
        # Streams echo the credential in an SSE comment instead (see `_stream`).
        if self.echo_auth and not stream:
            return f"{self.reply} ({' '.join(self._echoes(received))})"
        return self.reply

    async def _stream(
        self, request: web.Request, received: Received, events: AsyncIterator[bytes]
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", **self._headers(received)}
        )
        self._encode(response)
        await response.prepare(request)
        if self.echo_auth:
            await response.write(f": echo {' '.join(self._echoes(received))}\n\n".encode())
        first = True
        async for event in events:
            await response.write(event)
            if first:
                first = False
                self.first_chunk_sent.set()
                if self._breaks:
                    self._breaks -= 1
                    if request.transport is not None:
                        request.transport.close()
                    return response
                if self.gate is not None:
                    await self.gate.wait()
        await response.write_eof()
        return response

    def _pieces(self, text: str) -> list[str]:
        size = max(1, -(-len(text) // self.chunks))
        return [text[i : i + size] for i in range(0, len(text), size)]

    # OpenAI

    async def _models(self, request: web.Request) -> web.Response:
        received = await self._record(request)
        models = {"object": "list", "data": [{"id": "gpt-4o-mini", "object": "model"}]}
        return web.json_response(models, headers=self._headers(received))

    async def _openai(self, request: web.Request) -> web.StreamResponse:
        received = await self._record(request)
        error = {"error": {"message": "fake failure", "type": "server_error", "code": None}}
        scripted = await self._scripted(request, received, error)
        if scripted is not None:
            return scripted
        if self.stream_bodies or self.responder is not None or self._script:
            return await self._scripted_completion(request, received)
        body = received.json()
        model = body.get("model", "gpt-4o-mini")
        usage = {
            "prompt_tokens": INPUT_TOKENS,
            "completion_tokens": OUTPUT_TOKENS,
            "total_tokens": INPUT_TOKENS + OUTPUT_TOKENS,
        }
        text = self._text(received, stream=bool(body.get("stream")))
        if not body.get("stream"):
            completion = {
                "id": "chatcmpl-fake1",
                "object": "chat.completion",
                "created": 1_700_000_000,
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": text},
                        "finish_reason": "stop",
                    }
                ],
                "usage": usage,
            }
            return self._json(completion, received)
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

        async def events() -> AsyncIterator[bytes]:
            base = {
                "id": "chatcmpl-fake1",
                "object": "chat.completion.chunk",
                "created": 1_700_000_000,
                "model": model,
            }
            for piece in self._pieces(text):
                choice = {"index": 0, "delta": {"content": piece}, "finish_reason": None}
                yield _sse({**base, "choices": [choice]})
            done = {"index": 0, "delta": {}, "finish_reason": "stop"}
            yield _sse({**base, "choices": [done]})
            if include_usage:
                yield _sse({**base, "choices": [], "usage": usage})
            yield b"data: [DONE]\n\n"

        return await self._stream(request, received, events())

    async def _scripted_completion(
        self, request: web.Request, received: Received
    ) -> web.StreamResponse:
        """A scripted answer: a raw stream body, else a completion (streamed when asked)."""
        if self.stream_bodies:
            return await self._stream(request, received, _once(self.stream_bodies.popleft()))
        try:
            streamed = bool(received.json().get("stream"))
        except ValueError:
            streamed = False
        answer = await self._script_answer(received)
        if isinstance(answer, web.Response):
            return answer
        if streamed and answer.status == 200:
            return await self._stream(request, received, self._streamed(answer))
        return web.json_response(
            dict(answer.body), status=answer.status, headers=dict(answer.headers)
        )

    async def _script_answer(self, received: Received) -> FakeResponse | web.Response:
        """The responder's answer, else the next queued one; a hang waits for shutdown."""
        answer = self.responder(received) if self.responder is not None else self._script.popleft()
        if answer.hang:
            await self._released.wait()
            return web.json_response({"error": {"message": "shutting down"}}, status=503)
        return answer

    async def _streamed(self, answer: FakeResponse) -> AsyncIterator[bytes]:
        """A scripted completion as chat.completion.chunk events (an error stays an error)."""
        base = {"id": answer.body.get("id", "chatcmpl-fake"), "object": "chat.completion.chunk"}
        [choice] = answer.body["choices"]
        message = choice["message"]
        for piece in self._pieces(message.get("content") or ""):
            yield _sse({**base, "choices": [{"index": 0, "delta": {"content": piece}}]})
        for index, call in enumerate(message.get("tool_calls") or ()):
            head = {"index": index, "id": call["id"], "type": "function"}
            head["function"] = {"name": call["function"]["name"], "arguments": ""}
            yield _sse({**base, "choices": [{"index": 0, "delta": {"tool_calls": [head]}}]})
            for piece in self._pieces(call["function"]["arguments"]):
                delta = {"tool_calls": [{"index": index, "function": {"arguments": piece}}]}
                yield _sse({**base, "choices": [{"index": 0, "delta": delta}]})
        done = {"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}
        yield _sse({**base, "choices": [done]})
        yield b"data: [DONE]\n\n"

    # Anthropic

    async def _anthropic(self, request: web.Request) -> web.StreamResponse:
        received = await self._record(request)
        error = {"type": "error", "error": {"type": "api_error", "message": "fake failure"}}
        scripted = await self._scripted(request, received, error)
        if scripted is not None:
            return scripted
        body = received.json()
        model = body.get("model", "claude-sonnet-4")
        text = self._text(received, stream=bool(body.get("stream")))
        message: Json = {
            "id": "msg_fake1",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [{"type": "text", "text": text}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": INPUT_TOKENS, "output_tokens": OUTPUT_TOKENS},
        }
        if not body.get("stream"):
            return self._json(message, received)

        async def events() -> AsyncIterator[bytes]:
            start = {
                **message,
                "content": [],
                "stop_reason": None,
                "usage": {"input_tokens": INPUT_TOKENS, "output_tokens": 1},
            }
            block = {"type": "text", "text": ""}
            # The first write carries the first text, so a held stream has shown some text.
            prelude = _event("message_start", {"type": "message_start", "message": start})
            prelude += _event(
                "content_block_start",
                {"type": "content_block_start", "index": 0, "content_block": block},
            )
            for piece in self._pieces(text):
                delta = {"type": "text_delta", "text": piece}
                yield prelude + _event(
                    "content_block_delta",
                    {"type": "content_block_delta", "index": 0, "delta": delta},
                )
                prelude = b""
            yield _event("content_block_stop", {"type": "content_block_stop", "index": 0})
            yield _event(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                    "usage": {"output_tokens": OUTPUT_TOKENS},
                },
            )
            yield _event("message_stop", {"type": "message_stop"})

        return await self._stream(request, received, events())

    # Gemini

    async def _gemini_models(self, request: web.Request) -> web.Response:
        received = await self._record(request)
        models = {"models": [{"name": "models/gemini-2.0-flash"}]}
        return web.json_response(models, headers=self._headers(received))

    async def _gemini(self, request: web.Request) -> web.StreamResponse:
        received = await self._record(request)
        error = {"error": {"code": 500, "message": "fake failure", "status": "INTERNAL"}}
        scripted = await self._scripted(request, received, error)
        if scripted is not None:
            return scripted
        model, _, method = request.match_info["call"].partition(":")
        text = self._text(received, stream=method == "streamGenerateContent")

        def chunk(piece: str, final: bool) -> Json:
            candidate: Json = {"content": {"role": "model", "parts": [{"text": piece}]}, "index": 0}
            if final:
                candidate["finishReason"] = "STOP"
            return {
                "candidates": [candidate],
                "usageMetadata": {
                    "promptTokenCount": INPUT_TOKENS,
                    "candidatesTokenCount": OUTPUT_TOKENS if final else 1,
                    "totalTokenCount": INPUT_TOKENS + (OUTPUT_TOKENS if final else 1),
                },
                "modelVersion": model,
            }

        if method == "generateContent":
            return self._json(chunk(text, True), received)
        if method != "streamGenerateContent":
            return web.json_response({"error": {"code": 404, "status": "NOT_FOUND"}}, status=404)
        pieces = self._pieces(text)
        parts = [chunk(piece, i == len(pieces) - 1) for i, piece in enumerate(pieces)]
        if received.query.get("alt") != "sse":
            return web.json_response(parts, headers=self._headers(received))

        async def events() -> AsyncIterator[bytes]:
            for part in parts:
                yield b"data: " + json.dumps(part).encode() + b"\r\n\r\n"

        return await self._stream(request, received, events())


async def _once(body: bytes) -> AsyncIterator[bytes]:
    yield body


def _sse(data: Json) -> bytes:
    return b"data: " + json.dumps(data).encode() + b"\n\n"


def _event(name: str, data: Json) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()
