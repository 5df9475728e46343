"""Four `loopwarden run` replicas behind a load balancer, one Redis: one pair budget (issue 24).

The two-process test beside this one (test_state_replicas.py) gives each process its own
Discord bot. Here every replica hosts both bots, as a scaled deployment does: two Slack
apps on the Events API, whose events the fake Slack posts to a round-robin load balancer
in the test, which forwards each to the next of the four replicas. Both bots echo
everything, so one human message starts a ping-pong whose every turn may land on another
replica. On Redis (a redis-server, or the 3-master Redis Cluster of
tests/fakes/redis_cluster.py) it is cut at the pair budget of one process and the
cooldown is announced once; on memory state each replica counts alone, so the same deployment lets
more through, which shows the test measures sharing.

Every wait is a bounded poll on a condition; the fake delivers each app's events in
order, one at a time, so once both apps have answered a later human marker, every
exchange admitted before it has been answered too.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import cast

import aiohttp
import pytest
from aiohttp import web

from tests.connectors.connector_helpers import BUDGET, NOTICE, gateway_process, wait_for
from tests.fakes.loopback import LOOPBACK_HOST, serve_loopback
from tests.fakes.redis_cluster import RedisCluster
from tests.fakes.redis_server import RedisServer
from tests.fakes.slack_server import FakeUser, SlackFake

REPLICAS = 4
_prefixes = itertools.count()
SIGNING_SECRET = "replicaSigningSecret0123456789ab"
ALICE = FakeUser("U0ALICE", "alice")
ROOM = "C0PAIR"
APPS = {
    "ping": "xoxb-1010-2020-pingBotTokenReplicas",
    "pong": "xoxb-3030-4040-pongBotTokenReplicas",
}
FORWARDED = ("Content-Type", "X-Slack-Request-Timestamp", "X-Slack-Signature")

CONFIG = """
state: {state}
http: {{host: 127.0.0.1, port: 0}}
agents:
  parrot: {{kind: scripted, default: "echo: {{text}}"}}
bots:
{bots}
admins: {{slack: ["{admin}"]}}
policy:
  bot_loop: {{max_events_per_window: {budget}, window_seconds: 600, cooldown_seconds: 600}}
"""
BOT = """  - id: {name}-sl
    platform: slack
    bot_token: "{token}"
    signing_secret: "{secret}"
    agent: parrot
    api_base_url: "{base_url}"
"""


@pytest.fixture
async def fake() -> AsyncIterator[SlackFake]:
    """A Slack workspace with the two Events API apps in one channel."""
    async with SlackFake() as server:
        for n, (name, token) in enumerate(APPS.items()):
            server.add_app(
                name,
                bot_token=token,
                user_id=f"U0{name.upper()}",
                bot_id=f"B0{n}{name.upper()}",
                signing_secret=SIGNING_SECRET,
            )
        server.add_channel(ROOM, *APPS)
        yield server


@asynccontextmanager
async def balancer(ports: list[int]) -> AsyncIterator[str]:
    """A round-robin load balancer over the replicas' HTTP ports; its base URL."""
    turns = itertools.cycle(ports)
    async with aiohttp.ClientSession() as http:

        async def forward(request: web.Request) -> web.Response:
            headers = {name: request.headers[name] for name in FORWARDED if name in request.headers}
            url = f"http://{LOOPBACK_HOST}:{next(turns)}{request.path_qs}"
            async with http.post(url, data=await request.read(), headers=headers) as answer:
                return web.Response(status=answer.status, body=await answer.read())

        app = web.Application()
        app.router.add_post("/{path:.*}", forward)
        runner = web.AppRunner(app, access_log=None)
        port = await serve_loopback(runner)
        try:
            yield f"http://{LOOPBACK_HOST}:{port}"
        finally:
            await runner.cleanup()


@asynccontextmanager
async def replicas(tmp_path: Path, fake: SlackFake, state: str) -> AsyncIterator[None]:
    """Four `python -m gateway run` processes hosting both bots, behind the balancer."""
    bots = "".join(
        BOT.format(name=name, token=token, secret=SIGNING_SECRET, base_url=fake.base_url)
        for name, token in APPS.items()
    )
    path = tmp_path / "loopwarden.yaml"
    text = CONFIG.format(state=state, bots=bots, admin=ALICE.id, budget=BUDGET)
    path.write_text(text, encoding="utf-8")
    async with AsyncExitStack() as stack:
        gateways = [await stack.enter_async_context(gateway_process(path)) for _ in range(REPLICAS)]
        ports = await asyncio.gather(*(gateway.ready() for gateway in gateways))
        url = await stack.enter_async_context(balancer(list(ports)))
        for name in APPS:
            fake.apps[name].events_url = f"{url}/slack/{name}-sl/events"
        yield
        for gateway in gateways:
            await gateway.terminate()
            assert gateway.returncode == 0, gateway.output


def bot_to_bot(fake: SlackFake) -> list[str]:
    """What the bots answered to each other (echoes of echoes)."""
    return [p.text for p in fake.posted if p.text.startswith("echo: echo:")]


def notices(fake: SlackFake) -> list[str]:
    """Cooldown notices posted."""
    return [p.text for p in fake.posted if p.text.startswith(NOTICE)]


async def settle(fake: SlackFake, word: str) -> None:
    """Post a human marker and wait until both bots answered it."""
    before = len(fake.posted)
    fake.message(ROOM, ALICE, word)
    await wait_for(
        lambda: (
            sorted(p.app for p in fake.posted[before:] if p.text == f"echo: {word}") == sorted(APPS)
        )
    )
    await wait_for(lambda: not any(fake.pending(name) for name in APPS))


@pytest.fixture(params=["redis", "redis-cluster"])
def shared(request: pytest.FixtureRequest) -> str:
    """The `state:` section the replicas share: a redis-server of the test's own, or the
    3-master Redis Cluster (tests/fakes/redis_cluster.py) under a key prefix of its own."""
    if request.param == "redis":
        redis = cast(RedisServer, request.getfixturevalue("redis"))
        return f"{{backend: redis, url: '{redis.url}'}}"
    cluster = cast(RedisCluster, request.getfixturevalue("redis_cluster"))
    prefix = f"pair{next(_prefixes)}:"
    return f"{{backend: redis, url: '{cluster.url}', cluster: true, key_prefix: '{prefix}'}}"


@pytest.mark.redis
async def test_issue24_four_replicas_on_redis_cut_a_ping_pong_at_the_budget_with_one_notice(
    tmp_path: Path, fake: SlackFake, shared: str
) -> None:
    async with replicas(tmp_path, fake, shared):
        fake.message(ROOM, ALICE, "hi bots")
        await wait_for(lambda: bool(notices(fake)))
        await settle(fake, "marker")
        assert len(bot_to_bot(fake)) == BUDGET
        assert len(notices(fake)) == 1
        assert all(answer == 200 for name in APPS for answer in fake.apps[name].http_answers)


async def test_issue24_four_replicas_on_memory_each_count_the_pair_alone(
    tmp_path: Path, fake: SlackFake
) -> None:
    # Which replica cuts a chain first, and whether the other chain (each bot answers the
    # human) then meets a replica already in its cooldown (no second notice), depends on
    # timing: what is certain is that more than one process's budget got through.
    async with replicas(tmp_path, fake, "{backend: memory}"):
        fake.message(ROOM, ALICE, "hi bots")
        await wait_for(lambda: bool(notices(fake)))
        await settle(fake, "marker")
        assert len(bot_to_bot(fake)) > BUDGET
