"""RedisStateStore against a real redis-server: replicas, server time, expiry and outages."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest
from redis.asyncio import Redis

from gateway.app.errors import StateError
from gateway.app.runtime import Gateway
from gateway.config import parse_config
from gateway.state.base import AuditEntry
from gateway.state.redis import RedisStateStore
from guards.bot_loop import BotLoopPolicy, PairDecision
from tests.fakes.redis_server import RedisServer, RedisServerMissing
from tests.gateway.state.hammer import admitted_across_processes

pytestmark = pytest.mark.redis

ROOM = "discord:1100"
POLICY = BotLoopPolicy(max_events_per_window=3, window_seconds=60.0, cooldown_seconds=30.0)
WAIT_SECONDS = 10.0
"""How soon the store must use Redis again after it is back (DESIGN.md §2 State)."""
LOGGER = "gateway.state.redis"


@asynccontextmanager
async def opened(url: str, **options: object) -> AsyncIterator[RedisStateStore]:
    """A started store, closed on exit."""
    store = RedisStateStore(url, **options)  # type: ignore[arg-type]
    await store.start()
    try:
        yield store
    finally:
        await store.aclose()


async def decide(store: RedisStateStore, me: str = "bot-a", sender: str = "bot-b") -> PairDecision:
    """One event of a pair in ROOM."""
    return await store.pair_decide(scope=ROOM, self_bot_id=me, sender_bot_id=sender, policy=POLICY)


def outage_lines(caplog: pytest.LogCaptureFixture, word: str) -> list[str]:
    """The store's log lines that contain `word`."""
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and word in r.getMessage()]


async def until_back(store: RedisStateStore) -> None:
    """Poll (bounded) until the store reaches Redis again."""
    async with asyncio.timeout(WAIT_SECONDS):
        while True:
            await store.pair_snapshot()
            if not store.degraded:
                return
            await asyncio.sleep(0.05)


# Replicas


def test_two_processes_of_twenty_coroutines_get_exactly_the_budget(redis: RedisServer) -> None:
    counts = admitted_across_processes("redis", redis.url, budget=7)
    assert sum(counts) == 7


async def test_replicas_share_budgets_cooldowns_claims_and_pauses(redis: RedisServer) -> None:
    async with opened(redis.url) as one, opened(redis.url) as two:
        assert [(await decide(store)).count for store in (one, two, one)] == [1, 2, 3]
        assert (await decide(two, "bot-b", "bot-a")).reason == "budget_exceeded"
        assert (await decide(one)).reason == "cooldown"
        assert await one.claim("notice:x", 30.0)
        assert not await two.claim("notice:x", 30.0)
        await two.pause(ROOM, 60.0)
        assert 0 < (await one.pause_remaining(ROOM) or 0) <= 60.0
        await one.set_override(ROOM, "bot_loop.max_events_per_window", 6)
        assert await two.get_overrides(ROOM) == {"bot_loop.max_events_per_window": 6}
        assert await two.pair_reset(scope=ROOM) == 1
        assert (await decide(one)).count == 1


async def test_replicas_with_skewed_clocks_agree_because_time_is_the_servers(
    redis: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    skewed = {"a": time.time() + 3600.0, "b": time.time() - 3600.0}
    async with opened(redis.url) as one, opened(redis.url) as two:
        decisions = []
        for n in range(5):
            name, store = ("a", one) if n % 2 == 0 else ("b", two)
            monkeypatch.setattr(time, "time", lambda name=name: skewed[name])
            decisions.append(await decide(store))
    assert [d.reason for d in decisions] == ["ok", "ok", "ok", "budget_exceeded", "cooldown"]
    assert 29.0 < decisions[4].retry_after <= 30.0


async def test_local_clocks_an_hour_apart_would_leak_the_budget(redis: RedisServer) -> None:
    # The counter-proof: replicas that each used their own clock would not share a window.
    start = time.time()
    ahead = RedisStateStore(redis.url, clock=lambda: start + 3600.0)
    behind = RedisStateStore(redis.url, clock=lambda: start)
    for store in (ahead, behind):
        await store.start()
    try:
        admitted = [(await decide(store)).allowed for store in (behind,) * 3 + (ahead,) * 3]
    finally:
        for store in (ahead, behind):
            await store.aclose()
    assert admitted == [True] * 6


# Keys and scripts


async def test_every_key_expires_by_itself(redis: RedisServer) -> None:
    async with opened(redis.url, key_prefix="exp:") as store:
        for _ in range(4):
            await decide(store)
        await decide(store, "bot-a", "bot-c")
        await store.claim("dedupe:discord:bot-a:1", 600.0)
        await store.bot_turn(ROOM, is_bot=True, message_key="discord:1100:1")
        await store.pause(ROOM, 90.0)
    client = Redis.from_url(redis.url, decode_responses=True)
    try:
        ttls = {key: await client.pttl(key) async for key in client.scan_iter("exp:*")}
    finally:
        await client.aclose()
    # One key per pair (its record), a claim, a bot-turn counter and its message, a pause.
    assert len(ttls) == 6, ttls
    for key, ttl in ttls.items():
        # Nothing outlives what it serves: window 60 s, cooldown 30 s, claim 600 s, pause 90 s.
        limit = 86_400_000 if key.startswith("exp:turns:") else 600_000
        assert 0 < ttl <= limit, (key, ttl)
    cooling = [ttl for key, ttl in ttls.items() if key.startswith("exp:budget:") and "bot-b" in key]
    # The cooling pair goes idle when its cooldown ends, before its last event's window.
    assert len(cooling) == 1
    assert all(ttl <= 30_000 for ttl in cooling)


async def test_issue10_a_pair_key_holds_its_pair_record(redis: RedisServer) -> None:
    now = [1_700_000_000.0]
    async with opened(redis.url, key_prefix="rec:", clock=lambda: now[0]) as store:
        await decide(store)
        now[0] += 0.1
        await store.pair_decide(
            scope=ROOM,
            self_bot_id="bot-b",
            sender_bot_id="bot-a",
            policy=BotLoopPolicy(max_events_per_window=2, window_seconds=30.0),
        )
        now[0] += 0.1
        refused = await store.pair_decide(
            scope=ROOM,
            self_bot_id="bot-a",
            sender_bot_id="bot-b",
            policy=BotLoopPolicy(max_events_per_window=2, cooldown_seconds=45.0),
        )
    assert refused.reason == "budget_exceeded"
    client = Redis.from_url(redis.url, decode_responses=True)
    try:
        keys = [key async for key in client.scan_iter("rec:*")]
        stored = await client.get(keys[0])
    finally:
        await client.aclose()
    assert keys == ["rec:budget:{discord:1100\x1fbot-a\x1fbot-b}"]
    assert isinstance(stored, str)
    start = 1_700_000_000.0
    cooldown_until = start + 0.1 + 0.1 + 45.0
    # idle_at, cooldown_until, the window last counted in, the event times, all exact.
    assert [float(field) for field in stored.split()] == [
        cooldown_until,
        cooldown_until,
        60.0,
        start,
        start + 0.1,
    ]


async def test_lost_scripts_are_loaded_again(redis: RedisServer) -> None:
    async with opened(redis.url) as store:
        assert (await decide(store)).allowed
        client = Redis.from_url(redis.url)
        try:
            await client.script_flush()
        finally:
            await client.aclose()
        assert (await decide(store)).count == 2
        assert await store.pause_remaining(ROOM) is None


async def test_scopes_with_glob_characters_are_matched_literally(redis: RedisServer) -> None:
    async with opened(redis.url) as store:
        for scope in ("slack:C[1]*", "slack:C1", "slack:C[1]*x"):
            await store.pair_decide(scope=scope, self_bot_id="a", sender_bot_id="b", policy=POLICY)
        assert [s.scope for s in await store.pair_snapshot("slack:C[1]*")] == ["slack:C[1]*"]
        assert await store.pair_reset(scope="slack:C[1]*") == 1
        assert {s.scope for s in await store.pair_snapshot()} == {"slack:C1", "slack:C[1]*x"}


async def test_key_prefixes_keep_gateways_apart(redis: RedisServer) -> None:
    async with (
        opened(redis.url, key_prefix="one:") as one,
        opened(redis.url, key_prefix="two:") as two,
    ):
        await decide(one)
        assert await two.pair_snapshot() == []
        assert await two.pair_reset() == 0
        assert (await decide(one)).count == 2


async def test_the_audit_log_is_capped(redis: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("gateway.state.redis.AUDIT_KEEP", 5)
    async with opened(redis.url) as store:
        for n in range(12):
            await store.audit(AuditEntry(float(n), "room", "room:lobby", "u", "u", "c", True, "ok"))
        assert [e.at for e in await store.recent_audit(100)] == [11.0, 10.0, 9.0, 8.0, 7.0]


# Outages


async def test_issue9_allow_decides_on_local_budgets_while_redis_is_down_and_logs_once(
    redis: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    async with opened(redis.url, probe_interval=0.0) as store:
        assert (await decide(store)).count == 1
        redis.stop()
        decisions = [await decide(store) for _ in range(5)]
        assert [(d.allowed, d.reason, d.count) for d in decisions] == [
            (True, "ok", 1),
            (True, "ok", 2),
            (True, "ok", 3),
            (False, "budget_exceeded", 3),
            (False, "cooldown", 3),
        ]
        assert store.degraded
        assert await store.claim("notice:discord:1", 60.0)
        assert not await store.claim("notice:discord:1", 60.0)
        assert await store.receive("dedupe:discord:1", 60.0)
        assert not await store.receive("dedupe:discord:1", 60.0)
        await store.confirm("dedupe:discord:1", 60.0)
        assert not await store.receive("dedupe:discord:1", 60.0)
        assert [await store.bot_turn(ROOM, is_bot=True) for _ in range(2)] == [1, 2]
        [pair] = await store.pair_snapshot()
        assert (pair.scope, pair.count) == (ROOM, 3)
        assert await store.get_overrides(ROOM) == {}
        assert await store.pause_remaining(ROOM) is None
        assert await store.recent_audit() == []
        await store.audit(AuditEntry(1.0, "room", ROOM, "u", "u", "/loop status", True, "done"))
        with pytest.raises(StateError):
            await store.pause(ROOM, 60.0)
        with pytest.raises(StateError):
            await store.set_override(ROOM, "bot_loop.enabled", False)
        with pytest.raises(StateError):
            await store.pair_reset()
        assert store.unavailable_calls >= 14
        assert len(outage_lines(caplog, "unreachable")) == 1
        assert "on_error=allow" in outage_lines(caplog, "unreachable")[0]

        redis.start()
        await until_back(store)
        assert len(outage_lines(caplog, "reachable again")) == 1
        # The server came back empty: budgets are enforced through it from scratch.
        assert [(await decide(store)).count for _ in range(3)] == [1, 2, 3]
        assert (await decide(store)).reason == "budget_exceeded"
        assert len(outage_lines(caplog, "unreachable")) == 1
        # The local counts were dropped when Redis came back: a new outage starts fresh.
        redis.stop()
        assert (await decide(store)).count == 1
        assert store.degraded


async def test_a_second_outage_is_logged_again(
    redis: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    async with opened(redis.url, probe_interval=0.0) as store:
        for _ in range(2):
            redis.stop()
            await decide(store)
            await decide(store)
            redis.start()
            await until_back(store)
    assert len(outage_lines(caplog, "unreachable")) == 2
    assert len(outage_lines(caplog, "reachable again")) == 2


async def test_deny_refuses_while_redis_is_down(redis: RedisServer) -> None:
    async with opened(redis.url, on_error="deny", probe_interval=0.0) as store:
        assert (await decide(store)).allowed
        assert await store.claim("dedupe:discord:1", 60.0)
        redis.stop()
        refused = await decide(store)
        assert (refused.allowed, refused.reason) == (False, "cooldown")
        assert not await store.claim("dedupe:discord:2", 60.0)
        redis.start()
        await until_back(store)
        assert await store.claim("dedupe:discord:2", 60.0)


async def test_while_down_most_calls_fail_fast_and_one_probe_goes_through(
    redis: RedisServer,
) -> None:
    async with opened(redis.url, probe_interval=3600.0) as store:
        redis.stop()
        await decide(store)
        failed = store.unavailable_calls
        for n in range(20):
            assert (await decide(store, sender=f"bot-{n}")).allowed
        assert store.unavailable_calls == failed + 20
        assert store.degraded


async def test_a_store_started_during_an_outage_connects_when_redis_comes(
    redis: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    redis.stop()
    async with opened(redis.url, probe_interval=0.0) as store:
        assert store.degraded
        redis.start()
        await until_back(store)
        assert (await decide(store)).count == 1


async def test_the_url_and_its_password_are_never_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    password = "s3cret-redis-password"
    try:
        server = RedisServer(tmp_path / "redis", password=password)
    except RedisServerMissing as exc:
        pytest.fail(str(exc))
    with server:
        async with opened(server.url, probe_interval=0.0) as store:
            assert (await decide(store)).count == 1
            server.stop()
            await decide(store)
            server.start()
            await until_back(store)
            assert password not in repr(store)
    assert outage_lines(caplog, "unreachable")
    assert password not in caplog.text
    assert server.url not in caplog.text


# The gateway through an outage (the room platform, in process)

GATEWAY_CONFIG = """
state: {backend: redis, url: '%s'}
http: {host: 127.0.0.1, port: 0}
agents:
  ping: {kind: scripted, rules: [{match: '(?i)@ping\\b', reply: '@pong ping'}]}
  pong: {kind: scripted, rules: [{match: '(?i)@pong\\b', reply: 'pong'}]}
bots:
  - {id: ping, platform: room, name: ping, agent: ping}
  - {id: pong, platform: room, name: pong, agent: pong}
policy:
  respond_to: {humans: all, bots: mentions}
  bot_loop: {max_events_per_window: 2, window_seconds: 3600, cooldown_seconds: 3600}
"""


async def said(ws: aiohttp.ClientWebSocketResponse, sender: str | None, needle: str) -> str:
    """The text of the next message (from `sender`, when given) containing `needle`."""
    async with asyncio.timeout(WAIT_SECONDS):
        while True:
            frame = await ws.receive()
            assert frame.type is aiohttp.WSMsgType.TEXT, frame
            event = json.loads(frame.data)
            text = str(event.get("text", ""))
            if sender in (None, event.get("sender_name")) and needle in text:
                return text


@asynccontextmanager
async def carol_in_the_lobby(
    config: str,
) -> AsyncIterator[tuple[Gateway, RedisStateStore, aiohttp.ClientWebSocketResponse]]:
    """A running gateway on Redis state with carol joined to its web room's lobby."""
    gateway = Gateway(parse_config(config))
    store = gateway.state
    assert isinstance(store, RedisStateStore)
    await gateway.start()
    try:
        async with (
            aiohttp.ClientSession() as client,
            client.ws_connect(f"http://127.0.0.1:{gateway.port}/room/ws") as ws,
        ):
            await ws.send_json({"type": "join", "name": "carol", "room": "lobby"})
            yield gateway, store, ws
    finally:
        await gateway.stop(5.0)


async def test_issue5_humans_are_answered_through_an_outage_and_budgets_resume_after(
    redis: RedisServer,
) -> None:
    async with carol_in_the_lobby(GATEWAY_CONFIG % redis.url) as (gateway, store, ws):
        await ws.send_json({"type": "say", "text": "@ping one"})
        await said(ws, "pong", "pong")

        redis.stop()
        await ws.send_json({"type": "say", "text": "@ping two"})
        assert await said(ws, "ping", "@pong") == "@pong ping"
        await said(ws, "pong", "pong")
        assert store.degraded
        assert gateway.metrics.value("state_degraded") == 1
        assert gateway.metrics.value("state_unavailable_calls_total") > 0

        redis.start()
        await until_back(store)
        assert gateway.metrics.value("state_degraded") == 0
        # Redis came back empty: two exchanges fit the budget, the third opens a cooldown.
        for text in ("@ping three", "@ping four"):
            await ws.send_json({"type": "say", "text": text})
            await said(ws, "pong", "pong")
        await ws.send_json({"type": "say", "text": "@ping five"})
        await said(ws, "pong", "Loop guard: pausing replies between pong and ping")
        [pair] = await store.pair_snapshot("room:lobby")
        assert (pair.bot_a, pair.bot_b, pair.count) == ("ping", "pong", 2)
        assert pair.cooldown_remaining > 3500


PING_PONG_CONFIG = """
state: {backend: redis, url: '%s'}
http: {host: 127.0.0.1, port: 0}
agents:
  ping: {kind: scripted, rules: [{match: '(?i)@ping\\b', reply: '@pong ping'}]}
  pong: {kind: scripted, rules: [{match: '(?i)@pong\\b', reply: '@ping pong'}]}
bots:
  - {id: ping, platform: room, name: ping, agent: ping}
  - {id: pong, platform: room, name: pong, agent: pong}
admins: {room: [carol]}
policy:
  respond_to: {humans: all, bots: mentions}
  bot_loop: {max_events_per_window: 3, window_seconds: 3600, cooldown_seconds: 3600}
"""


async def until_said(ws: aiohttp.ClientWebSocketResponse, needle: str) -> list[tuple[str, str]]:
    """Every (sender, text) said in the room up to and including the first with `needle`."""
    seen: list[tuple[str, str]] = []
    async with asyncio.timeout(WAIT_SECONDS):
        while True:
            frame = await ws.receive()
            assert frame.type is aiohttp.WSMsgType.TEXT, frame
            event = json.loads(frame.data)
            if "text" not in event:
                continue
            seen.append((str(event.get("sender_name")), str(event["text"])))
            if needle in seen[-1][1]:
                return seen


async def test_issue9_a_bot_ping_pong_is_cut_at_the_budget_while_redis_is_down(
    redis: RedisServer,
) -> None:
    async with carol_in_the_lobby(PING_PONG_CONFIG % redis.url) as (gateway, store, ws):
        redis.stop()
        await ws.send_json({"type": "say", "text": "@ping go"})
        seen = await until_said(ws, "Loop guard: pausing")
        bot_lines = [text for sender, text in seen if sender in ("ping", "pong")]
        # ping answers carol, then three bot-to-bot exchanges fit the local budget.
        assert len(bot_lines) == 1 + 3 + 1, bot_lines
        assert gateway.metrics.value("state_degraded") == 1
        await ws.send_json({"type": "say", "text": "/loop status"})
        status = (await until_said(ws, "Loop status for room:lobby"))[-1][1]
        assert "budgets and cooldowns are local to this process" in status
        assert "cooling down" in status

        redis.start()
        await until_back(store)
        await ws.send_json({"type": "say", "text": "/loop status"})
        status = (await until_said(ws, "Loop status for room:lobby"))[-1][1]
        assert "local to this process" not in status
        assert gateway.metrics.value("state_degraded") == 0
