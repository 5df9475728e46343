"""The Activity feed end to end: recorded by the pipeline, read over the admin API and live.

A real gateway (fake platform, memory state) records what its pipeline does; tests flush
the feed themselves instead of waiting for its timer. The stream is read over loopback by
aiohttp's client, or by a raw socket that never reads. Waits are bounded, never a pass
condition.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace

import aiohttp
import pytest
from aiohttp import web
from pydantic import SecretStr

from gateway.admin.access import AdminAccess
from gateway.admin.activity import STREAM_BATCH, ActivityRoutes
from gateway.admin.service import AdminService
from gateway.app.errors import StateError
from gateway.app.refusals import RecentRefusals
from gateway.app.runtime import Gateway
from gateway.app.types import InboundMessage
from gateway.observability.activity import EXCERPT_CHARS, ActivityFeed, excerpt
from gateway.state.activity import ActivityEvent
from gateway.state.memory import MemoryStateStore
from tests.connectors.connector_helpers import wait_for
from tests.fakes.loopback import serve_loopback
from tests.gateway.runtime_helpers import FakePlatform, gateway_for, human, make_config

TOKEN = "adm-activity-9f8e7d6c5b4a"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
WAIT = 10.0
"""A bound on every wait, so a broken run fails instead of hanging."""

TWO_BOTS = """
http: {host: 127.0.0.1, port: 0, admin_token: '${ADMIN:-}'}
agents: {parrot: {kind: scripted, default: 'echo: {text}'}}
bots:
  - {id: bot-a, platform: room, agent: parrot}
  - {id: bot-b, platform: room, agent: parrot}
admins: {room: [alice]}
"""


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.fixture
def platform() -> FakePlatform:
    return FakePlatform()


@pytest.fixture
async def gateway(platform: FakePlatform) -> AsyncIterator[Gateway]:
    gateway = gateway_for(make_config(TOKEN, TWO_BOTS), platform)
    await gateway.start()
    try:
        yield gateway
    finally:
        await gateway.stop(1.0)


def url(gateway: Gateway | int, path: str) -> str:
    port = gateway if isinstance(gateway, int) else gateway.port
    return f"http://127.0.0.1:{port}{path}"


async def read_activity(
    client: aiohttp.ClientSession, gateway: Gateway, query: str = ""
) -> dict[str, object]:
    async with client.get(url(gateway, f"/admin/activity{query}"), headers=AUTH) as response:
        assert response.status == 200, await response.text()
        answer: dict[str, object] = await response.json()
    return answer


def events_of(answer: dict[str, object]) -> list[dict[str, object]]:
    events = answer["events"]
    assert isinstance(events, list)
    return events


async def next_block(response: aiohttp.ClientResponse) -> dict[str, str]:
    """One server-sent event (or comment) as its fields, `comment` for a `:` line."""
    fields: dict[str, str] = {}
    async with asyncio.timeout(WAIT):
        while True:
            line = (await response.content.readline()).decode()
            if line == "":
                return {"eof": ""}
            line = line.rstrip("\r\n")
            if not line:
                if fields:
                    return fields
                continue
            name, _, value = line.partition(":")
            fields[name or "comment"] = value.removeprefix(" ")


async def next_event(response: aiohttp.ClientResponse) -> dict[str, str]:
    """The next block that is not a keep-alive comment."""
    while True:
        block = await next_block(response)
        if "comment" not in block:
            return block


def totals(chart: dict[str, list[dict[str, int]]]) -> tuple[int, int]:
    """Messages in and replies out over a chart's buckets (a minute may turn meanwhile)."""
    return sum(b["in"] for b in chart["buckets"]), sum(b["out"] for b in chart["buckets"])


def message_to(bot_id: str, message: InboundMessage) -> InboundMessage:
    """The same platform message as another hosted bot receives it."""
    return replace(message, bot_id=bot_id, bot_user_id=bot_id)


async def test_issue12_a_message_is_in_once_however_many_bots_answer(
    gateway: Gateway, platform: FakePlatform, client: aiohttp.ClientSession
) -> None:
    message = human("hello <script>alert(1)</script>\nsecond line")
    await platform.made["bot-a"].push(message)
    await platform.made["bot-b"].push(message_to("bot-b", message))
    await gateway.activity.flush()
    answer = await read_activity(client, gateway)
    events = events_of(answer)
    assert [(e["kind"], e["bot"]) for e in events] == [
        ("in", ""),
        ("reply", "bot-a"),
        ("reply", "bot-b"),
    ]
    first = events[0]
    assert first["excerpt"] == "hello <script>alert(1)</script> second line", "text, unescaped"
    assert first["room"] == "room:lobby"
    assert first["sender"] == "Human"
    assert first["message"] == message.message_key
    assert events[1]["excerpt"] == "echo: hello <script>alert(1)</script> second line"
    assert answer["cursor"] == events[-1]["id"]
    result = answer["result"]
    assert isinstance(result, str)
    assert len(result.splitlines()) == 3
    assert "room:lobby in Human: 'hello <script>" in result
    assert events[1]["sender"] == "bot-a", "a reply is the bot's own words"
    series = await client.get(url(gateway, "/admin/activity/series?span=hour"), headers=AUTH)
    chart = await series.json()
    assert chart["span"] == "hour"
    assert len(chart["buckets"]) == 60
    assert totals(chart) == (1, 2)
    assert chart["result"] == "last hour: 1 in, 2 out, 0 refused"


async def test_issue12_refusals_and_notices_are_listed_but_not_a_bots_own_echo(
    gateway: Gateway, platform: FakePlatform, client: aiohttp.ClientSession
) -> None:
    bot = platform.made["bot-a"]
    command = replace(human("/loop pause"), sender_id="alice", sender_name="alice")
    await bot.push(command)
    await bot.push(human("anyone there?"))
    await bot.push(replace(human("echo: mine"), sender_id="bot-a", sender_name="A"))
    await gateway.activity.flush()
    events = events_of(await read_activity(client, gateway))
    listed = [(e["kind"], e["stage"], e["code"]) for e in events]
    assert listed[0] == ("in", "", "")
    assert ("notice", "admin", "pause") in listed
    (notice,) = [e for e in events if e["kind"] == "notice"]
    assert notice["detail"] == "pause by alice (done)"
    assert ("refusal", "admission", "paused") in listed
    assert all(e["stage"] != "self_filter" for e in events), "a DEBUG drop stays out"
    assert all(e["sender"] != "A" for e in events)
    chart = await (
        await client.get(url(gateway, "/admin/activity/series?room=room:lobby"), headers=AUTH)
    ).json()
    assert [b["refusals"] for b in chart["buckets"] if b["refusals"]] == [{"admission": 1}]


def test_issue12_the_excerpt_is_one_line_and_cut() -> None:
    assert excerpt("a\n\n b\tc\r\n") == "a b c"
    cut = excerpt("word " * 100)
    assert len(cut) == EXCERPT_CHARS
    assert cut.endswith("…")
    assert excerpt("x" * 10_000_000).endswith("…")
    assert excerpt(" " * 300 + "tail") == "…", "cut at the excerpt's reach"


def _message(index: int) -> InboundMessage:
    return human(f"message {index}")


async def test_issue12_the_buffer_is_bounded_and_drops_the_oldest() -> None:
    state = MemoryStateStore()
    feed = ActivityFeed(state, max_buffer=3)
    for index in range(5):
        feed.message_in(_message(index))
    assert feed.dropped == 2
    await feed.flush()
    events, _ = await state.activity_since(None, 10)
    assert [e.excerpt for e in events] == ["message 2", "message 3", "message 4"]


class _BrokenState(MemoryStateStore):
    """A store whose feed appends fail, as a Redis outage does, `failures` times."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    async def activity_append(self, events: Sequence[ActivityEvent]) -> None:
        if self.failures:
            self.failures -= 1
            raise StateError("the redis state store is unreachable")
        await super().activity_append(events)


async def test_issue12_a_batch_the_backend_refuses_is_lost_not_the_feed() -> None:
    state = _BrokenState(failures=1)
    feed = ActivityFeed(state, flush_interval=0.01)
    feed.start()
    feed.message_in(_message(1))
    await feed.flush()
    feed.message_in(_message(2))
    await feed.aclose()
    events, _ = await state.activity_since(None, 10)
    assert [e.excerpt for e in events] == ["message 2"], "aclose flushed what was left"
    assert feed.closed


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("since=inf", "since"),
        ("since=1e308", "since"),
        ("since=" + "9" * 5000, "since"),
        ("since=-1", "since"),
        ("since=%EF%BC%91%EF%BC%92", "since"),  # fullwidth digits
        ("since=%D9%A1", "since"),  # Arabic-Indic digit one
        ("since=0x10", "since"),
        ("since=", "since"),
        ("limit=0", "limit"),
        ("limit=1001", "limit"),
        ("limit=nan", "limit"),
        ("limit=%F0%9D%9F%8F", "limit"),  # mathematical bold digit one
        ("room=room:lobby%00", "room"),
        ("room=room:" + "x" * 300, "room"),
        ("room=lobby", "room"),
        ("rooms=room:lobby", "rooms"),
    ],
)
async def test_issue12_hostile_activity_queries_are_400_naming_the_field(
    gateway: Gateway, client: aiohttp.ClientSession, query: str, field: str
) -> None:
    for path in ("/admin/activity", "/admin/activity/stream"):
        if path.endswith("stream") and field == "limit":
            continue
        async with client.get(url(gateway, f"{path}?{query}"), headers=AUTH) as response:
            assert response.status == 400
            error = (await response.json())["error"]
            assert error.startswith(f"{field}:"), error
    await read_activity(client, gateway, "?limit=1000&since=0")


async def test_issue12_hostile_series_and_last_event_id_are_400(
    gateway: Gateway, client: aiohttp.ClientSession
) -> None:
    async with client.get(url(gateway, "/admin/activity/series?span=week"), headers=AUTH) as r:
        assert r.status == 400
        assert (await r.json())["error"].startswith("span:")
    for bad in ("1e308", "-3", "１", "9" * 5000):
        headers = {**AUTH, "Last-Event-ID": bad}
        async with client.get(url(gateway, "/admin/activity/stream"), headers=headers) as r:
            assert r.status == 400
            assert (await r.json())["error"].startswith("Last-Event-ID:")


async def test_issue12_the_feed_needs_the_admin_token(
    platform: FakePlatform, client: aiohttp.ClientSession
) -> None:
    gateway = gateway_for(make_config(""), platform)
    await gateway.start()
    try:
        for path in ("/admin/activity", "/admin/activity/series", "/admin/activity/stream"):
            async with client.get(url(gateway, path)) as response:
                assert response.status == 403
    finally:
        await gateway.stop(1.0)


async def test_issue12_wrong_token_is_401(gateway: Gateway, client: aiohttp.ClientSession) -> None:
    for path in ("/admin/activity", "/admin/activity/stream"):
        headers = {"Authorization": "Bearer wrong-token-0000000"}
        async with client.get(url(gateway, path), headers=headers) as response:
            assert response.status == 401


async def test_issue12_the_stream_sends_new_events_and_resumes_after_last_event_id(
    gateway: Gateway, platform: FakePlatform, client: aiohttp.ClientSession
) -> None:
    bot = platform.made["bot-a"]
    await bot.push(human("before"))
    await gateway.activity.flush()
    async with client.get(url(gateway, "/admin/activity/stream"), headers=AUTH) as stream:
        assert stream.status == 200
        assert stream.headers["Content-Type"] == "text/event-stream"
        backlog = [json.loads((await next_event(stream))["data"]) for _ in range(2)]
        assert [e["kind"] for e in backlog] == ["in", "reply"]
        await bot.push(human("live one"))
        await gateway.activity.flush()
        live = await next_event(stream)
        seen = json.loads(live["data"])
        assert (seen["kind"], seen["excerpt"]) == ("in", "live one")
        assert live["id"] == str(seen["id"])
    await bot.push(human("while away"))
    await gateway.activity.flush()
    headers = {**AUTH, "Last-Event-ID": live["id"]}
    async with client.get(url(gateway, "/admin/activity/stream"), headers=headers) as again:
        resumed = [json.loads((await next_event(again))["data"]) for _ in range(3)]
    assert [(e["kind"], e["excerpt"]) for e in resumed] == [
        ("reply", "echo: live one"),
        ("in", "while away"),
        ("reply", "echo: while away"),
    ]


async def test_issue12_a_room_stream_lists_only_that_room(
    gateway: Gateway, platform: FakePlatform, client: aiohttp.ClientSession
) -> None:
    bot = platform.made["bot-a"]
    path = "/admin/activity/stream?room=room:elsewhere&since=0"
    async with client.get(url(gateway, path), headers=AUTH) as stream:
        await bot.push(human("lobby talk"))
        await bot.push(human("over here", channel="elsewhere"))
        await gateway.activity.flush()
        got = json.loads((await next_event(stream))["data"])
    assert (got["room"], got["excerpt"]) == ("room:elsewhere", "over here")


@pytest.fixture
async def small() -> AsyncIterator[tuple[int, ActivityRoutes, ActivityFeed]]:
    """A bare app serving the feed's routes with small bounds: 2 streams, quick pings."""
    state = MemoryStateStore()
    config = make_config(TOKEN)
    feed = ActivityFeed(state, flush_interval=0.01)
    routes = ActivityRoutes(
        AdminService(config, state, recent=RecentRefusals()),
        feed,
        state,
        AdminAccess(SecretStr(TOKEN)),
        max_streams=2,
        poll_seconds=0.05,
        ping_interval=0.05,
        send_timeout=0.5,
    )
    app = web.Application()
    app.add_routes(routes.routes())
    runner = web.AppRunner(app, shutdown_timeout=1.0)
    port = await serve_loopback(runner)
    feed.start()
    try:
        yield port, routes, feed
    finally:
        await feed.aclose()
        await runner.cleanup()


async def test_issue12_a_keep_alive_comment_and_a_bound_on_streams(
    small: tuple[int, ActivityRoutes, ActivityFeed], client: aiohttp.ClientSession
) -> None:
    port, routes, _ = small
    path = url(port, "/admin/activity/stream")
    async with client.get(path, headers=AUTH) as one, client.get(path, headers=AUTH) as two:
        assert (await next_block(one)) == {"comment": "ping"}
        assert (await next_block(two)) == {"comment": "ping"}
        assert routes.streams == 2
        async with client.get(path, headers=AUTH) as three:
            assert three.status == 503
            assert three.headers["Retry-After"]
            assert "at most 2" in (await three.json())["error"]
    await wait_for(lambda: not routes.streams)
    async with client.get(path, headers=AUTH) as again:
        assert again.status == 200


async def test_issue12_many_clients_see_the_same_events(
    gateway: Gateway, platform: FakePlatform, client: aiohttp.ClientSession
) -> None:
    path = url(gateway, "/admin/activity/stream?since=0")
    streams = [await client.get(path, headers=AUTH) for _ in range(8)]
    try:
        await platform.made["bot-a"].push(human("for everyone"))
        await gateway.activity.flush()
        firsts = [json.loads((await next_event(s))["data"]) for s in streams]
    finally:
        for stream in streams:
            stream.close()
    assert {(e["id"], e["excerpt"]) for e in firsts} == {(firsts[0]["id"], "for everyone")}


async def test_issue12_a_stream_far_behind_jumps_to_the_newest_with_a_gap_event(
    small: tuple[int, ActivityRoutes, ActivityFeed], client: aiohttp.ClientSession
) -> None:
    port, _, feed = small
    for index in range(STREAM_BATCH * 3):
        feed.message_in(_message(index))
    await feed.flush()
    async with client.get(url(port, "/admin/activity/stream?since=1"), headers=AUTH) as stream:
        gap = await next_event(stream)
        first = json.loads((await next_event(stream))["data"])
    assert gap["event"] == "gap"
    assert json.loads(gap["data"]) == {"after": 1, "before": STREAM_BATCH * 2 + 1}
    assert first["id"] == STREAM_BATCH * 2 + 1


async def test_issue12_a_client_that_never_reads_is_cut_off_and_the_rest_is_served(
    small: tuple[int, ActivityRoutes, ActivityFeed], client: aiohttp.ClientSession
) -> None:
    port, routes, feed = small
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, ("127.0.0.1", port))
    request = (
        f"GET /admin/activity/stream HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n\r\n"
    )
    await loop.sock_sendall(sock, request.encode())
    try:
        await wait_for(lambda: routes.streams > 0)
        async with asyncio.timeout(WAIT):
            big = human("x" * 10_000)
            sent = 0
            while routes.streams:
                for _ in range(STREAM_BATCH):
                    sent += 1
                    feed.message_in(replace(big, message_id=f"flood-{sent}"))
                await feed.flush()
                async with client.get(url(port, "/admin/activity?limit=1"), headers=AUTH) as r:
                    assert r.status == 200
                await asyncio.sleep(0.01)
    finally:
        sock.close()
    async with client.get(url(port, "/admin/activity/stream"), headers=AUTH) as stream:
        assert stream.status == 200


async def test_issue12_streams_end_cleanly_when_the_gateway_stops(
    platform: FakePlatform, client: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    gateway = gateway_for(make_config(TOKEN, TWO_BOTS), platform)
    await gateway.start()
    before = asyncio.all_tasks()
    streams = [
        await client.get(url(gateway, "/admin/activity/stream"), headers=AUTH) for _ in range(3)
    ]
    await platform.made["bot-a"].push(human("last words"))
    with caplog.at_level(logging.WARNING):
        await gateway.stop(2.0)
    for stream in streams:
        blocks = [await next_block(stream)]
        while "eof" not in blocks[-1]:
            blocks.append(await next_block(stream))
        assert [json.loads(b["data"])["excerpt"] for b in blocks if "data" in b] == [
            "last words",
            "echo: last words",
        ], "the last batch was flushed before the streams ended"
        stream.close()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert not {t for t in asyncio.all_tasks() - before if not t.done()} - {asyncio.current_task()}
    with pytest.raises(aiohttp.ClientConnectionError):
        await client.get(url(gateway, "/admin/activity"))


def test_issue12_an_event_reads_back_as_the_api_shows_it() -> None:
    event = ActivityEvent(7, 1.5, "r:1", "b", "s", "shadow", "bot_loop", "c", "d", "e", "m")
    assert event.as_json() == {
        "id": 7,
        "at": 1.5,
        "room": "r:1",
        "bot": "b",
        "sender": "s",
        "kind": "shadow",
        "stage": "bot_loop",
        "code": "c",
        "detail": "d",
        "excerpt": "e",
        "message": "m",
        "routine": False,
    }
    routine = event._replace(kind="refusal", stage="admission", code="not_addressed")
    assert routine.as_json()["routine"] is True, "the page hides these unless asked"


REPLICA = """
state: {{backend: redis, url: '{url}', key_prefix: 'gw12:'}}
http: {{host: 127.0.0.1, port: 0, admin_token: '{token}'}}
agents: {{parrot: {{kind: scripted, default: 'echo: {{text}}'}}}}
bots:
  - {{id: {bot}, platform: room, agent: parrot}}
"""


@pytest.mark.redis
async def test_issue12_two_gateways_on_one_redis_show_one_feed(
    redis_url: str, client: aiohttp.ClientSession
) -> None:
    platforms = {"bot-a": FakePlatform(), "bot-b": FakePlatform()}
    gateways = [
        gateway_for(make_config(text=REPLICA.format(url=redis_url, token=TOKEN, bot=bot)), platform)
        for bot, platform in platforms.items()
    ]
    for each in gateways:
        await each.start()
    try:
        message = human("to both replicas")
        await platforms["bot-a"].made["bot-a"].push(message)
        await platforms["bot-b"].made["bot-b"].push(message_to("bot-b", message))
        for each in gateways:
            await each.activity.flush()
        answers = [await read_activity(client, each) for each in gateways]
        charts = [
            await (await client.get(url(each, "/admin/activity/series"), headers=AUTH)).json()
            for each in gateways
        ]
    finally:
        for each in gateways:
            await each.stop(1.0)
    assert answers[0]["events"] == answers[1]["events"]
    assert sorted((e["kind"], e["bot"]) for e in events_of(answers[0])) == [
        ("in", ""),
        ("reply", "bot-a"),
        ("reply", "bot-b"),
    ]
    for chart in charts:
        assert totals(chart) == (1, 2)
