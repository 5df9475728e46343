"""Room memory through the real pipeline: what is recorded, what each agent's turn gets."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.agents.factory import build_agent
from gateway.app import messages
from gateway.app.context import Agent, TurnContext
from gateway.app.middlewares.transcript import conversation, estimate_tokens, history_for
from gateway.app.types import HistoryEntry
from gateway.config import HistoryConfig, parse_config
from gateway.state.base import StateStore, Transcript, TranscriptEntry
from gateway.state.memory import MemoryStateStore
from gateway.state.redis import RedisStateStore
from gateway.state.sqlite import SqliteStateStore
from tests.fakes.inmemory import FakeClock, InMemoryRoom, PipelineRig

ADMIN = "U_ADMIN"
SEEN: list[tuple[str, str, tuple[HistoryEntry, ...]]] = []
"""What each `remember` turn was given: bot, message text, history."""


async def remember(turn: TurnContext) -> str | None:
    """A python agent: records its history; `quiet` bots answer humans only."""
    SEEN.append((turn.bot.id, turn.message.text, turn.history))
    if turn.message.text == "say nothing":
        return "NO_REPLY"
    if turn.bot.id.startswith("quiet") and turn.message.sender_is_bot:
        return None
    return f"{turn.bot.id} heard {turn.message.text}"


@pytest.fixture(autouse=True)
def _fresh_seen() -> None:
    SEEN.clear()


def memory_config(extra: str = "", *, bots: tuple[str, ...] = ("alpha", "beta")) -> str:
    """Room bots on the `remember` agent, admins, bots answering humans only, plus `extra`."""
    lines = ["agents:", f"  remember: {{kind: python, function: {__name__}:remember}}", "bots:"]
    lines += [f"  - {{id: {bot}, platform: room, agent: remember}}" for bot in bots]
    lines += [f"admins: {{room: [{ADMIN}]}}", "policy: {respond_to: {bots: none}}"]
    return "\n".join(lines) + "\n" + extra


def agents_of(config_text: str) -> dict[str, Agent]:
    config = parse_config(config_text, env={})
    return {name: build_agent(name, agent) for name, agent in config.agents.items()}


async def make_rig(
    extra: str = "",
    *,
    bots: tuple[str, ...] = ("alpha", "beta"),
    state: StateStore | None = None,
    max_message_length: int = 2_000,
) -> PipelineRig:
    text = memory_config(extra, bots=bots)
    rig = PipelineRig(
        parse_config(text, env={}),
        agents_of(text),
        state=state,
        max_message_length=max_message_length,
    )
    await rig.start()
    return rig


def history_of(bot: str, text: str) -> list[tuple[str, str, str]]:
    """The history `bot` was given for the message `text`: (role, name, text) each."""
    for seen_bot, seen_text, history in SEEN:
        if (seen_bot, seen_text) == (bot, text):
            return [(entry.role, entry.name, entry.text) for entry in history]
    raise AssertionError(f"{bot} took no turn for {text!r}")


async def test_issue11_two_hosted_bots_each_see_the_other_ones_replies() -> None:
    rig = await make_rig()
    room = InMemoryRoom(rig)
    await room.post("hi")
    await room.run()
    await room.post("again")
    await room.run()
    # The first message: nothing before it (alpha's reply came after it, for beta too).
    assert history_of("alpha", "hi") == history_of("beta", "hi") == []
    assert history_of("alpha", "again") == [
        ("user", "alice", "hi"),
        ("assistant", "alpha", "alpha heard hi"),
        ("user", "beta", "beta heard hi"),
    ]
    assert history_of("beta", "again") == [
        ("user", "alice", "hi"),
        ("user", "alpha", "alpha heard hi"),
        ("assistant", "beta", "beta heard hi"),
    ]
    # One transcript for the room: each message once, though both bots saw each.
    transcript = await rig.state.transcript_recent("room:C1", 50)
    assert [e.text for e in transcript.entries] == [
        "hi",
        "alpha heard hi",
        "beta heard hi",
        "again",
        "alpha heard again",
        "beta heard again",
    ]


async def test_issue11_a_chunked_reply_is_one_message_and_its_chunks_are_not_history() -> None:
    # Both answer humans only, but take a turn (and read history) for every bot message.
    rig = await make_rig(
        "policy: {respond_to: {bots: all}}", bots=("quiet1", "quiet2"), max_message_length=40
    )
    room = InMemoryRoom(rig)
    question = ("a rather long question " * 4).strip()
    await room.post(question)
    await room.run()
    one, two = (f"{bot} heard {question}" for bot in ("quiet1", "quiet2"))
    transcript = await rig.state.transcript_recent("room:C1", 50)
    assert [e.text for e in transcript.entries] == [question, one, two]
    chunks_one = rig.connector("quiet1").texts()
    chunks_two = rig.connector("quiet2").texts()
    assert len(chunks_one) > 1
    assert len(chunks_two) > 1
    # Each chunk's turn sees what came before the reply it is a chunk of.
    for chunk in chunks_one:
        assert history_of("quiet2", chunk) == [("user", "alice", question)]
    for chunk in chunks_two:
        assert history_of("quiet1", chunk) == [
            ("user", "alice", question),
            ("assistant", "quiet1", one),
        ]


async def test_issue11_only_what_is_posted_is_recorded() -> None:
    rig = await make_rig("policy: {silence: {on_addressed_human_turn: notice}}", bots=("alpha",))
    connector = rig.connector("alpha")
    await connector.push(connector.message("say nothing", is_direct=False))
    await connector.push(connector.message("say nothing", mentions_bot=True))
    await connector.push(connector.message("/loop status", sender_id=ADMIN))
    await connector.push(connector.message("   "))
    assert messages.SILENCE_NOTICE in connector.texts()
    transcript = await rig.state.transcript_recent("room:C1", 50)
    # The messages, not the silence the agent chose, nor the notice, nor the command, nor
    # a message with no text (the agent's answer to it was posted: that is recorded).
    assert [e.text for e in transcript.entries] == ["say nothing", "say nothing", "alpha heard    "]


async def test_issue11_a_redelivered_message_is_recorded_once() -> None:
    rig = await make_rig("pipeline: {dedupe: false}", bots=("alpha",))
    connector = rig.connector("alpha")
    message = connector.message("hello", message_id="m-1", event_id="e-1")
    await connector.push(message)
    await connector.push(message)
    assert connector.texts() == ["alpha heard hello"] * 2  # answered twice: dedupe is off
    transcript = await rig.state.transcript_recent("room:C1", 50)
    assert [e.text for e in transcript.entries] == ["hello", "alpha heard hello"]


async def test_issue11_threads_and_direct_messages_have_memories_of_their_own() -> None:
    rig = await make_rig()
    alpha, beta = rig.connector("alpha"), rig.connector("beta")
    await alpha.push(alpha.message("in the room"))
    await alpha.push(alpha.message("in a thread", thread_id="T1"))
    await alpha.push(alpha.message("dm to alpha", channel_id="D9", is_direct=True))
    await beta.push(beta.message("dm to beta", channel_id="D9", is_direct=True))
    await alpha.push(alpha.message("thread again", thread_id="T1"))
    await alpha.push(alpha.message("dm again", channel_id="D9", is_direct=True))
    assert history_of("alpha", "thread again") == [
        ("user", "alice", "in a thread"),
        ("assistant", "alpha", "alpha heard in a thread"),
    ]
    # The same DM channel id (Telegram's is the person's id for every bot): apart per bot.
    assert history_of("alpha", "dm again") == [
        ("user", "alice", "dm to alpha"),
        ("assistant", "alpha", "alpha heard dm to alpha"),
    ]


async def test_issue11_history_keeps_the_newest_within_both_limits() -> None:
    text = memory_config(bots=("alpha",)).replace(
        "function: ", "history: {max_messages: 3, max_tokens: 6000}, function: "
    )
    rig = PipelineRig(parse_config(text, env={}), agents_of(text))
    await rig.start()
    connector = rig.connector("alpha")
    for index in range(6):
        await connector.push(connector.message(f"m{index}"))
    assert history_of("alpha", "m5") == [
        ("assistant", "alpha", "alpha heard m3"),
        ("user", "alice", "m4"),
        ("assistant", "alpha", "alpha heard m4"),
    ]


def test_issue11_history_for_counts_estimated_tokens_and_keeps_the_newest() -> None:
    entries = [TranscriptEntry(f"k{i}", "U1", "ann", "x" * 40) for i in range(10)]
    each = estimate_tokens("ann", "x" * 40)
    assert each == (3 + 40 + 5) // 4 + 4
    kept = history_for(entries, me="U2", limits=HistoryConfig(max_messages=40, max_tokens=each * 3))
    assert len(kept) == 3
    assert history_for(entries, me="U2", limits=HistoryConfig(max_tokens=each - 1)) == ()
    mine = history_for(entries[:1], me="U1", limits=HistoryConfig())
    assert mine == (HistoryEntry("assistant", "ann", "x" * 40),)
    # A huge message that does not fit ends the history there: older ones are not reached.
    huge = [*entries[:2], TranscriptEntry("big", "U1", "ann", "y" * 100_000)]
    assert history_for(huge, me="U2", limits=HistoryConfig()) == ()


async def test_issue11_admin_forget_empties_the_room_for_every_bot() -> None:
    rig = await make_rig()
    room = InMemoryRoom(rig)
    await room.post("remember me")
    await room.run()
    alpha = rig.connector("alpha")
    await alpha.push(alpha.message("in a thread", thread_id="T1"))
    await alpha.push(alpha.message("/loop forget", sender_id=ADMIN, thread_id="T1"))
    assert alpha.texts()[-1] == messages.forget_ack(2, thread=True)
    assert [e.text for e in (await rig.state.transcript_recent("room:C1", 50)).entries] == [
        "remember me",
        "alpha heard remember me",
        "beta heard remember me",
    ]
    await alpha.push(alpha.message("in a thread", thread_id="T1"))
    await alpha.push(alpha.message("/loop forget", sender_id=ADMIN))
    assert alpha.texts()[-1] == messages.forget_ack(5, thread=False)
    await room.post("fresh start")
    assert history_of("alpha", "fresh start") == history_of("beta", "fresh start") == []
    audit = await rig.state.recent_audit()
    assert [(e.command, e.allowed, e.outcome) for e in audit[:2]] == [
        ("/loop forget", True, "done"),
        ("/loop forget", True, "done"),
    ]


@pytest.mark.parametrize("text", ["/new", "/loop forget", "!new", "/new@alpha_bot please"])
async def test_issue11_in_a_group_a_non_admin_cannot_wipe_the_room(text: str) -> None:
    rig = await make_rig(bots=("alpha",))
    alpha = rig.connector("alpha")
    await alpha.push(alpha.message("keep this"))
    await alpha.push(alpha.message(text, sender_id="U_MALLORY"))
    assert alpha.texts()[-1] == messages.REFUSAL
    transcript = await rig.state.transcript_recent("room:C1", 50)
    assert [e.text for e in transcript.entries] == ["keep this", "alpha heard keep this"]
    (entry,) = await rig.state.recent_audit(limit=1)
    assert (entry.user_id, entry.allowed, entry.outcome) == ("U_MALLORY", False, "refused")
    assert [text for _, text, _ in SEEN] == ["keep this"]  # the command never reached it


@pytest.mark.parametrize("text", ["/new", "/loop forget"])
async def test_issue11_in_a_dm_the_person_may_start_afresh(text: str) -> None:
    rig = await make_rig(bots=("alpha",))
    alpha = rig.connector("alpha")
    await alpha.push(alpha.message("group talk"))
    await alpha.push(alpha.message("our secret", channel_id="D1", is_direct=True))
    await alpha.push(alpha.message(text, channel_id="D1", is_direct=True))
    assert alpha.texts()[-1] == messages.forget_ack(2, thread=False)
    await alpha.push(alpha.message("what did I say?", channel_id="D1", is_direct=True))
    assert history_of("alpha", "what did I say?") == []
    # The group's memory is not theirs to wipe.
    group = await rig.state.transcript_recent("room:C1", 50)
    assert [e.text for e in group.entries] == ["group talk", "alpha heard group talk"]
    (entry,) = await rig.state.recent_audit(limit=1)
    assert (entry.user_id, entry.allowed, entry.outcome) == ("U_ALICE", True, "done")


async def test_issue11_in_a_dm_other_commands_stay_admin_only_and_bots_cannot_forget() -> None:
    rig = await make_rig(bots=("alpha",))
    alpha = rig.connector("alpha")
    await alpha.push(alpha.message("our secret", channel_id="D1", is_direct=True))
    await alpha.push(alpha.message("/loop pause", channel_id="D1", is_direct=True))
    assert alpha.texts()[-1] == messages.REFUSAL
    assert await rig.state.pause_remaining("room:D1") is None
    await alpha.push(
        alpha.message(
            "/new", channel_id="D1", is_direct=True, sender_id="U_BOT", sender_is_bot=True
        )
    )
    dm = conversation(alpha.message("", channel_id="D1", is_direct=True))
    assert len((await rig.state.transcript_recent(dm, 50)).entries) == 2


class BrokenTranscripts(MemoryStateStore):
    """A store whose transcript calls fail or answer unreadable records."""

    def __init__(self, clock: FakeClock, *, fail: bool) -> None:
        super().__init__(clock=clock)
        self.fail = fail

    async def transcript_append(
        self, scope: str, entry: TranscriptEntry, *, max_messages: int, ttl: float
    ) -> bool:
        if self.fail:
            raise OSError("disk gone")
        return await super().transcript_append(scope, entry, max_messages=max_messages, ttl=ttl)

    async def transcript_recent(self, scope: str, limit: int) -> Transcript:
        if self.fail:
            raise OSError("disk gone")
        held = await super().transcript_recent(scope, limit)
        return Transcript(held.entries, skipped=2)


@pytest.mark.parametrize("fail", [True, False])
async def test_issue11_broken_memory_never_costs_the_turn(fail: bool) -> None:
    clock = FakeClock()
    rig = await make_rig(bots=("alpha",), state=BrokenTranscripts(clock, fail=fail))
    alpha = rig.connector("alpha")
    await alpha.push(alpha.message("one"))
    await alpha.push(alpha.message("two"))
    assert alpha.texts() == ["alpha heard one", "alpha heard two"]
    if fail:
        assert rig.metrics.value("errors_total", stage="transcript") == 4
        assert rig.metrics.value("errors_total", stage="history") == 2
        assert history_of("alpha", "two") == []
    else:
        assert rig.metrics.value("transcript_records_skipped_total") == 4
        assert history_of("alpha", "two") == [
            ("user", "alice", "one"),
            ("assistant", "alpha", "alpha heard one"),
        ]


async def test_issue11_a_corrupted_sqlite_row_is_skipped_and_counted(tmp_path: Path) -> None:
    state = SqliteStateStore(tmp_path / "state.sqlite3")
    await state.start()
    try:
        rig = await make_rig(bots=("alpha",), state=state)
        alpha = rig.connector("alpha")
        await alpha.push(alpha.message("one"))
        with sqlite3.connect(state.path) as db:
            db.execute(
                "INSERT INTO transcript (scope, key, entry) VALUES ('room:C1', 'bad', ?)",
                (b"\xff\xfe",),
            )
        # Text a platform SDK may hand over: a lone surrogate, stored safely.
        await alpha.push(alpha.message("two \ud800"))
        await alpha.push(alpha.message("three"))
        assert alpha.texts()[-1] == "alpha heard three"
        assert history_of("alpha", "three") == [
            ("user", "alice", "one"),
            ("assistant", "alpha", "alpha heard one"),
            ("user", "alice", "two \ufffd"),
            ("assistant", "alpha", "alpha heard two \ufffd"),
        ]
        assert rig.metrics.value("transcript_records_skipped_total") == 2
    finally:
        await state.aclose()


async def test_issue11_memory_off_records_and_reads_nothing() -> None:
    rig = await make_rig("pipeline: {transcript: {max_messages: 0}}", bots=("alpha",))
    alpha = rig.connector("alpha")
    await alpha.push(alpha.message("one"))
    await alpha.push(alpha.message("two"))
    assert history_of("alpha", "two") == []
    assert await rig.state.transcript_recent("room:C1", 50) == Transcript()


# Restarts and replicas share the memory (sqlite: one file; redis: one server).


@pytest.fixture
async def sqlite_states(tmp_path: Path) -> AsyncIterator[list[StateStore]]:
    """Two sqlite stores on one file, one after the other, as a restarted gateway."""
    stores: list[StateStore] = [SqliteStateStore(tmp_path / "state.sqlite3") for _ in range(2)]
    yield stores
    for store in stores:
        await store.aclose()


async def test_issue11_sqlite_memory_survives_a_restart(sqlite_states: list[StateStore]) -> None:
    first, second = sqlite_states
    await first.start()
    rig = await make_rig(bots=("alpha",), state=first)
    await rig.connector("alpha").push(rig.connector("alpha").message("before the restart"))
    await first.aclose()
    await second.start()
    rig = await make_rig(bots=("alpha",), state=second)
    await rig.connector("alpha").push(rig.connector("alpha").message("after it"))
    assert history_of("alpha", "after it") == [
        ("user", "alice", "before the restart"),
        ("assistant", "alpha", "alpha heard before the restart"),
    ]


@pytest.mark.redis
async def test_issue11_redis_memory_survives_a_restart_and_is_shared_by_replicas(
    redis_url: str,
) -> None:
    stores = [RedisStateStore(redis_url, key_prefix="mem11:") for _ in range(3)]
    try:
        for store in stores:
            await store.start()
        one, two = [await make_rig(state=store) for store in stores[:2]]
        # Replica one takes the human's message for both bots; replica two the next one.
        room = InMemoryRoom(one)
        await room.post("on replica one")
        await room.run()
        await InMemoryRoom(two).post("on replica two")
        assert history_of("beta", "on replica two") == [
            ("user", "alice", "on replica one"),
            ("user", "alpha", "alpha heard on replica one"),
            ("assistant", "beta", "beta heard on replica one"),
        ]
        await stores[0].aclose()
        await stores[1].aclose()
        three = await make_rig(state=stores[2])  # every replica restarted
        await InMemoryRoom(three).post("after the restart")
        assert len(history_of("alpha", "after the restart")) == 6
    finally:
        for store in stores:
            await store.aclose()
