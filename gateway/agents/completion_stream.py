"""A streamed chat completion (`stream: true`, server-sent events) read into one message.

OpenAI-compatible servers answer a streamed request with `data: {chunk}` events ending in
`data: [DONE]`; each chunk's `choices[0].delta` carries a piece of the content, of the
tool calls, or both (`tool_calls[i]` by `index`: the id and the name come first, the
arguments in pieces). `read_completion` hands every content piece on as it arrives and
returns what a request without `stream` would have: `{"choices": [{"message": {"content",
"tool_calls"}}]}`, so the agent reads both answers alike and tools work while streaming;
the `usage` of a usage chunk (`stream_options.include_usage`) comes along as it came.

Bad input ends the read with `CompletionStreamError` saying why: a data line that
`gateway.app.jsonbody.parse_json` refuses (not UTF-8, not JSON, nested deeper than 64, a
5,000-digit number, NaN or Infinity), a chunk of the wrong shape, an `error` object in
the stream, a tool call index of `MAX_TOOL_CALLS` or more, over `MAX_STREAM_BYTES` in all;
a stream that ends before `[DONE]` and without a finish reason was cut short
(`retryable`). Comment lines (`: …`) and other SSE fields are skipped.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gateway.app.errors import LoopwardenError
from gateway.app.jsonbody import JsonBodyError, parse_json

MAX_TOOL_CALLS = 128
MAX_STREAM_BYTES = 8 * 1024 * 1024
_DONE = b"[DONE]"
_ERROR_DETAIL_MAX = 300

TextSink = Callable[[str], Awaitable[None]]


class CompletionStreamError(LoopwardenError):
    """A streamed completion that cannot be read; `retryable` when it was only cut short."""

    def __init__(self, reason: str, *, retryable: bool = False) -> None:
        super().__init__(reason)
        self.retryable = retryable


class _Chunk(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


class _FunctionDelta(_Chunk):
    name: str | None = None
    arguments: str | None = None


class _ToolCallDelta(_Chunk):
    index: int = Field(ge=0, lt=MAX_TOOL_CALLS)
    id: str | None = None
    function: _FunctionDelta | None = None


class _Delta(_Chunk):
    content: str | None = None
    tool_calls: tuple[_ToolCallDelta, ...] | None = None


class _Choice(_Chunk):
    index: int = 0
    delta: _Delta = _Delta()
    finish_reason: str | None = None


class _StreamChunk(_Chunk):
    choices: tuple[_Choice, ...] = ()
    usage: object = None


class _Assembly:
    """The message the chunks add up to."""

    def __init__(self) -> None:
        self.content: list[str] = []
        self.calls: dict[int, dict[str, str]] = {}
        self.finished = False
        self.usage: object = None

    def add_calls(self, deltas: tuple[_ToolCallDelta, ...]) -> None:
        for delta in deltas:
            call = self.calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
            if delta.id:
                call["id"] = delta.id
            if delta.function is not None:
                call["name"] += delta.function.name or ""
                call["arguments"] += delta.function.arguments or ""

    def completion(self) -> dict[str, object]:
        """The body a request without `stream` would have had (the agent's reading of it)."""
        message: dict[str, object] = {"content": "".join(self.content) if self.content else None}
        if self.calls:
            message["tool_calls"] = [
                {
                    # Some local servers stream no ids; the tool messages need one to refer to.
                    "id": call["id"] or f"call_{index}",
                    "type": "function",
                    "function": {"name": call["name"], "arguments": call["arguments"] or "{}"},
                }
                for index, call in sorted(self.calls.items())
            ]
        return {"choices": [{"message": message}], "usage": self.usage}


async def read_completion(lines: AsyncIterable[bytes], on_text: TextSink) -> dict[str, object]:
    """Read an SSE chat-completion stream line by line; `on_text(piece)` for each content piece."""
    assembly = _Assembly()
    async for event in _events(lines):
        if event == _DONE:
            return assembly.completion()
        await _take(event, assembly, on_text)
    if not assembly.finished:
        raise CompletionStreamError("the stream ended before it was finished", retryable=True)
    return assembly.completion()


async def _events(lines: AsyncIterable[bytes]) -> AsyncIterator[bytes]:
    """The data of each event (its `data:` lines joined), the last one without a blank line too."""
    data: list[bytes] = []
    size = 0
    async for raw in lines:
        size += len(raw)
        if size > MAX_STREAM_BYTES:
            raise CompletionStreamError(f"the stream is over {MAX_STREAM_BYTES} bytes")
        line = raw.rstrip(b"\r\n")
        if line.startswith(b"data:"):
            data.append(line[5:].removeprefix(b" "))
        elif not line and data:
            yield b"\n".join(data)
            data = []
    if data:
        yield b"\n".join(data)


async def _take(event: bytes, assembly: _Assembly, on_text: TextSink) -> None:
    """Add one chunk to the message; hand its content on."""
    try:
        raw = parse_json(event)
    except JsonBodyError as exc:
        raise CompletionStreamError(f"a stream chunk is not valid JSON: {exc}") from None
    error = raw.get("error") if isinstance(raw, dict) else None
    if isinstance(error, dict):
        message = str(error.get("message"))[:_ERROR_DETAIL_MAX]
        raise CompletionStreamError(f"the provider reported an error: {message}")
    try:
        chunk = _StreamChunk.model_validate(raw)
    except ValidationError as exc:
        where = ".".join(map(str, exc.errors()[0]["loc"])) or "chunk"
        raise CompletionStreamError(f"a stream chunk has a bad {where}") from None
    if chunk.usage is not None:
        assembly.usage = chunk.usage
    for choice in chunk.choices:
        if choice.index != 0:
            continue
        delta = choice.delta
        if delta.tool_calls:
            assembly.add_calls(delta.tool_calls)
        if delta.content:
            assembly.content.append(delta.content)
            await on_text(delta.content)
        if choice.finish_reason is not None:
            assembly.finished = True
