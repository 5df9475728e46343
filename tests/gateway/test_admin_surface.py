"""The admin surface under hostile use (issue 20): the audit trail, room keys, the stream.

The gateway runs for real (runtime, pipeline, HTTP server on loopback) on the in-memory
platform, on each state backend where the issue names them (memory, a SQLite file, a
real redis-server).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from yarl import URL

from gateway.app.runtime import Gateway
from gateway.app.types import InboundMessage
from gateway.state.base import AuditEntry, StateStore
from gateway.state.memory import MemoryStateStore
from gateway.state.redis import RedisStateStore
from gateway.state.sqlite import SqliteStateStore
from tests.gateway.runtime_helpers import FakeConnector, FakePlatform, human, make_config

TOKEN = "adm-issue20-7c1d"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
LOBBY = "room:lobby"
FORGED = "/loop reset\n2026-11-30 10:00:00,000 INFO loopwarden.audit: forged"
_prefixes = itertools.count()


@dataclass(frozen=True)
class Running:
    """A started gateway, its bot's fake connector, and an HTTP client for its admin API."""

    gateway: Gateway
    bot: FakeConnector
    client: aiohttp.ClientSession

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.gateway.port}{path}"

    async def audit(self, **query: str) -> tuple[str, list[dict[str, object]]]:
        """`GET /admin/audit`: its text result and its entries."""
        async with self.client.get(
            self.url("/admin/audit"), params=query, headers=AUTH
        ) as response:
            assert response.status == 200
            answer = await response.json()
        return answer["result"], answer["entries"]


def said(text: str, sender: str, name: str = "") -> InboundMessage:
    """A fresh message in the lobby from `sender` (`alice` is the config's admin)."""
    return dataclasses.replace(human(text), sender_id=sender, sender_name=name or sender)


async def serve(state: StateStore | None = None) -> AsyncIterator[Running]:
    """A gateway on `state` (memory when None), stopped on exit."""
    platform = FakePlatform()
    gateway = Gateway(
        make_config(TOKEN),
        state=state,
        connector_factory=platform,
        connect_timeout=5.0,
        start_backoff=(0.01, 0.05),
    )
    await gateway.start()
    try:
        bot = platform.made["bot-a"]
        await bot.up.wait()
        async with aiohttp.ClientSession() as client:
            yield Running(gateway, bot, client)
    finally:
        await gateway.stop(1.0)


@pytest.fixture
async def rig() -> AsyncIterator[Running]:
    """A gateway on the memory backend."""
    async for running in serve():
        yield running


@pytest.fixture(params=["memory", "sqlite", pytest.param("redis", marks=pytest.mark.redis)])
async def backend_rig(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Running]:
    """A gateway on each state backend (it starts and closes the store)."""
    state: StateStore
    if request.param == "memory":
        state = MemoryStateStore()
    elif request.param == "sqlite":
        state = SqliteStateStore(tmp_path / "state.sqlite3")
    else:
        redis_url: str = request.getfixturevalue("redis_url")
        state = RedisStateStore(redis_url, key_prefix=f"issue20-{next(_prefixes)}:")
    async for running in serve(state):
        yield running


# The audit trail


async def test_issue20_a_thousand_resets_by_a_chat_user_leave_the_admins_entry(
    backend_rig: Running,
) -> None:
    rig = backend_rig
    await rig.bot.push(said("/loop pause 10m", "alice"))
    for _ in range(1_050):
        await rig.bot.push(said("/loop reset", "mallory"))
    _, admin = await rig.audit()
    assert [(e["user_id"], e["command"], e["kind"]) for e in admin] == [
        ("alice", "/loop pause 10m", "admin")
    ]
    _, others = await rig.audit(kind="others", limit="1000")
    assert len(others) == 50  # the sender's newest OTHERS_PER_SENDER
    assert {(e["user_id"], e["allowed"], e["kind"]) for e in others} == {
        ("mallory", False, "others")
    }
    _, both = await rig.audit(kind="all", limit="1000")
    in_chat = [(e["user_id"], e["kind"]) for e in both if e["platform"] == "room"]
    assert in_chat == [("mallory", "others")] * 50 + [("alice", "admin")]
    assert await rig.gateway.state.pause_remaining(LOBBY) is not None


async def test_issue20_a_persons_own_forget_in_a_dm_goes_to_the_others_log(rig: Running) -> None:
    dm = dataclasses.replace(said("/new", "mallory"), is_direct=True, channel_id="dm-mallory")
    await rig.bot.push(dm)
    assert (await rig.audit())[1] == []
    (own,) = (await rig.audit(kind="others"))[1]
    assert (own["user_id"], own["allowed"], own["outcome"]) == ("mallory", True, "done")


async def test_issue20_a_forged_audit_line_stays_one_visible_line(
    rig: Running, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="loopwarden.decision")
    await rig.bot.push(said(FORGED, "mallory", "Mal\u202elory\x1b[2J"))
    await rig.bot.push(said("/loop status\r\n\x85\u2028x", "alice", "Al\nice"))
    result, (newest, oldest) = await rig.audit(kind="all")
    lines = result.splitlines()
    assert len(lines) == 2
    assert lines[1].endswith(
        " room:lobby mallory (Mal\\u202elory\\x1b[2J) refused refused: "
        "/loop reset\\n2026-11-30 10:00:00,000 INFO loopwarden.audit: forged"
    )
    assert lines[0].endswith(
        " room:lobby alice (Al\\nice) allowed done: /loop status\\r\\n\\x85\\u2028x"
    )
    # The JSON the console shows (as text) holds the same escapes, nothing invisible.
    assert oldest["command"] == FORGED.replace("\n", "\\n")
    assert oldest["user_name"] == "Mal\\u202elory\\x1b[2J"
    assert (newest["user_name"], newest["command"]) == (
        "Al\\nice",
        "/loop status\\r\\n\\x85\\u2028x",
    )
    for entry in (newest, oldest):
        assert all(str(value).isprintable() for value in entry.values())
    # The decision log's lines about the two are one line each too.
    logged = [r.getMessage() for r in caplog.records if r.name == "loopwarden.decision"]
    assert logged
    assert all(line.isprintable() for line in logged)
    assert any("sender=Mal\\u202elory\\x1b[2J" in line for line in logged)
    assert any("by Al\\nice (done)" in line for line in logged)


# Room keys: one validation on every admin route that takes a room

LONG_ROOM = "room:" + "x" * 4_997  # 5,002 characters
HOSTILE_ROOMS = [
    pytest.param(LONG_ROOM, "at most 256 characters", id="5002-chars"),
    pytest.param("room:lob\nby", "control", id="newline"),
    pytest.param("room:lobby\r\n", "control", id="crlf"),
    pytest.param("room:lobby\x00", "control", id="nul"),
    pytest.param("room:\u202eybbol", "control", id="bidi-override"),
    pytest.param("room:lob\u200bby", "control", id="zero-width"),
    pytest.param("room\uff1alobby", "platform:channel", id="full-width-colon"),
]
ROOM_ROUTES: list[tuple[str, str, dict[str, object]]] = [
    ("POST", "/admin/pause", {"seconds": 60}),
    ("POST", "/admin/resume", {}),
    ("POST", "/admin/reset", {}),
    ("POST", "/admin/set", {"field": "bot_loop.max_events_per_window", "value": 3}),
    ("POST", "/admin/forget", {}),
    ("GET", "/admin/status", {}),
    ("GET", "/admin/policy", {}),
    ("GET", "/admin/spend", {}),
    ("GET", "/admin/audit", {}),
    ("GET", "/admin/rooms", {}),
    ("GET", "/admin/activity", {}),
    ("GET", "/admin/activity/series", {}),
    ("GET", "/admin/activity/stream", {}),
]


@pytest.mark.parametrize(("room", "why"), HOSTILE_ROOMS)
async def test_issue20_every_admin_route_refuses_a_hostile_room_naming_room(
    rig: Running, room: str, why: str
) -> None:
    for method, path, extra in ROOM_ROUTES:
        if method == "POST":
            sent = rig.client.post(rig.url(path), json={"room": room, **extra}, headers=AUTH)
        else:
            sent = rig.client.get(rig.url(path), params={"room": room}, headers=AUTH)
        async with sent as response:
            assert response.status == 400, (path, response.status)
            error = (await response.json())["error"]
        assert error.startswith("room: "), (path, error)
        assert why in error, (path, error)
    # Nothing was done, so nothing was audited, and no room is listed.
    assert (await rig.audit(kind="all"))[1] == []
    async with rig.client.get(rig.url("/admin/rooms"), headers=AUTH) as response:
        assert (await response.json())["rooms"] == []


@pytest.mark.parametrize("encoded", ["room:lob%0Aby", "room:lobby%00", "room:%E2%80%AElobby"])
async def test_issue20_a_percent_encoded_control_character_in_the_url_is_refused(
    rig: Running, encoded: str
) -> None:
    for path in ("/admin/status", "/admin/rooms", "/admin/activity/stream"):
        target = URL(rig.url(f"{path}?room={encoded}"), encoded=True)
        async with rig.client.get(target, headers=AUTH) as response:
            assert response.status == 400, path
            assert (await response.json())["error"].startswith("room: ")


async def test_issue20_a_look_alike_room_is_another_room(rig: Running) -> None:
    look_alike = "room:ｌｏｂｂｙ"  # full-width letters: a valid key, of another room
    async with rig.client.post(
        rig.url("/admin/pause"), json={"room": look_alike, "seconds": 60}, headers=AUTH
    ) as response:
        assert response.status == 200
    assert await rig.gateway.state.pause_remaining(LOBBY) is None
    assert await rig.gateway.state.pause_remaining(look_alike) is not None


async def test_issue20_the_rooms_page_lists_no_room_the_api_would_refuse(rig: Running) -> None:
    # Written as an earlier version let `/admin/pause` write them: no button could work.
    for room in (LONG_ROOM, "room:lob\nby", LOBBY):
        await rig.gateway.state.audit(
            AuditEntry(
                1.0, "http", room, "admin-api", "127.0.0.1", "POST /admin/pause", True, "done"
            )
        )
    async with rig.client.get(rig.url("/admin/rooms"), headers=AUTH) as response:
        rooms = [shown["room"] for shown in (await response.json())["rooms"]]
    assert rooms == [LOBBY]


# The activity stream


async def test_issue20_the_activity_stream_is_sent_no_store(rig: Running) -> None:
    async with rig.client.get(rig.url("/admin/activity/stream"), headers=AUTH) as stream:
        assert stream.status == 200
        assert stream.headers["Content-Type"] == "text/event-stream"
        assert stream.headers["Cache-Control"] == "no-store"
