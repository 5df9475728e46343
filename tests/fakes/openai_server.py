"""A local fake OpenAI chat-completions server, scripted per test, over real loopback HTTP.

It speaks the wire format the `openai` agent (and the official SDK) use: POST
`/v1/chat/completions` in, a `chat.completion` object out whose `choices[0].message`
carries `content` or `tool_calls`, with `finish_reason` and `usage`. A test scripts the
answers as a queue (`enqueue`) or a callable (`responder`), reads back every request the
"model" received (`requests`), and can answer 429 with Retry-After, 5xx, or never.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from aiohttp import web

from tests.fakes.loopback import serve_loopback

_ids = itertools.count(1)


@dataclass(frozen=True, slots=True)
class FakeResponse:
    """One scripted answer: a status, a JSON body and headers; `hang` never answers."""

    status: int = 200
    body: Mapping[str, Any] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)
    hang: bool = False


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    """One request the fake received, as sent on the wire."""

    path: str
    headers: Mapping[str, str]
    body: Mapping[str, Any]

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The chat messages of the request."""
        messages: list[dict[str, Any]] = self.body.get("messages", [])
        return messages

    @property
    def tool_messages(self) -> list[dict[str, Any]]:
        """The `role: tool` messages (the tool results fed back to the model)."""
        return [m for m in self.messages if m.get("role") == "tool"]


def text_response(content: str | None, *, finish_reason: str = "stop") -> FakeResponse:
    """A completion whose message is plain text."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
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
    message: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": tool_calls}
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


def _completion(message: Mapping[str, Any], finish_reason: str) -> FakeResponse:
    body = {
        "id": f"chatcmpl-{next(_ids)}",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": "fake-model",
        "choices": [{"index": 0, "message": dict(message), "finish_reason": finish_reason}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }
    return FakeResponse(body=body)


Responder = Callable[[RecordedRequest], FakeResponse]


class FakeChatServer:
    """A chat-completions server on 127.0.0.1 (port 0) answering from a script.

    `responder`, when set, answers every request; otherwise queued responses are used in
    order, and an exhausted queue answers 400 so a test that sent too much fails loudly.
    """

    def __init__(self, responder: Responder | None = None) -> None:
        self.responder = responder
        self.requests: list[RecordedRequest] = []
        self._queue: deque[FakeResponse] = deque()
        self._closing = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self._port = 0

    def enqueue(self, *responses: FakeResponse) -> None:
        """Append scripted answers, served in order."""
        self._queue.extend(responses)

    @property
    def base_url(self) -> str:
        """The OpenAI-style base URL (`…/v1`) to configure an agent with."""
        return f"http://127.0.0.1:{self._port}/v1"

    async def start(self) -> None:
        """Bind to a free loopback port and serve."""
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._handle)
        self._runner = web.AppRunner(app, handle_signals=False)
        self._port = await serve_loopback(self._runner)

    async def aclose(self) -> None:
        """Release hung requests and stop serving."""
        self._closing.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> FakeChatServer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def _next_response(self, request: RecordedRequest) -> FakeResponse:
        if self.responder is not None:
            return self.responder(request)
        if self._queue:
            return self._queue.popleft()
        return error_response(400, message="fake server: no scripted response left")

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        recorded = RecordedRequest(path=request.path, headers=dict(request.headers), body=body)
        self.requests.append(recorded)
        response = self._next_response(recorded)
        if response.hang:
            await self._closing.wait()
            return web.json_response({"error": {"message": "shutting down"}}, status=503)
        return web.json_response(
            dict(response.body), status=response.status, headers=dict(response.headers)
        )
