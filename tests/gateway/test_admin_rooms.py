"""The console's Rooms data (`GET /admin/rooms`), Forget, and the structured admin answers.

The gateway runs for real (runtime, HTTP server on loopback) on the in-memory platform,
with an injected clock so cooldowns and pauses read exact seconds; the replica case runs
two gateways on one real redis-server.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Callable, Mapping, Sequence

import aiohttp
import pytest

from gateway.admin.access import MAX_ADMIN_BODY_BYTES
from gateway.admin.rooms import MAX_ROOMS, Rooms, RoomsQuery
from gateway.admin.service import AdminService, split_room
from gateway.app.policies import PolicyCache
from gateway.app.refusals import RecentRefusals
from gateway.app.runtime import Gateway
from gateway.calls.store import MemoryCallStore
from gateway.config import Config, parse_config
from gateway.state import transcripts
from gateway.state.base import AuditEntry, StateStore, TranscriptEntry
from gateway.state.memory import MemoryStateStore
from gateway.state.redis import RedisStateStore
from guards.call_loop import CallLoopPolicy, UniquenessRule
from tests.gateway.runtime_helpers import FakePlatform

TOKEN = "adm-rooms-5e6f7a"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
CONFIG = f"""
http: {{host: 127.0.0.1, port: 0, admin_token: {TOKEN}}}
agents: {{parrot: {{kind: scripted, default: 'echo: {{text}}'}}}}
bots:
  - {{id: bot-a, platform: room, agent: parrot}}
admins: {{room: [alice]}}
channels:
  - match: {{platform: room, channel: quiet}}
    policy: {{bot_loop: {{max_events_per_window: 4}}}}
  - {{match: {{platform: room, channel: 'team-*'}}, policy: {{}}}}
"""
QUIET = "room:quiet"
LOBBY = "room:lobby"
_messages = itertools.count(1)


class Clock:
    """A clock the test moves; the gateway's state and refusals read it."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def config() -> Config:
    return parse_config(CONFIG, env={})


def build(state: StateStore | None = None, clock: Callable[[], float] | None = None) -> Gateway:
    return Gateway(
        config(),
        state=state,
        clock=clock,
        connector_factory=FakePlatform(),
        connect_timeout=5.0,
        start_backoff=(0.01, 0.05),
    )


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def gateway(clock: Clock) -> AsyncIterator[Gateway]:
    running = build(clock=clock)
    await running.start()
    yield running
    await running.stop(1.0)


def url(gateway: Gateway, path: str) -> str:
    return f"http://127.0.0.1:{gateway.port}{path}"


async def get(
    client: aiohttp.ClientSession, gateway: Gateway, path: str, params: dict[str, str] | None = None
) -> tuple[int, dict[str, object]]:
    async with client.get(url(gateway, path), params=params, headers=AUTH) as response:
        return response.status, await response.json()


async def post(
    client: aiohttp.ClientSession, gateway: Gateway, path: str, body: dict[str, object]
) -> tuple[int, dict[str, object]]:
    async with client.post(url(gateway, path), json=body, headers=AUTH) as response:
        return response.status, await response.json()


async def room(
    client: aiohttp.ClientSession, gateway: Gateway, key: str = QUIET
) -> dict[str, object]:
    status, body = await get(client, gateway, "/admin/rooms", {"room": key})
    assert status == 200, body
    rooms = body["rooms"]
    assert isinstance(rooms, list)
    assert len(rooms) == 1
    found: dict[str, object] = rooms[0]
    return found


def room_keys(data: Mapping[str, object] | None) -> list[str]:
    """The room keys of a `/admin/rooms` answer, in order."""
    assert data is not None
    rooms = data["rooms"]
    assert isinstance(rooms, list)
    return [r["room"] for r in rooms]


async def exchange(state: StateStore, times: int, scope: str = QUIET) -> None:
    """`times` bot-to-bot messages between bot-a and peer-bot, under the room's policy."""
    platform, channel = split_room(scope)
    resolved = await PolicyCache(config()).room(state, platform, channel, None)
    for _ in range(times):
        await state.pair_decide(
            scope=scope, self_bot_id="bot-a", sender_bot_id="peer-bot", policy=resolved.bot_loop
        )


async def remember(state: StateStore, scope: str, count: int) -> None:
    for _ in range(count):
        key = f"m{next(_messages)}"
        await state.transcript_append(
            scope, TranscriptEntry(key, "u1", "Ann", "hello"), max_messages=50, ttl=600.0
        )


async def test_issue12_a_room_object_shows_policy_overrides_pause_pairs_and_bot_turns(
    client: aiohttp.ClientSession, gateway: Gateway, clock: Clock
) -> None:
    status, _ = await post(
        client,
        gateway,
        "/admin/set",
        {"room": QUIET, "field": "bot_loop.cooldown_seconds", "value": 90},
    )
    assert status == 200
    await exchange(gateway.state, 5)  # a budget of 4: the 5th opens the cooldown
    clock.now += 10.0
    for n in range(3):
        await gateway.state.bot_turn(QUIET, is_bot=True, message_key=f"t{n}")
    assert (await post(client, gateway, "/admin/pause", {"room": QUIET, "seconds": 600}))[0] == 200
    shown = await room(client, gateway)
    assert shown == {
        "room": QUIET,
        "platform": "room",
        "channel": "quiet",
        "paused": True,
        "paused_left": 600.0,
        "policy": shown["policy"],
        "overrides": {"bot_loop.cooldown_seconds": 90},
        "pairs": [
            {
                "bot_a": "bot-a",
                "bot_b": "peer-bot",
                "names": ["bot-a", "peer-bot"],
                "count": 4,
                "budget": 4,
                "window_seconds": 60.0,
                "cooldown_left": 80.0,
            }
        ],
        "bot_turns": 3,
        "max_bot_turns": 30,
        "shadow": {},
        "recent_refusals": [],
        "degraded": False,
        "linked": [],
    }
    policy = shown["policy"]
    assert isinstance(policy, dict)
    assert policy["bot_loop"]["max_events_per_window"] == 4  # the channel rule
    assert policy["bot_loop"]["cooldown_seconds"] == 90.0  # the runtime override
    # Reading the room counted no bot turn.
    assert (await room(client, gateway))["bot_turns"] == 3
    assert await gateway.state.bot_turns_peek(QUIET) == 3


async def test_issue12_status_answers_the_same_room_object_and_its_text(
    client: aiohttp.ClientSession, gateway: Gateway
) -> None:
    await exchange(gateway.state, 2)
    await gateway.state.pause(QUIET, None)
    status, body = await get(client, gateway, "/admin/status", {"room": QUIET})
    assert status == 200
    text = body.pop("result")
    assert body.pop("ok") is True
    assert body == await room(client, gateway)
    assert text == await AdminService(config(), gateway.state).status(QUIET)
    assert "Paused: yes, until resumed" in str(text)
    assert "bot-a ↔ peer-bot: 2 in window" in str(text)
    # A pause until resumed: paused, with no time left to count down.
    assert (body["paused"], body["paused_left"]) == (True, None)


async def test_issue12_rooms_lists_configured_paired_and_audited_rooms(
    client: aiohttp.ClientSession, gateway: Gateway
) -> None:
    await exchange(gateway.state, 1, scope=LOBBY)
    assert (await post(client, gateway, "/admin/pause", {"room": "slack:C9"}))[0] == 200
    status, body = await get(client, gateway, "/admin/rooms")
    assert status == 200
    rooms = body["rooms"]
    assert isinstance(rooms, list)
    keys = [r["room"] for r in rooms]
    # Seen now (a live pair), seen at the pause's audit entry, then configured (no glob).
    assert keys == [LOBBY, "slack:C9", QUIET]
    assert body["result"] == "\n".join(keys)
    assert rooms[1]["paused"] is True
    assert rooms[0]["pairs"][0]["count"] == 1
    status, body = await get(client, gateway, "/admin/rooms", {"limit": "1"})
    assert room_keys(body) == [LOBBY]


async def test_issue12_rooms_merges_the_given_sources_newest_first() -> None:
    state = MemoryStateStore()
    admin = AdminService(config(), state)
    await state.audit(
        AuditEntry(50.0, "room", "room:a", "alice", "alice", "/loop pause", True, "done")
    )
    await state.audit(
        AuditEntry(10.0, "http", "*", "admin-api", "x", "POST /admin/reset", True, "done")
    )

    async def activity() -> Sequence[tuple[str, float]]:
        return [("slack:C1", 200.0), ("room:a", 40.0), ("discord:9", 100.0)]

    rooms = Rooms(admin, state, config(), sources=[activity], clock=lambda: 300.0)
    await exchange(state, 1, scope="room:b")
    shown = await rooms.show(RoomsQuery())
    assert room_keys(shown.data) == ["room:b", "slack:C1", "discord:9", "room:a", QUIET]
    assert room_keys((await rooms.show(RoomsQuery(limit=2))).data) == ["room:b", "slack:C1"]


async def test_issue12_a_room_object_shows_shadow_counts_and_recent_refusals() -> None:
    state = MemoryStateStore()
    recent = RecentRefusals(clock=lambda: 100.0)
    admin = AdminService(config(), state, recent=recent)
    await admin.set(QUIET, "bot_loop.mode", "shadow")
    recent.add(QUIET, "silence", "silenced", "NO_REPLY", bot="bot-a", sender="peer-bot")
    recent.add_shadowed(QUIET, "bot_loop")
    recent.add_shadowed(QUIET, "bot_loop")
    recent.clock = lambda: 130.0
    shown = await admin.status_ack(QUIET)
    assert shown.data is not None
    assert shown.data["shadow"] == {"bot_loop": 2}
    assert shown.data["recent_refusals"] == [
        {"age": 30.0, "stage": "silence", "code": "silenced", "detail": "NO_REPLY"}
    ]
    assert "bot_loop: shadow: would have refused 2" in shown.text


@pytest.mark.parametrize("seconds", [600, 3600, None])
async def test_issue12_the_rooms_page_buttons_pause_resume_and_reset(
    client: aiohttp.ClientSession, gateway: Gateway, seconds: int | None
) -> None:
    await exchange(gateway.state, 2)
    await gateway.state.bot_turn(QUIET, is_bot=True)
    body: dict[str, object] = (
        {"room": QUIET} if seconds is None else {"room": QUIET, "seconds": seconds}
    )
    assert (await post(client, gateway, "/admin/pause", body))[0] == 200
    paused = await room(client, gateway)
    assert (paused["paused"], paused["paused_left"]) == (True, seconds and float(seconds))
    assert (await post(client, gateway, "/admin/resume", {"room": QUIET}))[0] == 200
    assert (await room(client, gateway))["paused"] is False
    assert (await post(client, gateway, "/admin/reset", {"room": QUIET}))[0] == 200
    reset = await room(client, gateway)
    assert (reset["pairs"], reset["bot_turns"]) == ([], 0)


async def test_issue12_forget_empties_a_room_or_one_thread_and_is_audited(
    client: aiohttp.ClientSession, gateway: Gateway
) -> None:
    await remember(gateway.state, transcripts.scope(QUIET, None), 2)
    await remember(gateway.state, transcripts.scope(QUIET, "t1"), 3)
    await remember(gateway.state, transcripts.scope(QUIET, "t2"), 1)
    status, body = await post(client, gateway, "/admin/forget", {"room": QUIET, "thread": "t1"})
    assert (status, body["ok"]) == (200, True)
    assert "3 messages" in str(body["result"])
    status, body = await post(client, gateway, "/admin/forget", {"room": QUIET})
    assert status == 200
    assert "3 messages" in str(body["result"])  # the room's 2 and thread t2's 1
    for thread in (None, "t1", "t2"):
        held = await gateway.state.transcript_recent(transcripts.scope(QUIET, thread), 10)
        assert held.entries == ()
    status, body = await post(client, gateway, "/admin/forget", {"room": "room:never-seen"})
    assert (status, body["ok"]) == (200, True)
    assert "0 messages" in str(body["result"])
    audited = await gateway.state.recent_audit(3)
    assert [e.command.split(" {")[0] for e in audited] == ["POST /admin/forget"] * 3
    assert [e.room for e in audited] == ["room:never-seen", QUIET, QUIET]
    async with client.post(url(gateway, "/admin/forget"), json={"room": QUIET}) as response:
        assert response.status == 401


async def test_issue12_audit_answers_structured_entries_newest_first(
    client: aiohttp.ClientSession, gateway: Gateway
) -> None:
    await gateway.state.audit(
        AuditEntry(0.0, "room", LOBBY, "mallory", "Mallory", "/loop reset", False, "refused")
    )
    assert (await post(client, gateway, "/admin/resume", {"room": QUIET}))[0] == 200
    status, body = await get(client, gateway, "/admin/audit", {"kind": "all"})
    assert status == 200
    entries = body["entries"]
    assert isinstance(entries, list)
    assert isinstance(body["result"], str)
    assert body["result"].splitlines()[1].startswith("1970-01-01T00:00:00Z room:lobby mallory")
    newest, oldest = entries
    assert oldest == {
        "at": 0.0,
        "iso": "1970-01-01T00:00:00Z",
        "kind": "others",
        "platform": "room",
        "room": LOBBY,
        "user_id": "mallory",
        "user_name": "Mallory",
        "command": "/loop reset",
        "allowed": False,
        "outcome": "refused",
    }
    assert (newest["platform"], newest["room"], newest["allowed"]) == ("http", QUIET, True)
    assert newest["command"].startswith("POST /admin/resume")


async def test_issue12_circuits_answer_structured_circuits_and_rule_groups(
    client: aiohttp.ClientSession, clock: Clock
) -> None:
    per_customer = UniquenessRule.from_dict(
        {
            "name": "per-customer",
            "fields": ["customer"],
            "max_calls": 1,
            "window_seconds": 60,
            "action": "pause",
        }
    )
    calls = MemoryCallStore(
        CallLoopPolicy(max_repeats=1, pause_seconds=30.0), [per_customer], clock=clock
    )
    for _ in range(2):
        await calls.decide("bot/session=s1", "fp-1")
    for n in range(2):
        await calls.decide("bot/session=s2", f"fp-{n + 2}", {"customer": "c1"})
    running = Gateway(
        config(),
        calls=calls,
        clock=clock,
        connector_factory=FakePlatform(),
        connect_timeout=5.0,
    )
    await running.start()
    try:
        status, body = await get(client, running, "/admin/circuits")
    finally:
        await running.stop(1.0)
    assert status == 200
    assert "Paused LLM-call circuits" in str(body["result"])
    assert body["circuits"] == [
        {
            "circuit": "bot/session=s1",
            "rule": None,
            "group": False,
            "paused_left": 30.0,
            "reason": "loop_detected",
            "count": 1,
        },
        {
            "circuit": "rule=per-customer/customer=c1",
            "rule": "per-customer",
            "group": True,
            "paused_left": 30.0,
            "reason": "rule:per-customer",
            "count": 1,
        },
    ]


@pytest.mark.parametrize(
    "key",
    [
        "<script>alert(1)</script>",
        "discord:",
        ":1100",
        "room:" + "x" * 300,
    ],
)
async def test_issue12_rooms_refuses_a_room_that_is_no_room_key_naming_room(
    client: aiohttp.ClientSession, gateway: Gateway, key: str
) -> None:
    for status, body in (
        await get(client, gateway, "/admin/rooms", {"room": key}),
        await post(client, gateway, "/admin/forget", {"room": key}),
    ):
        assert status == 400
        assert str(body["error"]).startswith("room:")
    assert (await room(client, gateway))["room"] == QUIET  # the next request is served


async def test_issue12_a_10_kb_room_is_refused_and_the_gateway_serves_on(
    client: aiohttp.ClientSession, gateway: Gateway
) -> None:
    huge = "room:" + "x" * 10_240
    async with client.get(
        url(gateway, "/admin/rooms"), params={"room": huge}, headers=AUTH
    ) as response:
        assert response.status == 400  # aiohttp's request-line limit, or ours
    status, body = await post(client, gateway, "/admin/forget", {"room": huge})
    assert (status, str(body["error"]).startswith("room:")) == (400, True)
    status, body = await post(
        client, gateway, "/admin/forget", {"room": QUIET, "thread": "t" * 10_240}
    )
    assert (status, str(body["error"]).startswith("thread:")) == (400, True)
    assert (await room(client, gateway))["room"] == QUIET


@pytest.mark.parametrize(
    "key",
    [
        "room:<script>alert(1)</script>",
        "room:<img src=x onerror=alert(1)>",
        "room:ｌｏｂｂｙ",  # full-width look-alike of room:lobby: another room
        "room:lobby%2F..%2Fadmin",
    ],
)
async def test_issue12_a_hostile_room_name_is_served_verbatim_as_json_data(
    client: aiohttp.ClientSession, gateway: Gateway, key: str
) -> None:
    await exchange(gateway.state, 2, scope=LOBBY)
    async with client.get(
        url(gateway, "/admin/rooms"), params={"room": key}, headers=AUTH
    ) as response:
        assert response.status == 200
        assert response.content_type == "application/json"
        body = await response.json()
    (shown,) = body["rooms"]
    assert shown["room"] == key
    assert shown["pairs"] == []  # never folded into room:lobby's pairs
    assert (await post(client, gateway, "/admin/forget", {"room": key}))[0] == 200


@pytest.mark.parametrize(
    "limit", ["inf", "nan", "1e308", "9" * 5000, "-1", "0", str(MAX_ROOMS + 1), "５", "1.5", ""]
)
async def test_issue12_rooms_refuses_a_hostile_limit_naming_limit(
    client: aiohttp.ClientSession, gateway: Gateway, limit: str
) -> None:
    status, body = await get(client, gateway, "/admin/rooms", {"limit": limit})
    assert status == 400
    assert str(body["error"]).startswith("limit:")
    status, body = await get(client, gateway, "/admin/rooms", {"limit": "2"})
    assert status == 200


async def test_issue12_forget_refuses_hostile_bodies(
    client: aiohttp.ClientSession, gateway: Gateway
) -> None:
    bodies: list[tuple[dict[str, object], str]] = [
        ({"room": QUIET, "thread": ""}, "thread"),
        ({"room": QUIET, "thread": 5}, "thread"),
        ({"room": QUIET, "extra": 1}, "extra"),
        ({}, "room"),
    ]
    for body, field in bodies:
        status, answer = await post(client, gateway, "/admin/forget", body)
        assert (status, str(answer["error"]).split(":")[0]) == (400, field)
    oversized = b'{"room": "' + b"x" * MAX_ADMIN_BODY_BYTES + b'"}'
    async with client.post(url(gateway, "/admin/forget"), data=oversized, headers=AUTH) as response:
        assert response.status == 413
    async with client.post(
        url(gateway, "/admin/forget"), data=b"\xff\xfe not utf-8", headers=AUTH
    ) as response:
        assert response.status == 400


@pytest.mark.redis
async def test_issue12_two_replicas_on_one_redis_show_the_same_rooms(
    client: aiohttp.ClientSession, redis_url: str, clock: Clock
) -> None:
    replicas = [
        build(RedisStateStore(redis_url, key_prefix="rooms12:", clock=clock), clock)
        for _ in range(2)
    ]
    for replica in replicas:
        await replica.start()
    try:
        first, second = replicas
        await exchange(first.state, 5)
        await first.state.bot_turn(QUIET, is_bot=True)
        assert (await post(client, first, "/admin/pause", {"room": QUIET, "seconds": 3600}))[
            0
        ] == 200
        assert (
            await post(
                client,
                first,
                "/admin/set",
                {"room": QUIET, "field": "bot_loop.max_events_per_window", "value": 6},
            )
        )[0] == 200
        listings = [(await get(client, replica, "/admin/rooms"))[1] for replica in replicas]
        assert listings[0] == listings[1]
        shown = await room(client, second)
        assert (shown["paused_left"], shown["bot_turns"], shown["overrides"]) == (
            3600.0,
            1,
            {"bot_loop.max_events_per_window": 6},
        )
        pairs = shown["pairs"]
        assert isinstance(pairs, list)
        assert [(p["count"], p["budget"], p["cooldown_left"]) for p in pairs] == [(4, 6, 60.0)]
        assert (await post(client, second, "/admin/reset", {"room": QUIET}))[0] == 200
        assert (await room(client, first))["pairs"] == []
    finally:
        for replica in replicas:
            await replica.stop(1.0)
