"""The HTTP server over loopback: health, readiness, metrics and the admin API's auth."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import aiohttp
import pytest
from prometheus_client import CONTENT_TYPE_LATEST

from gateway.admin.access import MAX_ADMIN_BODY_BYTES
from gateway.app.runtime import Gateway
from gateway.state.base import AuditEntry
from tests.gateway.runtime_helpers import FakePlatform, gateway_for, human, make_config

TOKEN = "adm-9f8e7d6c5b4a"


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.fixture
async def admin_gateway() -> AsyncIterator[Gateway]:
    gateway = gateway_for(make_config(TOKEN), FakePlatform())
    await gateway.start()
    yield gateway
    await gateway.stop(1.0)


def url(gateway: Gateway, path: str) -> str:
    return f"http://127.0.0.1:{gateway.port}{path}"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_healthz_and_readyz_follow_the_connectors(client: aiohttp.ClientSession) -> None:
    hold = asyncio.Event()
    platform = FakePlatform(hold_start=hold)
    gateway = gateway_for(make_config(), platform)
    starting = asyncio.create_task(gateway.start())
    connector = platform.made["bot-a"]
    try:
        await connector.start_called.wait()
        async with client.get(url(gateway, "/healthz")) as response:
            assert (response.status, await response.text()) == (200, "ok")
        async with client.get(url(gateway, "/readyz")) as response:
            assert response.status == 503
            assert await response.json() == {
                "ready": False,
                "stopping": False,
                "not_connected": ["bot-a"],
            }
        hold.set()
        await starting
        async with client.get(url(gateway, "/readyz")) as response:
            assert (response.status, await response.json()) == (200, {"ready": True})
        connector.is_connected = False  # the platform dropped us; reconnecting
        async with client.get(url(gateway, "/readyz")) as response:
            assert response.status == 503
            assert (await response.json())["not_connected"] == ["bot-a"]
        connector.is_connected = True
        async with client.get(url(gateway, "/readyz")) as response:
            assert response.status == 200
    finally:
        hold.set()
        await starting
        await gateway.stop(1.0)


async def test_readyz_with_no_bots_is_ready_once_up(client: aiohttp.ClientSession) -> None:
    gateway = gateway_for(make_config(text="http: {port: 0}\nagents: {}\n"), FakePlatform())
    await gateway.start()
    try:
        async with client.get(url(gateway, "/readyz")) as response:
            assert response.status == 200
    finally:
        await gateway.stop(1.0)


async def test_metrics_count_messages(client: aiohttp.ClientSession) -> None:
    platform = FakePlatform()
    gateway = gateway_for(make_config(), platform)
    await gateway.start()
    try:
        await platform.made["bot-a"].push(human("hello"))
        async with client.get(url(gateway, "/metrics")) as response:
            assert response.status == 200
            assert response.headers["Content-Type"] == CONTENT_TYPE_LATEST
            body = await response.text()
    finally:
        await gateway.stop(1.0)
    assert 'messages_in_total{platform="room"} 1.0' in body
    assert 'replies_out_total{platform="room"} 1.0' in body


async def test_admin_api_is_disabled_without_a_token(client: aiohttp.ClientSession) -> None:
    gateway = gateway_for(make_config(), FakePlatform())
    await gateway.start()
    try:
        async with client.get(
            url(gateway, "/admin/status?room=room:lobby"), headers=bearer("anything")
        ) as response:
            assert response.status == 403
            assert await response.json() == {"error": "admin API disabled"}
    finally:
        await gateway.stop(1.0)


@pytest.mark.parametrize(
    "headers",
    [{}, bearer("wrong"), bearer(TOKEN + "x"), {"Authorization": f"Basic {TOKEN}"}],
)
async def test_admin_api_refuses_a_missing_or_wrong_token(
    client: aiohttp.ClientSession, admin_gateway: Gateway, headers: dict[str, str]
) -> None:
    async with client.post(
        url(admin_gateway, "/admin/reset"), json={"all": True}, headers=headers
    ) as response:
        assert response.status == 401
        assert response.headers["WWW-Authenticate"] == "Bearer"


async def test_admin_api_with_the_token(
    client: aiohttp.ClientSession, admin_gateway: Gateway, caplog: pytest.LogCaptureFixture
) -> None:
    auth = bearer(TOKEN)
    with caplog.at_level(logging.INFO, logger="loopwarden.audit"):
        async with client.post(
            url(admin_gateway, "/admin/pause"),
            json={"room": "room:lobby", "seconds": 60},
            headers=auth,
        ) as response:
            assert response.status == 200
            body = await response.json()
            assert body["ok"] is True
            assert isinstance(body["result"], str)
        assert await admin_gateway.state.pause_remaining("room:lobby") is not None
        async with client.get(
            url(admin_gateway, "/admin/status?room=room:lobby"), headers=auth
        ) as response:
            assert response.status == 200
        async with client.post(
            url(admin_gateway, "/admin/resume"), json={"room": "room:lobby"}, headers=auth
        ) as response:
            assert response.status == 200
        assert await admin_gateway.state.pause_remaining("room:lobby") is None
        async with client.post(
            url(admin_gateway, "/admin/set"),
            json={"room": "room:lobby", "field": "bot_loop.max_events_per_window", "value": 4},
            headers=auth,
        ) as response:
            assert response.status == 200
        overrides = await admin_gateway.state.get_overrides("room:lobby")
        assert overrides["bot_loop.max_events_per_window"] == 4
        async with client.get(
            url(admin_gateway, "/admin/policy?room=room:lobby"), headers=auth
        ) as response:
            assert response.status == 200
            assert "4" in (await response.json())["result"]
        for body_json in ({"room": "room:lobby"}, {"all": True}, {"bot": "bot-a"}):
            async with client.post(
                url(admin_gateway, "/admin/reset"), json=body_json, headers=auth
            ) as response:
                assert response.status == 200
        async with client.get(url(admin_gateway, "/admin/status"), headers={}) as response:
            assert response.status == 401
    audit = [r.getMessage() for r in caplog.records if r.name == "loopwarden.audit"]
    assert len(audit) == 9
    assert any("status=401" in line for line in audit)
    assert TOKEN not in caplog.text


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/admin/reset", {}, "exactly one"),
        ("/admin/reset", {"room": "room:lobby", "all": True}, "exactly one"),
        ("/admin/pause", {"seconds": 5}, "room"),
        ("/admin/pause", {"room": "room:lobby", "seconds": -1}, "seconds"),
        ("/admin/set", {"room": "room:lobby", "field": "x"}, "value"),
        ("/admin/resume", {"room": "room:lobby", "extra": 1}, "extra"),
        ("/admin/resume", {"room": "lobby"}, "platform:channel"),
    ],
)
async def test_admin_api_rejects_bad_bodies(
    client: aiohttp.ClientSession,
    admin_gateway: Gateway,
    path: str,
    body: dict[str, object],
    field: str,
) -> None:
    async with client.post(url(admin_gateway, path), json=body, headers=bearer(TOKEN)) as response:
        assert response.status == 400
        answer = await response.json()
        assert answer["ok"] is False
        assert field in answer["error"]


async def test_admin_api_rejects_non_json_and_missing_room(
    client: aiohttp.ClientSession, admin_gateway: Gateway
) -> None:
    async with client.post(
        url(admin_gateway, "/admin/resume"), data=b"not json", headers=bearer(TOKEN)
    ) as response:
        assert response.status == 400
    async with client.get(url(admin_gateway, "/admin/status"), headers=bearer(TOKEN)) as response:
        assert response.status == 400
        assert "room" in (await response.json())["error"]


@pytest.mark.parametrize(
    ("field", "value"), [("bot_loop.max_events_per_window", 0), ("bot_loop.nonsense", 3)]
)
async def test_admin_set_refused_by_the_policy_is_422_and_changes_nothing(
    client: aiohttp.ClientSession, admin_gateway: Gateway, field: str, value: int
) -> None:
    async with client.post(
        url(admin_gateway, "/admin/set"),
        json={"room": "room:lobby", "field": field, "value": value},
        headers=bearer(TOKEN),
    ) as response:
        assert response.status == 422
        assert (await response.json())["ok"] is False
    assert await admin_gateway.state.get_overrides("room:lobby") == {}


async def test_authorised_calls_join_the_state_audit_log(
    client: aiohttp.ClientSession, admin_gateway: Gateway
) -> None:
    async with client.post(
        url(admin_gateway, "/admin/reset"), json={"all": True}, headers=bearer(TOKEN)
    ) as response:
        assert response.status == 200
    async with client.post(url(admin_gateway, "/admin/reset"), json={"all": True}) as response:
        assert response.status == 401
    entries = await admin_gateway.state.recent_audit()
    assert [(e.platform, e.room, e.user_id, e.allowed, e.outcome) for e in entries] == [
        ("http", "*", "admin-api", True, "done")
    ]
    assert entries[0].command.startswith("POST /admin/reset")


async def test_issue5_the_audit_log_is_readable_through_the_admin_api(
    client: aiohttp.ClientSession, admin_gateway: Gateway
) -> None:
    await admin_gateway.state.audit(
        AuditEntry(
            at=0.0,
            platform="room",
            room="room:lobby",
            user_id="mallory",
            user_name="mallory",
            command="/loop reset",
            allowed=False,
            outcome="refused",
        )
    )
    async with client.get(
        url(admin_gateway, "/admin/audit?room=room:lobby&limit=5&kind=others"),
        headers=bearer(TOKEN),
    ) as response:
        assert response.status == 200
        lines = (await response.json())["result"].splitlines()
    assert lines == [
        "1970-01-01T00:00:00Z room:lobby mallory (mallory) refused refused: /loop reset"
    ]
    async with client.get(url(admin_gateway, "/admin/audit")) as response:
        assert response.status == 401


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("bot_loop.window_seconds", "inf"),
        ("bot_loop.window_seconds", 1e300),
        ("bot_loop.cooldown_seconds", 1e308),
        ("silence.tokens", "['***']"),
        ("tool_loop.max_time_per_turn", 1e300),
        ("tool_loop.idempotent_warn_threshold", "５"),
    ],
)
async def test_issue9_admin_set_of_a_value_the_guards_cannot_run_with_is_422(
    client: aiohttp.ClientSession, field: str, value: object
) -> None:
    platform = FakePlatform()
    gateway = gateway_for(make_config(TOKEN), platform)
    await gateway.start()
    try:
        async with client.post(
            url(gateway, "/admin/set"),
            json={"room": "room:lobby", "field": field, "value": value},
            headers=bearer(TOKEN),
        ) as response:
            assert response.status == 422
            answer = await response.json()
        assert answer["ok"] is False
        assert answer["error"].startswith(f"Can't set {field}: ")
        assert await gateway.state.get_overrides("room:lobby") == {}
        connector = platform.made["bot-a"]
        await connector.push(human("hello"))
        assert [reply.text for _, reply in connector.sent] == ["echo: hello"]
    finally:
        await gateway.stop(1.0)


@pytest.mark.parametrize("seconds", [1e300, 1e308, 31_622_401])
async def test_issue9_admin_pause_beyond_366_days_is_refused_naming_seconds(
    client: aiohttp.ClientSession, admin_gateway: Gateway, seconds: float
) -> None:
    async with client.post(
        url(admin_gateway, "/admin/pause"),
        json={"room": "room:lobby", "seconds": seconds},
        headers=bearer(TOKEN),
    ) as response:
        assert response.status == 400
        error = (await response.json())["error"]
    assert error.startswith("seconds: ")
    assert "366 days" in error
    assert await admin_gateway.state.pause_remaining("room:lobby") is None
    async with client.post(
        url(admin_gateway, "/admin/pause"),
        json={"room": "room:lobby", "seconds": 31_622_400},
        headers=bearer(TOKEN),
    ) as response:
        assert response.status == 200


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        pytest.param(b"[" * 20_000 + b"]" * 20_000, (400, "nested deeper"), id="nested-20k"),
        pytest.param(
            b'{"room": ' + b"[" * 30_000 + b"]" * 30_000 + b"}",
            (400, "nested deeper"),
            id="nested-30k",
        ),
        # 50,000 levels are 100 KB, more than any admin call needs: refused before parsing.
        pytest.param(b"[" * 50_000 + b"]" * 50_000, (413, "larger than"), id="nested-50k"),
        pytest.param(
            b'{"room": "room:lobby", "seconds": ' + b"9" * 5_000 + b"}",
            (400, "not acceptable"),
            id="5000-digits",
        ),
        pytest.param(b'{"room": "room:lobby", "seconds": NaN}', (400, "NaN"), id="nan"),
        pytest.param(
            b'{"room": "room:lobby", "seconds": 1e999}', (400, "out of range"), id="overflow"
        ),
        pytest.param(b'{"room": "room:caf\xe9"}', (400, "not UTF-8"), id="latin-1"),
        pytest.param(b"x" * (MAX_ADMIN_BODY_BYTES + 1), (413, "larger than"), id="over-the-limit"),
    ],
)
async def test_issue9_admin_api_refuses_hostile_bodies(
    client: aiohttp.ClientSession,
    admin_gateway: Gateway,
    caplog: pytest.LogCaptureFixture,
    body: bytes,
    expected: tuple[int, str],
) -> None:
    status, why = expected
    with caplog.at_level(logging.INFO):
        async with client.post(
            url(admin_gateway, "/admin/pause"), data=body, headers=bearer(TOKEN)
        ) as response:
            assert response.status == status
            answer = await response.json()
    assert answer["ok"] is False
    assert why in answer["error"]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert any(f"status={status}" in r.getMessage() for r in caplog.records)
    assert await admin_gateway.state.pause_remaining("room:lobby") is None
    async with client.post(
        url(admin_gateway, "/admin/resume"), json={"room": "room:lobby"}, headers=bearer(TOKEN)
    ) as response:
        assert response.status == 200
