"""The spend anomaly detector in the proxy: the alert, the pause, round trips (issue 14).

A real proxy in front of the fake provider, on an injected wall clock: the fake answers
11 input and 7 output tokens and `gpt-4o*` costs $1 / $2 per 1,000 tokens, so one call
costs $0.025. Spend history over 7 days is charged into the store directly.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import aiohttp
import pytest
from redis.asyncio.connection import AbstractConnection

from gateway.app.errors import ConfigError
from gateway.calls.anomaly import AnomalyCharge, AnomalyEvent, anomaly_key
from gateway.calls.budgets import Amount, SpendHold, nano
from gateway.calls.store import CallStore, MemoryCallStore
from gateway.config import Config
from gateway.proxy.alerts import Alerter
from gateway.proxy.app import ProxyServer
from tests.fakes.llm_upstream import FakeLLM, Received
from tests.gateway.proxy.proxy_helpers import (
    ADMIN_TOKEN,
    MODEL,
    OTHER_KEY,
    PROXY_KEY,
    RecordingChannel,
    proxy_config,
)

HOUR = 3_600.0
START = 1_800_000_000.0  # on an hour
CALL_USD = 0.025
ALERTING = "anomaly: {window: 1h, factor: 3, min_usd: 0.05}"
PAUSING = "anomaly: {window: 60m, factor: 3, min_usd: 0.04, action: pause}"
BUDGETS = """
budgets:
  - {name: agent-daily, per: [agent], limit_usd: 1000, period: day}
  - {name: all-monthly, per: [], limit_usd: 5000, period: month}
  - {name: customer-tokens, per: [customer], limit_tokens: 100000000, period: day}
anomaly: {window: 1h, factor: 3, min_usd: 1000}
"""


class Clock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> float:
        return self.now


@dataclass
class AnomalyRig:
    proxy: ProxyServer
    upstream: FakeLLM
    alerts: RecordingChannel
    clock: Clock

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.proxy.port}"

    async def chat(
        self, text: str, *, session: str | None = None, key: str = PROXY_KEY
    ) -> tuple[int, str]:
        headers = {"Authorization": f"Bearer {key}"}
        if session is not None:
            headers["X-Loopwarden-Session"] = session
        data = {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 7}
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"{self.url}/openai/v1/chat/completions", json=data, headers=headers) as r,
        ):
            body = await r.read()
        await self.proxy.settle()
        return r.status, body.decode()

    async def admin(self, method: str, path: str, data: object = None) -> tuple[int, object]:
        auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        async with (
            aiohttp.ClientSession() as http,
            http.request(method, f"{self.url}{path}", json=data, headers=auth) as answer,
        ):
            return answer.status, await answer.json()


@asynccontextmanager
async def anomaly_proxy(
    extra: str, *, state: str = "{backend: memory}", store: CallStore | None = None
) -> AsyncIterator[AnomalyRig]:
    clock = Clock()
    async with FakeLLM() as fake:
        config: Config = proxy_config(fake.url, extra, state=state)
        channel = RecordingChannel()
        if store is None and state == "{backend: memory}":
            store = MemoryCallStore(wall_clock=clock)
        proxy = ProxyServer(config, store=store, alerter=Alerter([channel]), wall_clock=clock)
        await proxy.start()
        try:
            yield AnomalyRig(proxy, fake, channel, clock)
        finally:
            await proxy.stop()


async def seed_history(rig: AnomalyRig, hours: int, usd: float) -> None:
    """`usd` charged to billing-bot in each of the `hours` before START."""
    policy = rig.proxy.config.anomaly.policy()
    assert policy is not None
    for hour in range(hours, 0, -1):
        rig.clock.now = START - hour * HOUR
        event = AnomalyEvent("billing-bot", anomaly_key("billing-bot"), "old", nano(usd))
        charged = AnomalyCharge(event, policy)
        await rig.proxy.store.settle(SpendHold((), Amount()), Amount(event.used, 1), charged)
    rig.clock.now = START + 60


async def test_issue14_proxy_anomaly_alerts_once_per_window_with_figures_and_top_sessions() -> None:
    async with anomaly_proxy(ALERTING) as rig:
        await seed_history(rig, 7 * 24, CALL_USD)
        # The median is $0.025 an hour: the fourth call this hour passes 3 x that, and $0.05.
        for n, session in enumerate(("run-a", "run-b", "run-a", "run-a", "run-c")):
            assert (await rig.chat(f"q{n}", session=session))[0] == 200
            assert len(rig.alerts.alerts) == (1 if n >= 3 else 0), n
        (alert,) = rig.alerts.alerts
        assert alert.code == "spend_anomaly"
        assert alert.subject == "loopwarden: spend anomaly for agent billing-bot"
        text = alert.text
        assert "spent $0.1000 in 2027-01-15 08:00 UTC to 2027-01-15 09:00 UTC" in text
        assert "3 x its median of $0.0250" in text
        assert "min_usd $0.0500" in text
        assert "Top sessions: run-a $0.0750, run-b $0.0250." in text
        assert "paused" not in text
        # The next window is judged afresh, and alerts again.
        rig.clock.now = START + HOUR + 1
        for n in range(4):
            await rig.chat(f"next {n}", session="run-d")
        assert len(rig.alerts.alerts) == 2


async def test_issue14_proxy_anomaly_is_silent_under_min_usd_and_for_a_steady_agent() -> None:
    async with anomaly_proxy(ALERTING) as rig:
        await seed_history(rig, 7 * 24, 0.5)
        for n in range(5):
            assert (await rig.chat(f"q{n}"))[0] == 200
        assert rig.alerts.alerts == []
    async with anomaly_proxy(ALERTING) as rig:
        # A new agent: $0.05 is min_usd exactly, not above it.
        for n in range(2):
            await rig.chat(f"q{n}")
        assert rig.alerts.alerts == []
        await rig.chat("third")
        (alert,) = rig.alerts.alerts
        assert "less than a day of history" in alert.text


async def test_issue14_pause_action_pauses_the_agent_until_reopened_by_the_admin_api() -> None:
    async with anomaly_proxy(PAUSING) as rig:
        for n in range(2):
            assert (await rig.chat(f"q{n}", session="run-1"))[0] == 200
        (alert,) = rig.alerts.alerts
        assert 'POST /admin/circuits/reopen {"circuit": "anomaly=billing-bot"}' in alert.text
        # Every session of the agent is refused now; another agent is not.
        status, body = await rig.chat("other session", session="run-2")
        assert status == 429
        error = json.loads(body)["error"]
        assert error["code"] == "loop_paused"
        assert "spend anomaly" in error["message"]
        assert "anomaly=billing-bot" in error["message"]
        assert (await rig.chat("no session"))[0] == 429
        assert (await rig.chat("support", key=OTHER_KEY))[0] == 200
        assert len(rig.upstream.requests) == 3
        status, listed = await rig.admin("GET", "/admin/circuits")
        assert status == 200
        assert "anomaly=billing-bot" in json.dumps(listed)
        status, _ = await rig.admin(
            "POST", "/admin/circuits/reopen", {"circuit": "anomaly=billing-bot"}
        )
        assert status == 200
        assert (await rig.chat("after reopen", session="run-2"))[0] == 200
        # Reopened within the window that alerted: no second alert, no second pause.
        assert (await rig.chat("still fine", session="run-3"))[0] == 200
        assert len(rig.alerts.alerts) == 1


def _command(packet: bytes | str | Iterable[bytes]) -> str:
    """The name of the (first) command in a packet redis-py sends: one round trip."""
    if isinstance(packet, str):
        packet = packet.encode()
    first = packet if isinstance(packet, bytes) else bytes(next(iter(packet)))
    return first.split(b"\r\n")[2].decode().upper()


@pytest.mark.redis
async def test_issue14_one_redis_round_trip_checks_a_call_and_one_charges_it(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[str] = []
    original = AbstractConnection.send_packed_command

    async def counted(
        self: AbstractConnection,
        command: bytes | str | Iterable[bytes],
        check_health: bool = True,
    ) -> None:
        sent.append(_command(command))
        await original(self, command, check_health)

    monkeypatch.setattr(AbstractConnection, "send_packed_command", counted)
    state = f"{{backend: redis, url: '{redis_url}', key_prefix: 'trips:'}}"
    async with anomaly_proxy(BUDGETS, state=state) as rig:
        forwarded_after: list[int] = []
        record = rig.upstream._record

        async def recording(request: aiohttp.web.Request) -> Received:
            forwarded_after.append(len(sent))
            return await record(request)

        monkeypatch.setattr(rig.upstream, "_record", recording)
        assert (await rig.chat("warm-up", session="s0"))[0] == 200
        for n in range(3):
            sent.clear()
            forwarded_after.clear()
            assert (await rig.chat(f"q{n}", session=f"s{n}"))[0] == 200
            await rig.proxy.settle()
            # Three budgets, the repeat guard and the agent's pause: one script call
            # before forwarding; the charge (budgets and anomaly) one more after it,
            # and the request log's batch one of its own.
            assert forwarded_after == [1]
            assert sent == ["EVALSHA", "EVALSHA", "EVALSHA"]


@pytest.mark.parametrize(
    ("anomaly", "path"),
    [
        ("{window: .inf}", "proxy.anomaly.window"),
        ("{window: 1e308}", "proxy.anomaly.window"),
        ("{window: 0}", "proxy.anomaly.window"),
        ("{window: -1h}", "proxy.anomaly.window"),
        ("{window: 5s}", "proxy.anomaly.window"),
        ("{window: 2d}", "proxy.anomaly.window"),
        ("{factor: .inf}", "proxy.anomaly.factor"),
        ("{factor: 0}", "proxy.anomaly.factor"),
        ("{factor: 1e308}", "proxy.anomaly.factor"),
        ("{min_usd: -1}", "proxy.anomaly.min_usd"),
        ("{min_usd: 1e308}", "proxy.anomaly.min_usd"),
        ("{action: stop}", "proxy.anomaly.action"),
        ("{windows: 1h}", "proxy.anomaly.windows"),
    ],
)
def test_issue14_check_config_names_the_anomaly_field(anomaly: str, path: str) -> None:
    with pytest.raises(ConfigError) as caught:
        proxy_config("http://127.0.0.1:1", f"anomaly: {anomaly}")
    assert caught.value.path == path


def test_issue14_a_5000_digit_anomaly_figure_is_refused() -> None:
    with pytest.raises(ConfigError, match="too many digits"):
        proxy_config("http://127.0.0.1:1", "anomaly: {min_usd: " + "9" * 5000 + "}")


def test_issue14_anomaly_config_reads_durations_and_is_off_unless_given() -> None:
    config = proxy_config("http://127.0.0.1:1", PAUSING).proxy
    assert config is not None
    policy = config.anomaly.policy()
    assert policy is not None
    assert (policy.window, policy.factor, policy.min_nano, policy.action) == (
        3_600.0,
        3.0,
        nano(0.04),
        "pause",
    )
    plain = proxy_config("http://127.0.0.1:1").proxy
    assert plain is not None
    assert plain.anomaly.policy() is None
    off = proxy_config("http://127.0.0.1:1", "anomaly: {enabled: false}").proxy
    assert off is not None
    assert off.anomaly.policy() is None
