"""Paused LLM-call circuits in chat (`/loop circuits`, `/loop reopen`) and the admin API.

The gateway runs for real (runtime, pipeline, HTTP server) on the in-memory platform with
sqlite state; its `openai` agent talks to the fake provider and counts its calls in the
runtime's CallStore, which a proxy or `loopwarden circuits` would share (issue 6).
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from gateway.app.runtime import Gateway
from gateway.calls.sqlite_store import SqliteCallStore
from gateway.config import parse_config
from guards.call_loop import CallLoopPolicy
from tests.fakes.llm_upstream import FakeLLM
from tests.gateway.runtime_helpers import FakePlatform, gateway_for, human

TOKEN = "adm-circuits-1b2c"
CIRCUIT = "helper/session=room%3Alobby"


@dataclasses.dataclass
class Running:
    gateway: Gateway
    platform: FakePlatform
    upstream: FakeLLM
    state_path: Path

    async def say(self, text: str, sender: str = "u-human") -> str | None:
        """One message from `sender` in room:lobby; the reply text the bot sent, if any."""
        connector = self.platform.made["bot-a"]
        before = len(connector.sent)
        await connector.push(dataclasses.replace(human(text), sender_id=sender))
        sent = connector.sent[before:]
        return sent[-1][1].text if sent else None


@pytest.fixture
async def running(tmp_path: Path) -> AsyncIterator[Running]:
    async with FakeLLM() as upstream:
        state_path = tmp_path / "state.sqlite3"
        config = parse_config(
            f"""
state: {{backend: sqlite, path: '{state_path}'}}
http: {{host: 127.0.0.1, port: 0, admin_token: {TOKEN}}}
agents:
  # No history: each request is then the message alone, so the 6th identical one loops.
  helper: {{kind: openai, base_url: '{upstream.url}/v1', model: gpt-4o-mini,
           history: {{max_messages: 0}}}}
bots:
  - {{id: bot-a, platform: room, agent: helper}}
admins: {{room: [alice]}}
""",
            env={},
        )
        platform = FakePlatform()
        gateway = gateway_for(config, platform)
        await gateway.start()
        try:
            yield Running(gateway, platform, upstream, state_path)
        finally:
            await gateway.stop(1.0)


async def loop_the_agent(running: Running) -> None:
    for _ in range(5):
        assert await running.say("status of order 12345?") == "pong"
    assert "same request" in str(await running.say("status of order 67890?"))
    assert len(running.upstream.requests) == 5


async def test_issue6_loop_circuits_and_loop_reopen_in_chat(running: Running) -> None:
    await loop_the_agent(running)
    listing = await running.say("/loop circuits", sender="alice")
    assert listing is not None
    assert CIRCUIT in listing
    assert "loop_detected" in listing
    assert await running.say("/loop reopen helper/session=room%3Alobby", sender="u-human") == (
        "Sorry, you can't run loop commands here."
    )
    assert await running.say(f"/loop reopen {CIRCUIT}", sender="alice") == (
        f"Reopened {CIRCUIT}: its calls go through again, counted afresh."
    )
    assert await running.say("/loop circuits", sender="alice") == "No LLM-call circuit is paused."
    assert await running.say("status of order 12345?") == "pong"
    assert len(running.upstream.requests) == 6


async def test_reopen_without_a_circuit_explains_itself(running: Running) -> None:
    answer = await running.say("/loop reopen", sender="alice")
    assert answer is not None
    assert answer.startswith("Usage: /loop reopen <circuit>")


async def test_issue6_the_admin_api_lists_and_reopens_circuits(running: Running) -> None:
    await loop_the_agent(running)
    base = f"http://127.0.0.1:{running.gateway.port}"
    auth = {"Authorization": f"Bearer {TOKEN}"}
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{base}/admin/circuits", headers=auth) as response:
            assert response.status == 200
            assert CIRCUIT in (await response.json())["result"]
        async with http.get(f"{base}/admin/circuits") as response:
            assert response.status == 401
        async with http.post(
            f"{base}/admin/circuits/reopen", json={"circuit": CIRCUIT}, headers=auth
        ) as response:
            assert response.status == 200
            assert (await response.json())["result"].startswith(f"Reopened {CIRCUIT}")
        async with http.post(
            f"{base}/admin/circuits/reopen", json={"circuit": ""}, headers=auth
        ) as response:
            assert response.status == 400
    assert await running.gateway.calls.paused() == []


async def test_a_pause_set_by_another_process_shows_in_chat(running: Running) -> None:
    other = SqliteCallStore(running.state_path, CallLoopPolicy(max_repeats=1))
    await other.start()
    try:
        await other.decide("billing-bot/session=run-9", "f" * 32)
        await other.decide("billing-bot/session=run-9", "f" * 32)
    finally:
        await other.aclose()
    listing = await running.say("/loop circuits", sender="alice")
    assert listing is not None
    assert "billing-bot/session=run-9" in listing
