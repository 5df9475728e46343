"""Streamed replies (gateway.delivery.streaming) against each platform's real SDK and fake.

Each platform's test module builds a `StreamRoom` (its started connector and how to read
its fake) and runs these cases. The edit pace and every retry-after wait run on a
`ManualClock`, so no case depends on how fast the machine is.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gateway.app.connector import Capabilities
from gateway.app.types import Reply
from gateway.delivery.sender import Delivery
from gateway.delivery.streaming import ReplyStream, StreamingConnector
from guards.silence import SilenceStreamFilter, apply_silence
from tests.connectors.connector_helpers import LONG_REPLY
from tests.fakes.llm_upstream import FakeLLM, text_response

EDIT_SECONDS = 1.0


@dataclass
class ManualClock:
    """Time that moves only when a test, a sleep or a reading (`tick`) moves it; sleeps noted."""

    now: float = 1000.0
    tick: float = 0.0
    slept: list[float] = field(default_factory=list)

    def __call__(self) -> float:
        now = self.now
        self.now += self.tick
        return now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


@dataclass
class StreamRoom:
    """A started connector on a fake, and what a case needs to read and steer the fake."""

    connector: StreamingConnector
    channel: str  # where replies are streamed
    other_channel: str  # where the same reply is delivered whole, to compare
    shown: Callable[[str], list[str]]  # the bot's messages in a channel, as they read now
    rate_limit_next_edit: Callable[[float], None]
    refuse_next_edit: Callable[[], None]
    edit_attempts: Callable[[], int]
    retry_after: float  # what `rate_limit_next_edit` asks the connector to wait


@dataclass
class Recording:
    """The connector seen by the stream, every post and edit noted with the clock's time."""

    inner: StreamingConnector
    clock: ManualClock
    calls: list[tuple[float, str, str]] = field(default_factory=list)
    name: str = field(init=False)
    bot_id: str = field(init=False)
    capabilities: Capabilities = field(init=False)

    def __post_init__(self) -> None:
        self.name = self.inner.name
        self.bot_id = self.inner.bot_id
        self.capabilities = self.inner.capabilities

    @property
    def connected(self) -> bool:
        return self.inner.connected

    @property
    def bot_user_id(self) -> str:
        return self.inner.bot_user_id

    async def start(self, sink: object) -> None:
        raise NotImplementedError("the room's connector is started already")

    async def send(self, channel_id: str, reply: Reply) -> str | None:
        self.calls.append((self.clock(), "send", reply.text))
        return await self.inner.send(channel_id, reply)

    async def edit(self, channel_id: str, message_id: str, reply: Reply) -> None:
        self.calls.append((self.clock(), "edit", reply.text))
        await self.inner.edit(channel_id, message_id, reply)

    async def typing(self, channel_id: str, thread_id: str | None) -> None:
        await self.inner.typing(channel_id, thread_id)

    async def aclose(self) -> None:
        await self.inner.aclose()


def streaming(
    room: StreamRoom, *, edit_seconds: float = EDIT_SECONDS
) -> tuple[ReplyStream, ManualClock, Recording, Delivery]:
    """A stream into `room.channel` behind the default silence filter, on a manual clock."""
    clock = ManualClock()
    delivery = Delivery(sleep=clock.sleep, clock=clock)
    recording = Recording(room.connector, clock)
    stream = ReplyStream(delivery, recording, room.channel, thread_id=None, reply_to=None)
    stream.hold_back(SilenceStreamFilter)
    stream.begin(edit_seconds)
    return stream, clock, recording, delivery


async def write_all(
    stream: ReplyStream, clock: ManualClock, text: str, *, size: int, step: float
) -> None:
    """Write `text` in pieces of `size` characters, the clock `step` seconds on per piece."""
    for start in range(0, len(text), size):
        await stream.write(text[start : start + size])
        clock.now += step


async def long_reply_continues_and_ends_as_unstreamed(room: StreamRoom) -> None:
    """Past the limit the stream goes on in new messages; at the end it reads as if sent whole."""
    text = "Here is the whole list, as asked:\n\n" + LONG_REPLY + "\n\nNO_REPLY"
    stream, clock, recording, delivery = streaming(room)
    await write_all(stream, clock, text, size=97, step=0.3)
    assert len(room.shown(room.channel)) >= 2, "the stream went on past the limit already"
    final = apply_silence(text)
    assert final is not None
    assert await stream.finish(Reply(final))
    assert await delivery.deliver(room.connector, room.other_channel, Reply(final))
    assert room.shown(room.channel) == room.shown(room.other_channel)
    assert all("NO_REPLY" not in shown for _, _, shown in recording.calls)
    # The room is updated at most once per EDIT_SECONDS (one update may post and edit).
    times = sorted({at for at, _, _ in recording.calls})
    assert all(
        later - earlier >= EDIT_SECONDS for earlier, later in zip(times, times[1:], strict=False)
    )


async def silent_turn_posts_nothing(room: StreamRoom) -> None:
    """A reply that is silence, streamed a character at a time, never reaches the room."""
    stream, clock, recording, _ = streaming(room)
    await write_all(stream, clock, "NO_REPLY", size=1, step=2.0)
    assert apply_silence("NO_REPLY") is None
    assert await stream.finish(None)
    assert recording.calls == []
    assert room.shown(room.channel) == []


async def reply_starting_no_never_flashes_no(room: StreamRoom) -> None:
    """A reply that starts like the token is held until it cannot be one, then streamed."""
    text = "NO way, the answer is 42."
    stream, clock, recording, _ = streaming(room)
    await write_all(stream, clock, text, size=1, step=2.0)
    assert await stream.finish(Reply(text))
    first = recording.calls[0][2]
    assert first.startswith("NO ")
    assert len(first) > len("NO ")
    assert room.shown(room.channel) == [text]


async def rate_limited_edit_is_waited_for(room: StreamRoom) -> None:
    """A 429 on an edit: nothing is tried before its retry-after, then the edit goes through."""
    stream, clock, _, _ = streaming(room, edit_seconds=room.retry_after / 10)
    await stream.write("Let me think. ")
    clock.now += room.retry_after
    room.rate_limit_next_edit(room.retry_after)
    await stream.write("The answer ")
    attempts = room.edit_attempts()
    assert attempts > 0, "the edit was tried and answered 429"
    clock.now += room.retry_after / 2
    await stream.write("is 42.")
    assert room.edit_attempts() == attempts, "no edit before the retry-after has passed"
    assert room.shown(room.channel) == ["Let me think."]
    assert await stream.finish(Reply("Let me think. The answer is 42."))
    assert clock.slept == [pytest.approx(room.retry_after / 2)], "the rest of the wait"
    assert room.edit_attempts() == attempts + 1
    assert room.shown(room.channel) == ["Let me think. The answer is 42."]


async def failed_edit_sends_the_rest(room: StreamRoom) -> None:
    """An edit the platform refuses: no more edits, and the rest goes in a new message."""
    stream, clock, _, _ = streaming(room)
    # A sentence first: a short line without one may still become narration of silence.
    await stream.write("First. The first part of the answer")
    clock.now += EDIT_SECONDS
    room.refuse_next_edit()
    await stream.write(" and then the second part.")
    attempts = room.edit_attempts()
    assert attempts == 1, "the edit was tried and refused"
    clock.now += EDIT_SECONDS
    await stream.write(" And a third.")
    assert room.edit_attempts() == attempts, "no edits after one failed"
    text = "First. The first part of the answer and then the second part. And a third."
    assert await stream.finish(Reply(text))
    assert room.shown(room.channel) == [
        "First. The first part of the answer",
        "and then the second part. And a third.",
    ]


STREAMED_REPLY = "Sure, here it is.\n\n" + LONG_REPLY
"""What the fake model answers a streaming turn (past every platform's limit)."""

_STREAMING_CONFIG = """
state: {{backend: memory}}
http: {{host: 127.0.0.1, port: 0}}
agents:
  helper:
    kind: openai
    base_url: "{llm}"
    model: fake-model
    stream: true
    stream_edit_seconds: 0.01
bots:
{bots}
"""


def write_streaming_config(tmp_path: Path, llm: FakeLLM, bots: str) -> Path:
    """A gateway whose bots (`bots`, YAML list items) answer with a streaming `openai` agent.

    The model answers "quiet…" with NO_REPLY, streamed, and anything else with
    `STREAMED_REPLY`, in 40 pieces.
    """
    llm.chunks = 40
    llm.responder = lambda received: text_response(
        "NO_REPLY" if "quiet" in str(received.messages[-1]["content"]) else STREAMED_REPLY
    )
    path = tmp_path / "loopwarden.yaml"
    path.write_text(_STREAMING_CONFIG.format(llm=llm.base_url, bots=bots), encoding="utf-8")
    return path


async def reasoning_never_reaches_the_room(room: StreamRoom) -> None:
    """A model thinking aloud: its reasoning block is never posted, streamed or at the end."""
    text = "<think>The user wants a greeting. NO_REPLY would be rude.</think>\nHello there!"
    stream, clock, recording, _ = streaming(room)
    await write_all(stream, clock, text, size=3, step=2.0)
    final = apply_silence(text)
    assert final == "Hello there!"
    assert await stream.finish(Reply(final))
    assert all("think" not in shown and "user" not in shown for _, _, shown in recording.calls)
    assert room.shown(room.channel) == ["Hello there!"]


StreamCase = Callable[[StreamRoom], Awaitable[None]]

CASES: dict[str, StreamCase] = {
    "long_reply_continues_and_ends_as_unstreamed": long_reply_continues_and_ends_as_unstreamed,
    "silent_turn_posts_nothing": silent_turn_posts_nothing,
    "reply_starting_no_never_flashes_no": reply_starting_no_never_flashes_no,
    "429_on_an_edit_is_waited_for": rate_limited_edit_is_waited_for,
    "failed_edit_sends_the_rest_as_a_new_message": failed_edit_sends_the_rest,
    "reasoning_never_reaches_the_room": reasoning_never_reaches_the_room,
}
"""The streaming cases every platform runs, by name (`test_issue11_streaming[<name>]`)."""
