"""The demo's built-in model: a tiny OpenAI-compatible chat-completions server on loopback.

`loopwarden demo` starts it on 127.0.0.1 (a free port) before the gateway, stops it after
the gateway, and hands its URL to the demo's `openai` bots (`LOOPWARDEN_DEMO_MODEL_URL`
in connectors/room/demo.yaml), so the demo needs neither network nor key. Its answers
are canned and deterministic, chosen by the request's model name (`SCRIPTS`):
- `demo-finder` always calls `find_document` with the person's request as the query,
  so finder's turn repeats one call that never progresses until the LoopGuard halts it;
- `demo-oracle` always calls `read_inbox`, so oracle keeps sending the same request
  until the CallLoopGuard refuses the 6th;
- any other model gets one line of text naming the models it knows.

It also tells the terminal, in `[model]` lines, what of the guards only a model sees:
the loop guard's warning or block in the tool result it was sent, and a request that
is the same as the one before from that model (by the call guard's `fingerprint_call`).

Decisions where DESIGN.md is silent:
- Only `POST /v1/chat/completions` is served, and only unstreamed (`stream: true` is a
  400): the demo's bots do not stream.
- A body over 1 MiB is a 413; one that is not a chat request (not JSON, no model, no
  messages) is a 400 in OpenAI's error format naming the field, as a provider answers.
- The person's request is the last `user` message, without its "Name: " prefix and its
  @mentions, cut to 200 characters; finder searches for "invoice" when nothing is left.
- Tool-call ids count the answers served (`call_demo_1`, …): deterministic, and new for
  every answer as a provider's are (the call guard drops ids from its fingerprint).
- Repeats are tracked for the scripted models only, so a client sending endless model
  names cannot grow the table.
- Every answer reports `usage` as a provider's does: the request's bytes and the answer
  message's bytes counted as tokens the way the call guard estimates a refused call's
  (`BYTES_PER_TOKEN`), so the demo's Calls page shows tokens, and with demo.yaml's demo
  price, a cost and the cost its refusals saved.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType, TracebackType

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gateway.app.jsonbody import JsonBodyError, parse_json
from gateway.config import first_error
from gateway.proxy.pricing import BYTES_PER_TOKEN
from guards.call_loop import fingerprint_call

HOST = "127.0.0.1"
CHAT_PATH = "/v1/chat/completions"
MAX_BODY_BYTES = 1 << 20
MAX_REQUEST_CHARS = 200
UNKNOWN_MODEL = "I am loopwarden's demo model: I only know demo-finder and demo-oracle."

Report = Callable[[str], None]
Message = dict[str, object]

_MENTION = re.compile(r"@\w+")


def _search_for(request: str) -> dict[str, object]:
    return {"query": request or "invoice"}


def _no_arguments(request: str) -> dict[str, object]:
    return {}


@dataclass(frozen=True, slots=True)
class Script:
    """A model's canned answer: always a call to `tool`, its arguments made from the request."""

    tool: str
    arguments: Callable[[str], dict[str, object]]


SCRIPTS: Mapping[str, Script] = MappingProxyType(
    {
        "demo-finder": Script("find_document", _search_for),
        "demo-oracle": Script("read_inbox", _no_arguments),
    }
)


class _ChatRequest(BaseModel):
    """The part of a chat-completions request the demo model reads."""

    model_config = ConfigDict(frozen=True, extra="ignore", strict=True)

    model: str = Field(min_length=1, max_length=200)
    messages: list[Message] = Field(min_length=1)
    stream: bool = False


class DemoModel:
    """Serves the canned chat completions on 127.0.0.1 while started; `url` is its base URL."""

    def __init__(self, *, report: Report = lambda line: None) -> None:
        self._report = report
        self._runner: web.AppRunner | None = None
        self._served = 0
        self._last: dict[str, tuple[str, int]] = {}  # model → (last fingerprint, times in a row)
        self.url = ""

    async def start(self) -> str:
        """Serve on a free loopback port; returns the base URL for an `openai` agent."""
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_post(CHAT_PATH, self._chat)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, HOST, 0).start()
        self._runner = runner
        self.url = f"http://{HOST}:{runner.addresses[0][1]}/v1"
        return self.url

    async def stop(self) -> None:
        """Stop serving (a no-op when not started)."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def __aenter__(self) -> DemoModel:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.stop()

    async def _chat(self, request: web.Request) -> web.Response:
        """One chat completion: the script's tool call, or the text for an unknown model."""
        body = await request.read()
        try:
            chat = _ChatRequest.model_validate(parse_json(body))
        except JsonBodyError as exc:
            return _error(f"the body must be a JSON object: {exc}")
        except ValidationError as exc:
            where, reason = first_error(exc)
            return _error(f"{where}: {reason}" if where else reason)
        if chat.stream:
            return _error("stream: the demo model does not stream")
        self._served += 1
        script = SCRIPTS.get(chat.model)
        prompt_tokens = _tokens(len(body))
        if script is None:
            answer: Message = {"role": "assistant", "content": UNKNOWN_MODEL}
            return _completion(chat.model, answer, prompt_tokens)
        self._tell(chat.model, chat.messages)
        arguments = script.arguments(_request_text(chat.messages))
        call = {
            "id": f"call_demo_{self._served}",
            "type": "function",
            "function": {"name": script.tool, "arguments": json.dumps(arguments)},
        }
        answer = {"role": "assistant", "content": None, "tool_calls": [call]}
        return _completion(chat.model, answer, prompt_tokens)

    def _tell(self, model: str, messages: Sequence[Message]) -> None:
        """Report the guard's note in the last tool result, and a request sent again."""
        note = _guard_note(messages[-1])
        if note is not None:
            self._report(f"[model] {model}: {note}")
        fingerprint = fingerprint_call(model, messages)
        last, times = self._last.get(model, ("", 0))
        times = times + 1 if fingerprint == last else 1
        self._last[model] = (fingerprint, times)
        if times > 1:
            self._report(f"[model] {model}: the same request again ({times} in a row)")


def _request_text(messages: Sequence[Message]) -> str:
    """The person's request: the last user message without "Name: " and @mentions."""
    for message in reversed(messages):
        content = message.get("content")
        if message.get("role") == "user" and isinstance(content, str):
            text = content.partition(": ")[2] or content
            return " ".join(_MENTION.sub(" ", text).split())[:MAX_REQUEST_CHARS]
    return ""


def _guard_note(message: Mapping[str, object]) -> str | None:
    """What the loop guard told the model in a tool result (its WARN note or BLOCK), if any."""
    content = message.get("content")
    if message.get("role") != "tool" or not isinstance(content, str):
        return None
    try:
        result = parse_json(content)
    except JsonBodyError:
        return None
    if not isinstance(result, dict):
        return None
    if result.get("loop_blocked") is True:
        return f"the loop guard did not run the tool: {_first_clause(result.get('error'))}"
    note = result.get("_loop_guard")
    if not isinstance(note, dict):
        return None
    return (
        f"the tool result carries the loop guard's {note.get('action')} ({note.get('code')}): "
        f"{_first_clause(note.get('message'))}"
    )


def _first_clause(text: object) -> str:
    """A guard message up to its advice (the part after the first ';')."""
    return str(text).removeprefix("[loop-guard] ").split(";")[0]


def _tokens(size: int) -> int:
    """The tokens `size` bytes count as (at least 1)."""
    return max(1, math.ceil(size / BYTES_PER_TOKEN))


def _completion(model: str, message: Message, prompt_tokens: int) -> web.Response:
    """A chat-completions answer with one choice and its usage (the answer's size in tokens)."""
    finish = "tool_calls" if message.get("tool_calls") else "stop"
    completion_tokens = _tokens(len(json.dumps(message)))
    return web.json_response(
        {
            "id": "chatcmpl-demo",
            "object": "chat.completion",
            "created": 0,
            "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }
    )


def _error(message: str) -> web.Response:
    """A 400 in OpenAI's error format."""
    body = {"error": {"message": message, "type": "invalid_request_error"}}
    return web.json_response(body, status=400)
