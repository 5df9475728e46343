"""The demo's built-in model over real loopback HTTP: canned tool calls, hostile bodies refused."""

from __future__ import annotations

import io
import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field

import aiohttp
import pytest

from gateway.demo.model import CHAT_PATH, MAX_BODY_BYTES, UNKNOWN_MODEL, DemoModel

Json = dict[str, object]
ASK: Json = {"role": "user", "content": "alice: @finder find the invoice"}


@dataclass
class Served:
    """A started demo model, a client session to it, and the lines it reported."""

    model: DemoModel
    http: aiohttp.ClientSession
    lines: list[str] = field(default_factory=list)

    async def post(self, body: bytes) -> tuple[int, Json]:
        """POST a raw body to the chat-completions path; the status and the JSON answer."""
        url = self.model.url.removesuffix("/v1") + CHAT_PATH
        headers = {"Content-Type": "application/json"}
        async with self.http.post(url, data=body, headers=headers) as response:
            answer: Json = await response.json(content_type=None)
            return response.status, answer

    async def chat(self, model: str, *messages: Mapping[str, object]) -> Json:
        """One chat completion that must succeed; its message."""
        body = json.dumps({"model": model, "messages": list(messages)}).encode()
        status, answer = await self.post(body)
        assert status == 200, answer
        choices = answer["choices"]
        assert isinstance(choices, list)
        message: Json = choices[0]["message"]
        return message


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    lines: list[str] = []
    async with DemoModel(report=lines.append) as model, aiohttp.ClientSession() as http:
        yield Served(model, http, lines)


def _tool_call(message: Json) -> tuple[str, Json, str]:
    """(name, arguments, id) of the one tool call in an answer."""
    calls = message["tool_calls"]
    assert isinstance(calls, list)
    [call] = calls
    return call["function"]["name"], json.loads(call["function"]["arguments"]), call["id"]


async def test_issue12_finder_always_calls_find_document_with_the_persons_request(
    served: Served,
) -> None:
    first = _tool_call(await served.chat("demo-finder", ASK))
    result = {"role": "tool", "tool_call_id": first[2], "content": '{"found": false}'}
    assistant = {"role": "assistant", "content": None, "tool_calls": [{"id": first[2]}]}
    second = _tool_call(await served.chat("demo-finder", ASK, assistant, result))
    assert first[:2] == second[:2] == ("find_document", {"query": "find the invoice"})
    assert first[2] != second[2]  # a fresh id per answer, as a provider's
    bare = {"role": "user", "content": "bob: @finder"}
    assert _tool_call(await served.chat("demo-finder", bare))[1] == {"query": "invoice"}
    assert served.lines == []  # three different requests, and no guard note in any


async def test_issue12_oracle_reads_its_inbox_and_repeats_are_reported(served: Served) -> None:
    for _ in range(3):
        assert _tool_call(await served.chat("demo-oracle", ASK))[:2] == ("read_inbox", {})
    assert served.lines == [
        "[model] demo-oracle: the same request again (2 in a row)",
        "[model] demo-oracle: the same request again (3 in a row)",
    ]


async def test_issue12_the_loop_guards_notes_in_tool_results_are_reported(served: Served) -> None:
    note = {"action": "warn", "code": "no_progress_warn", "message": "stuck 4 times; try else"}
    warned = {"role": "tool", "content": json.dumps({"found": False, "_loop_guard": note})}
    blocked = {"role": "tool", "content": '{"error": "[loop-guard] called 8 times; stop", '}
    blocked["content"] += '"loop_blocked": true}'
    await served.chat("demo-finder", ASK, warned)
    await served.chat("demo-finder", ASK, blocked)
    assert served.lines == [
        "[model] demo-finder: the tool result carries the loop guard's warn (no_progress_warn): "
        "stuck 4 times",
        "[model] demo-finder: the loop guard did not run the tool: called 8 times",
    ]


async def test_issue12_an_unknown_or_look_alike_model_gets_text(served: Served) -> None:
    for model in ("gpt-4o", "demo-f\u0456nder"):  # Cyrillic і: not the finder's script
        message = await served.chat(model, ASK)
        assert (message["content"], message.get("tool_calls")) == (UNKNOWN_MODEL, None)


def _chat_body(**extra: object) -> bytes:
    return json.dumps({"model": "demo-finder", "messages": [ASK], **extra}).encode()


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"not json", "not JSON"),
        (b'{"model": "\xff"}', "not UTF-8"),
        (b"[" * 5000 + b"]" * 5000, "nested deeper"),
        (_chat_body()[:-1] + b', "n": ' + b"7" * 5000 + b"}", "not acceptable JSON"),
        (_chat_body()[:-1] + b', "temperature": 1e999}', "out of range"),
        (b'{"model": "demo-finder", "messages": [{"content": "\\ud800"}]}', "lone surrogate"),
        (b"[]", "Input should be"),
        (json.dumps({"messages": [ASK]}).encode(), "model: required field is missing"),
        (json.dumps({"model": 5, "messages": [ASK]}).encode(), "model: "),
        (json.dumps({"model": "m" * 201, "messages": [ASK]}).encode(), "model: "),
        (json.dumps({"model": "demo-finder", "messages": []}).encode(), "messages: "),
        (json.dumps({"model": "demo-finder", "messages": ["hi"]}).encode(), "messages.0: "),
        (_chat_body(stream=True), "stream: the demo model does not stream"),
    ],
)
async def test_issue12_hostile_bodies_get_a_400_naming_why_and_the_next_is_served(
    served: Served, body: bytes, reason: str
) -> None:
    status, answer = await served.post(body)
    assert status == 400
    error = answer["error"]
    assert isinstance(error, dict)
    assert reason in str(error["message"])
    assert error["type"] == "invalid_request_error"
    assert _tool_call(await served.chat("demo-finder", ASK))[0] == "find_document"


async def test_issue12_a_body_over_the_limit_is_a_413(served: Served) -> None:
    huge = io.BytesIO(b" " * (MAX_BODY_BYTES + 1))
    async with served.http.post(served.model.url + "/chat/completions", data=huge) as response:
        assert response.status == 413
    assert _tool_call(await served.chat("demo-oracle", ASK))[0] == "read_inbox"


async def test_issue12_odd_messages_are_answered_without_crashing(served: Served) -> None:
    odd: list[Json] = [
        {"role": "tool", "content": '{"_loop_guard": 5}'},
        {"role": "tool", "content": "[1, 2]"},
        {"role": "tool", "content": {"deep": [[[1]]]}},
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        {},
    ]
    for message in odd:
        assert _tool_call(await served.chat("demo-finder", message))[1] == {"query": "invoice"}
    assert served.lines == []


async def test_issue12_the_model_stops_serving_when_stopped() -> None:
    async with DemoModel() as model:
        url = model.url + "/chat/completions"
    async with aiohttp.ClientSession() as http:
        with pytest.raises(aiohttp.ClientConnectionError):
            await http.post(url, json={"model": "demo-finder", "messages": [ASK]})
