"""RoomGuard: the pipeline's bot-loop and silence decisions on the gateway's state backends."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from gateway.app.errors import ConfigError
from loopwarden_integrations import Decision, RoomGuard, RoomGuardError
from tests.fakes.inmemory import FakeClock

ROOM = "discord:1100"
POLICY = {"bot_loop": {"max_events_per_window": 3, "window_seconds": 60, "cooldown_seconds": 30}}


def guard(clock: FakeClock | None = None, **policy: object) -> RoomGuard:
    merged = {"bot_loop": {**POLICY["bot_loop"], **policy}}
    return RoomGuard(merged, bot_id="parrot", bot_name="Parrot", clock=clock or FakeClock())


async def ping(g: RoomGuard, n: int, sender: str = "echo") -> list[Decision]:
    return [await g.admit(ROOM, sender, True, sender_name=sender) for _ in range(n)]


async def test_issue15_pair_budget_then_one_notice_per_cooldown() -> None:
    clock = FakeClock()
    g = guard(clock)
    decisions = await ping(g, 6)
    assert [d.reason for d in decisions] == ["ok"] * 3 + ["budget_exceeded"] + ["cooldown"] * 2
    assert [d.allowed for d in decisions] == [True] * 3 + [False] * 3
    notices = [d.notice for d in decisions if d.notice]
    assert notices == [
        "Loop guard: pausing replies between Parrot and echo for 30 s (3 bot messages in 1 min)."
    ]
    assert decisions[3].retry_after == 30
    clock.advance(30)
    again = await ping(g, 5)
    assert [d.reason for d in again] == ["ok"] * 3 + ["budget_exceeded", "cooldown"]
    assert sum(1 for d in again if d.notice) == 1


async def test_issue15_two_guards_on_one_sqlite_file_share_the_pair(tmp_path: Path) -> None:
    state = f"sqlite:///{tmp_path / 'bots.sqlite3'}"
    parrot = RoomGuard(POLICY, state, bot_id="parrot")
    echo = RoomGuard(POLICY, state, bot_id="echo")
    async with parrot, echo:
        seen = []
        for _ in range(4):
            seen.append(await parrot.admit(ROOM, "echo", True))
            seen.append(await echo.admit(ROOM, "parrot", True))
    assert sum(d.allowed for d in seen) == 3
    assert sum(1 for d in seen if d.notice) == 1
    assert [d.reason for d in seen[3:]] == ["budget_exceeded"] + ["cooldown"] * 4


async def test_issue15_human_resets_the_consecutive_bot_turn_cap() -> None:
    g = RoomGuard(
        {"bot_loop": {"max_consecutive_bot_turns": 2, "max_events_per_window": 100}},
        bot_id="parrot",
        clock=FakeClock(),
    )
    first = [await g.admit(ROOM, f"bot{i}", True) for i in range(3)]
    assert [d.reason for d in first] == ["ok", "ok", "bot_turn_cap"]
    assert first[2].count == 3
    assert first[2].notice is None
    assert (await g.admit(ROOM, "alice", False)).reason == "ok"
    after = [await g.admit(ROOM, f"bot{i}", True) for i in range(2)]
    assert all(d.allowed for d in after)


async def test_issue15_human_turned_away_still_resets_the_count() -> None:
    g = RoomGuard(
        {"bot_loop": {"max_consecutive_bot_turns": 1}, "respond_to": {"humans": "mentions"}},
        bot_id="parrot",
        clock=FakeClock(),
    )
    assert (await g.admit(ROOM, "echo", True)).allowed
    assert (await g.admit(ROOM, "alice", False)).reason == "not_addressed"
    assert (await g.admit(ROOM, "alice", False, mentions_bot=True)).allowed
    assert (await g.admit(ROOM, "echo", True)).allowed


async def test_issue15_self_duplicate_and_respond_to() -> None:
    g = RoomGuard({"respond_to": {"bots": "none"}}, bot_id="parrot", clock=FakeClock())
    assert (await g.admit(ROOM, "parrot", True)).reason == "self"
    assert (await g.admit(ROOM, "alice", False, message_id="m1")).allowed
    assert (await g.admit(ROOM, "alice", False, message_id="m1")).reason == "duplicate"
    assert (await g.admit(ROOM, "echo", True, mentions_bot=True)).reason == "bots_off"


async def test_issue15_lookalike_sender_ids_are_other_senders() -> None:
    g = guard(max_events_per_window=1)
    assert (await g.admit(ROOM, "echo", True)).allowed
    # Cyrillic е and a U+2010 hyphen: other accounts, so other pairs; never folded.
    assert (await g.admit(ROOM, "\u0435cho", True)).allowed
    assert (await g.admit(ROOM, "ec\u2010ho", True)).allowed
    assert (await g.admit(ROOM, "echo", True)).reason == "budget_exceeded"
    assert (await g.admit(ROOM, "p\u0430rrot", True)).reason == "ok"  # not the guard itself


async def test_issue15_outgoing_is_the_silence_filter() -> None:
    g = RoomGuard(bot_id="parrot")
    assert g.outgoing(ROOM, "NO_REPLY") is None
    assert g.outgoing(ROOM, "**no reply**") is None
    assert g.outgoing(ROOM, "<think>they want a loop</think>NO_REPLY") is None
    assert g.outgoing(ROOM, "<think>hm</think>Hello there") == "Hello there"
    assert g.outgoing(ROOM, "Sure.\nNO_REPLY") == "Sure."
    off = RoomGuard({"silence": {"enabled": False}}, bot_id="parrot")
    assert off.outgoing(ROOM, "NO_REPLY") == "NO_REPLY"


async def test_issue15_shadow_mode_admits_what_it_would_refuse() -> None:
    g = guard(mode="shadow", max_events_per_window=1)
    first, second = await ping(g, 2)
    assert first.allowed
    assert not first.shadow
    assert second.allowed
    assert second.shadow
    assert second.reason == "budget_exceeded"
    assert second.notice is None


def _nested(depth: int) -> dict[str, object]:
    node: dict[str, object] = {}
    root: dict[str, object] = {"x": node}
    for _ in range(depth):
        node["x"] = node = {}
    return root


@pytest.mark.parametrize(
    ("policy", "field"),
    [
        ({"bot_loop": {"window_seconds": float("inf")}}, "policy.bot_loop.window_seconds"),
        ({"bot_loop": {"window_seconds": 1e308}}, "policy.bot_loop.window_seconds"),
        ({"bot_loop": {"cooldown_seconds": "nan"}}, "policy.bot_loop.cooldown_seconds"),
        ({"bot_loop": {"max_events_per_window": 10**5000}}, "policy"),
        ({"bot_loop": {"max_events_per_window": 10**30}}, "policy.bot_loop.max_events_per_window"),
        ({"bot_loop": {"max_consecutive_bot_turns": 2**60}}, "policy.bot_loop.max_consecutive"),
        ({"bot_loop": {"max_events_per_window": "9" * 5000}}, "policy.bot_loop"),
        ({"bot_loop": {"max_events_per_window": -1}}, "policy.bot_loop.max_events_per_window"),
        ({"bot_loop": {"windw_seconds": 5}}, "policy.bot_loop.windw_seconds"),
        ({"bot_loop": _nested(200)}, "policy.bot_loop.x"),
        ({"respond_to": {"bots": "sometimes"}}, "policy.respond_to.bots"),
        ("max_events_per_window=3", "policy"),
    ],
)
def test_issue15_absurd_policy_values_name_the_field(policy: object, field: str) -> None:
    with pytest.raises(ConfigError) as caught:
        RoomGuard(policy, bot_id="parrot")  # type: ignore[arg-type]
    assert caught.value.path.startswith(field)
    assert len(str(caught.value)) < 500


@pytest.mark.parametrize(
    "state",
    [
        "postgres://admin:hunter2secret@db/bots",
        "sqlite:///",
        "sqlite://relative.db",
        "sqlite:///a\x00b",
        "sqlite:///bad\udcff",
        "Memory",
        "redis:/127.0.0.1",
        "",
        "%73qlite:///x",
        42,
    ],
)
def test_issue15_a_state_that_is_none_of_the_three_forms(state: object) -> None:
    with pytest.raises(ConfigError) as caught:
        RoomGuard(state=state, bot_id="parrot")  # type: ignore[arg-type]
    assert caught.value.path == "state"
    assert "hunter2" not in str(caught.value)
    assert "sqlite:///" in str(caught.value)


def test_issue15_bot_id_is_required_and_a_string() -> None:
    with pytest.raises(ConfigError) as caught:
        RoomGuard(bot_id="")
    assert caught.value.path == "bot_id"


def test_issue15_sqlite_path_is_taken_literally(tmp_path: Path) -> None:
    encoded = tmp_path / "a%2Fb.sqlite3"

    async def run() -> None:
        async with RoomGuard(state=f"sqlite:///{encoded}", bot_id="parrot") as g:
            assert (await g.admit(ROOM, "echo", True)).allowed

    asyncio.run(run())
    assert encoded.exists()
    assert not (tmp_path / "a").exists()


def test_issue15_sync_face_from_threads_shares_one_budget() -> None:
    g = guard(max_events_per_window=10)
    results: list[Decision] = []
    lock = threading.Lock()

    def worker() -> None:
        for _ in range(5):
            decision = g.admit_sync(ROOM, "echo", True)
            with lock:
                results.append(decision)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    g.close()
    assert sum(d.allowed for d in results) == 10
    assert sum(1 for d in results if d.notice) == 1


async def test_issue15_sync_face_on_its_own_loop_is_refused_clearly() -> None:
    g = guard()
    await g.admit(ROOM, "alice", False)
    with pytest.raises(RoomGuardError, match="await guard.admit"):
        g.admit_sync(ROOM, "echo", True)
    assert (await g.admit(ROOM, "echo", True)).allowed  # the next message is served
    await g.aclose()


async def test_issue15_async_face_from_another_loop_is_handed_home() -> None:
    g = guard(max_events_per_window=2)
    assert (await g.admit(ROOM, "echo", True)).allowed

    def elsewhere() -> Decision:
        return asyncio.run(g.admit(ROOM, "echo", True))

    other = await asyncio.to_thread(elsewhere)
    assert other.allowed
    assert other.count == 2
    assert (await g.admit(ROOM, "echo", True)).reason == "budget_exceeded"
    await g.aclose()


@pytest.mark.redis
async def test_issue15_redis_state_shares_the_pair(redis_url: str) -> None:
    parrot = RoomGuard(POLICY, redis_url, bot_id="parrot-r")
    echo = RoomGuard(POLICY, redis_url, bot_id="echo-r")
    async with parrot, echo:
        seen = []
        for _ in range(3):
            seen.append(await parrot.admit(ROOM, "echo-r", True))
            seen.append(await echo.admit(ROOM, "parrot-r", True))
    assert sum(d.allowed for d in seen) == 3
    assert sum(1 for d in seen if d.notice) == 1


RING = ("parrot-ring", "echo-ring", "robin-ring")


async def _ring(state: str, clock: FakeClock, room: str) -> list[list[Decision]]:
    """A three-bot ring at 3 s a message, each message admitted by the other two guards."""
    guards = {bot: RoomGuard(None, state, bot_id=bot, clock=clock) for bot in RING}
    rounds: list[list[Decision]] = []
    try:
        for n in range(25):
            sender = RING[n % 3]
            clock.advance(3)
            rounds.append(
                [
                    await g.admit(room, sender, True, message_id=f"m{n}", sender_name=sender)
                    for bot, g in guards.items()
                    if bot != sender
                ]
            )
            if not any(d.allowed for d in rounds[-1]):
                break
    finally:
        for g in guards.values():
            await g.aclose()
    return rounds


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
async def test_issue20_room_guards_cut_a_three_bot_ring_like_a_pair(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if backend == "redis":  # a room of its own on the shared server
        state = str(request.getfixturevalue("redis_url"))
    else:
        state = f"sqlite:///{tmp_path / 'ring.sqlite3'}"
    rounds = await _ring(state, FakeClock(), f"discord:ring-{tmp_path.name}")
    # Each pair sees two thirds of the traffic, under its budget: the room budget (20 per
    # 90 s) refuses the 21st message, for both of its receivers, with one notice.
    assert len(rounds) == 21
    assert all(d.allowed for round_ in rounds[:20] for d in round_)
    assert sorted(d.reason for d in rounds[20]) == ["room_budget_exceeded", "room_cooldown"]
    [notice] = [d.notice for d in rounds[20] if d.notice]
    assert notice == (
        "Loop guard: pausing replies to bots in this room for 1 min 30 s "
        "(20 bot messages in 1 min 30 s from parrot-ring, echo-ring and robin-ring)."
    )


async def test_issue20_one_guard_sees_a_ring_of_senders_and_its_shadow_mode() -> None:
    clock = FakeClock()
    enforce = RoomGuard(None, bot_id="parrot", clock=clock)
    shadow = RoomGuard({"bot_loop": {"mode": "shadow"}}, bot_id="parrot", clock=clock)
    for g in (enforce, shadow):
        decisions = []
        for n in range(21):
            clock.advance(2)
            sender = ("echo", "robin")[n % 2]
            decisions.append(await g.admit(ROOM, sender, True, message_id=f"m{n}"))
        assert decisions[-1].reason == "room_budget_exceeded"
        assert decisions[-1].count == 20
        if g is enforce:
            assert not decisions[-1].allowed
            assert decisions[-1].notice is not None
            assert "from echo and robin" in decisions[-1].notice
        else:
            assert decisions[-1].allowed
            assert decisions[-1].shadow
            assert decisions[-1].notice is None
        await g.aclose()


def test_issue20_a_room_budget_beyond_what_redis_counts_names_the_field() -> None:
    with pytest.raises(ConfigError, match="policy.bot_loop.room_max_events_per_window"):
        RoomGuard({"bot_loop": {"room_max_events_per_window": -1}}, bot_id="parrot")
