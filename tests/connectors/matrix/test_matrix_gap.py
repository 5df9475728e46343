"""Paging back a sync gap (issue 23): matrix-nio's `/messages` against a scripted homeserver.

The real Synapse tests (test_matrix_sync_gap_e2e.py) show a gap filled and a gap over the
page bound; here a loopback aiohttp app answers `/messages` as scripted, for what a real
homeserver does not do on cue: a rate limit, a refusal, a malformed page, a dropped
connection. Each test reads what nio asked (`from`, `to`, `dir`, `limit`, `filter`).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from nio import AsyncClient, AsyncClientConfig, Event
from nio.responses import Timeline

from connectors.matrix.gap import Gap, fill_gap
from tests.connectors.connector_helpers import refused_port
from tests.fakes.loopback import LOOPBACK_HOST, serve_loopback

Json = dict[str, Any]
ROOM = "!room:example.org"
SINCE = "s10_saved"
FIRST_SYNC_MS = 1_700_000_000_000
NOT_MINE = {"not_senders": ["@helper:example.org"]}


def _event(n: int, *, ts: int = FIRST_SYNC_MS + 1000) -> Json:
    return {
        "type": "m.room.message",
        "event_id": f"$e{n}",
        "sender": "@alice:example.org",
        "origin_server_ts": ts + n,
        "content": {"msgtype": "m.text", "body": f"message {n}"},
    }


def _page(numbers: list[int], end: str | None) -> tuple[int, Json]:
    """A 200 answer holding those events (newest first, as `dir=b` gives them)."""
    answer: Json = {"chunk": [_event(n) for n in numbers], "start": "x"}
    if end is not None:
        answer["end"] = end
    return 200, answer


def _error(status: int, errcode: str, **more: object) -> tuple[int, Json]:
    return status, {"errcode": errcode, "error": "scripted", **more}


@dataclass
class Homeserver:
    """Answers `/messages` with the scripted (status, JSON) pairs in turn; records queries."""

    answers: list[tuple[int, Json]]
    asked: list[dict[str, str]] = field(default_factory=list)

    async def messages(self, request: web.Request) -> web.Response:
        self.asked.append(dict(request.query))
        status, body = self.answers.pop(0)
        return web.json_response(body, status=status)


Serve = Callable[[Homeserver], Awaitable[AsyncClient]]
"""Serves a scripted homeserver on loopback; a nio client to it."""


@dataclass
class Sleeps:
    """The `sleep` given to fill_gap: records the waits instead of waiting."""

    waits: list[float] = field(default_factory=list)

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


def _client(url: str) -> AsyncClient:
    """A nio client configured as the connector's: it never retries a 429 or a timeout."""
    client = AsyncClient(
        url,
        "@helper:example.org",
        config=AsyncClientConfig(max_limit_exceeded=0, max_timeouts=0, encryption_enabled=False),
    )
    client.access_token = "syt_test"
    return client


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    """Serve a `Homeserver` on loopback; a nio client to it."""
    runners: list[web.AppRunner] = []
    clients: list[AsyncClient] = []

    async def start(homeserver: Homeserver) -> AsyncClient:
        app = web.Application()
        app.router.add_get("/_matrix/client/v3/rooms/{room}/messages", homeserver.messages)
        runner = web.AppRunner(app, access_log=None)
        runners.append(runner)
        port = await serve_loopback(runner)
        clients.append(_client(f"http://{LOOPBACK_HOST}:{port}"))
        return clients[-1]

    yield start
    for client in clients:
        await client.close()
    for runner in runners:
        await runner.cleanup()


def _timeline(numbers: list[int], *, limited: bool = True) -> Timeline:
    return Timeline([Event.parse_event(_event(n)) for n in numbers], limited, "p1")


async def _fill(client: AsyncClient, timeline: Timeline, **options: Any) -> tuple[Gap, Sleeps]:
    sleeps = Sleeps()
    settings: dict[str, Any] = {"page_size": 3, "max_pages": 10, **options}
    gap = await fill_gap(
        client,
        ROOM,
        timeline,
        since=SINCE,
        since_ms=FIRST_SYNC_MS,
        events_filter=NOT_MINE,
        sleep=sleeps,
        **settings,
    )
    return gap, sleeps


def _ids(gap: Gap) -> list[str]:
    return [e["event_id"] for e in gap.events if isinstance(e, dict)]


async def test_issue23_a_gap_is_paged_back_to_the_sync_position_oldest_first_each_once(
    serve: Serve,
) -> None:
    homeserver = Homeserver([_page([6, 5, 4], "p2"), _page([3, 2, 1], "p3"), _page([], None)])
    client = await serve(homeserver)

    gap, _ = await _fill(client, _timeline([6, 7, 8]))

    assert (_ids(gap), gap.complete) == (["$e1", "$e2", "$e3", "$e4", "$e5"], True)
    assert [q["from"] for q in homeserver.asked] == ["p1", "p2", "p3"]
    assert {(q["to"], q["dir"], q["limit"]) for q in homeserver.asked} == {(SINCE, "b", "3")}
    assert json.loads(homeserver.asked[0]["filter"]) == NOT_MINE


async def test_issue23_a_timeline_that_is_not_limited_asks_nothing(serve: Serve) -> None:
    homeserver = Homeserver([])
    client = await serve(homeserver)

    gap, _ = await _fill(client, _timeline([1, 2], limited=False))

    assert (gap.events, gap.complete, homeserver.asked) == ([], True, [])


async def test_issue23_paging_stops_at_events_older_than_the_first_sync(serve: Serve) -> None:
    old = _event(1, ts=FIRST_SYNC_MS - 60_000)
    homeserver = Homeserver([(200, {"chunk": [_event(2), old], "start": "x", "end": "p2"})])
    client = await serve(homeserver)

    gap, _ = await _fill(client, _timeline([3]))

    assert (_ids(gap), gap.complete, len(homeserver.asked)) == (["$e1", "$e2"], True, 1)


async def test_issue23_m_limit_exceeded_while_paging_waits_and_asks_the_same_page_again(
    serve: Serve,
) -> None:
    limited = _error(429, "M_LIMIT_EXCEEDED", retry_after_ms=1500)
    homeserver = Homeserver([limited, _page([2, 1], "p2"), _page([], None)])
    client = await serve(homeserver)

    gap, sleeps = await _fill(client, _timeline([3]))

    assert (_ids(gap), gap.complete, sleeps.waits) == (["$e1", "$e2"], True, [1.5])
    assert [q["from"] for q in homeserver.asked] == ["p1", "p1", "p2"]


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (_error(403, "M_FORBIDDEN"), "M_FORBIDDEN"),
        (_error(404, "M_NOT_FOUND"), "M_NOT_FOUND"),
        ((200, {"chunk": "not a list", "start": "x"}), "unknown error"),
        ((200, {"chunk": [{"type": 7}] * 3}), "unknown error"),
        ((500, {"message": "x" * 100_000}), "unknown error"),
    ],
    ids=["forbidden", "room_gone", "chunk_not_a_list", "no_start_token", "huge_500"],
)
async def test_issue23_a_refused_or_unreadable_page_leaves_the_gap_open_with_what_was_found(
    serve: Serve, answer: tuple[int, Json], why: str
) -> None:
    homeserver = Homeserver([_page([4, 3], "p2"), answer])
    client = await serve(homeserver)

    gap, _ = await _fill(client, _timeline([5]))

    assert (_ids(gap), gap.complete, gap.why) == (["$e3", "$e4"], False, why)


async def test_issue23_the_page_bound_leaves_the_gap_open(serve: Serve) -> None:
    homeserver = Homeserver([_page([6, 5, 4], "p2"), _page([3, 2, 1], "p3")])
    client = await serve(homeserver)

    gap, _ = await _fill(client, _timeline([7]), max_pages=2)

    assert (len(gap.events), gap.complete, gap.why) == (6, False, "2 pages")
    assert len(homeserver.asked) == 2


async def test_issue23_a_connection_failure_while_paging_is_raised_to_sync_again() -> None:
    with refused_port() as port:
        client = _client(f"http://{LOOPBACK_HOST}:{port}")
        try:
            with pytest.raises(aiohttp.ClientConnectionError):
                await _fill(client, _timeline([1]))
        finally:
            await client.close()
