"""Money survives a Redis failure (issue 24): WAIT for replicas, charges kept and sent again.

Real parts: redis-server processes (a master with a replica under a Sentinel, the 3-master
cluster, a plain server behind a relay that loses answers: tests/fakes/lossy_relay.py)
and the real RedisCallStore. A replica is frozen with SIGSTOP so that WAIT times out;
a master is killed with SIGKILL (no persistence) so only what its replica holds survives.
Waits are bounded by counts of polls, never by how fast the machine is.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from redis.asyncio import Redis

from gateway.app.errors import ConfigError, StateError
from gateway.calls.budgets import Amount, GroupSpend, SpendGroup, nano
from gateway.calls.entry import CallLogEntry
from gateway.calls.query import CallFilter
from gateway.calls.redis_store import RedisCallStore
from gateway.config import parse_config
from gateway.state.redis_link import OnError, RedisTopology
from guards.call_loop import circuit_key
from tests.fakes.lossy_relay import LossyRelay
from tests.fakes.redis_cluster import SERVICE_NAME, Node, RedisCluster, SentinelPair
from tests.fakes.redis_cluster import running_sentinel as sentinel_pair
from tests.fakes.redis_server import RedisServer
from tests.gateway.calls.store_helpers import fingerprint
from tests.gateway.calls.test_budgets import event, group
from tests.gateway.proxy.proxy_helpers import running_proxy
from tests.gateway.proxy.test_proxy_charge_outage import chat
from tests.gateway.proxy.test_proxy_charge_outage import written as outage_written

pytestmark = pytest.mark.redis

POLLS = 400
POLL_SECONDS = 0.05
"""A bounded wait: 400 polls of 50 ms (20 s) for what takes well under a second."""
FAILOVER_POLLS = 600
"""Polls of 50 ms (30 s) for the Sentinel to promote the replica (about 2 s here)."""
USED = Amount(123_456_789, 42)
"""What the call under test really used: $0.123456789 and 42 tokens."""
DOLLARS = """
budgets:
  - {name: agent-dollars, per: [agent], limit_usd: 5, period: day}
"""


def daily() -> SpendGroup:
    """A $1 group of a period that ends in an hour, by this machine's clock."""
    return group(usd=1.0, ends_at=time.time() + 3600.0)


async def spent(store: RedisCallStore, key: str) -> GroupSpend | None:
    """The group's record in Redis (None: none)."""
    return dict(await store.spend_groups()).get(key)


async def recorded(store: RedisCallStore, key: str) -> GroupSpend:
    """The group's record in Redis, which must be there."""
    record = await spent(store, key)
    assert record is not None, key
    return record


async def written(store: RedisCallStore) -> None:
    """Poll Redis through the store until it answers and nothing waits to be written."""
    for _ in range(POLLS):
        try:
            await store.spend_groups()
        except StateError:
            pass
        else:
            if not store.pending_writes:
                return
        await asyncio.sleep(POLL_SECONDS)
    raise AssertionError(f"{store.pending_writes} writes still wait for Redis")


async def recovered(store: RedisCallStore, done: Callable[[], Awaitable[bool]]) -> None:
    """Poll Redis through the store (so it finds Redis back and writes what it kept)
    until `done`."""
    for _ in range(POLLS):
        with contextlib.suppress(StateError):
            await store.spend_groups()
        if await done():
            return
        await asyncio.sleep(POLL_SECONDS)
    raise AssertionError("the store never wrote what it kept")


@asynccontextmanager
async def started(store: RedisCallStore) -> AsyncIterator[RedisCallStore]:
    await store.start()
    try:
        yield store
    finally:
        await store.aclose()


@asynccontextmanager
async def relayed(
    redis: RedisServer, key_prefix: str, on_error: OnError = "allow"
) -> AsyncIterator[tuple[LossyRelay, RedisCallStore]]:
    """A store that reaches Redis through a relay that can lose its answers."""
    async with (
        LossyRelay(redis.port) as relay,
        started(
            RedisCallStore(relay.url, key_prefix=key_prefix, on_error=on_error, probe_interval=0.05)
        ) as store,
    ):
        yield relay, store


def sentinel_store(
    pair: SentinelPair, on_error: OnError = "deny", *, wait_replicas: int = 1
) -> RedisCallStore:
    """A call store on the Sentinel-watched master, asking WAIT for `wait_replicas`."""
    topology = RedisTopology(
        sentinels=(("127.0.0.1", pair.sentinel.port),), service_name=SERVICE_NAME
    )
    return RedisCallStore(
        "redis://127.0.0.1/0",
        topology=topology,
        on_error=on_error,
        wait_replicas=wait_replicas,
        wait_timeout_ms=200,
        probe_interval=0.05,
    )


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[SentinelPair]:
    """A master, its replica and a Sentinel of this test's own (the test may kill them)."""
    with sentinel_pair(tmp_path / "sentinel") as started_pair:
        yield started_pair
        started_pair.replica.thaw()


# Config


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ("{backend: redis, wait_replicas: -1}", "state.wait_replicas"),
        ("{backend: redis, wait_replicas: 101}", "state.wait_replicas"),
        ("{backend: redis, wait_replicas: 1e308}", "state.wait_replicas"),
        ("{backend: redis, wait_replicas: " + "9" * 40 + "}", "state.wait_replicas"),
        ("{backend: redis, wait_replicas: true}", "state.wait_replicas"),
        ("{backend: redis, wait_replicas: 1.5}", "state.wait_replicas"),
        ("{backend: redis, wait_replicas: '１'}", "state.wait_replicas"),
        ("{backend: redis, wait_replicas: '1\\x00'}", "state.wait_replicas"),
        ("{backend: redis, wait_replicas: auto}", "state.wait_replicas"),
        ("{backend: redis, wait_replicas: .inf}", "state.wait_replicas"),
        ("{backend: redis, wait_replicas: '" + "9" * 5000 + "'}", "state.wait_replicas"),
        ("{backend: redis, wait_replicas: " + "[" * 50 + "]" * 50 + "}", "state.wait_replicas"),
        ("{backend: redis, wait_timeout_ms: '" + "1" * 5000 + "'}", "state.wait_timeout_ms"),
        ("{backend: redis, wait_timeout_ms: '１００'}", "state.wait_timeout_ms"),
        ("{backend: sqlite, wait_replicas: 1}", "state.wait_replicas"),
        ("{backend: redis, wait_timeout_ms: 0}", "state.wait_timeout_ms"),
        ("{backend: redis, wait_timeout_ms: 1001}", "state.wait_timeout_ms"),
        ("{backend: redis, wait_timeout_ms: .inf}", "state.wait_timeout_ms"),
        ("{backend: redis, wait_timeout_ms: .nan}", "state.wait_timeout_ms"),
        ("{backend: redis, wait_timeout_ms: false}", "state.wait_timeout_ms"),
    ],
)
def test_issue24_hostile_wait_values_are_refused_naming_the_field(body: str, field: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(f"state: {body}\n", env={})
    assert caught.value.path == field, caught.value


def test_issue24_wait_replicas_takes_a_count_and_a_timeout() -> None:
    state = parse_config(
        "state: {backend: redis, wait_replicas: ${N}, wait_timeout_ms: 250}\n", env={"N": "2"}
    ).state
    assert (state.wait_replicas, state.wait_timeout_ms) == (2, 250)
    assert parse_config("state: {backend: redis}\n", env={}).state.wait_replicas == 0


# An answer lost: the charge is sent again and counted once


async def test_issue24_a_charge_whose_answer_was_lost_is_sent_again_and_counted_once(
    redis: RedisServer,
) -> None:
    budget = daily()
    async with relayed(redis, "lost24:") as (relay, store):
        admitted = await store.admit(circuit_key("bot", "s"), fingerprint(1), {}, event(budget))
        hold = admitted.spend.hold
        assert hold is not None

        # The charge runs in Redis; its answer (and that of redis-py's one retry) is lost.
        relay.lose_answers_to(b"charged:")
        await store.charge(hold, USED)
        assert relay.lost >= 1
        assert store.pending_writes == 1

        relay.deliver()
        await written(store)
        record = await recorded(store, budget.key)
        assert record.spent == USED  # once, though Redis ran it two or three times
        assert record.held == Amount()


async def test_issue24_the_set_of_applied_charges_stays_as_small_as_the_charges_in_flight(
    redis: RedisServer,
) -> None:
    budget = daily()
    async with started(RedisCallStore(redis.url, key_prefix="small24:")) as store:
        holds = []
        for n in range(20):
            spend = event(budget, usd=0.01)
            admitted = await store.admit(circuit_key("bot", "s"), fingerprint(n), {}, spend)
            assert admitted.spend.hold is not None
            holds.append(admitted.spend.hold)
        await asyncio.gather(*(store.charge(hold, Amount(1, 1)) for hold in holds))
        await store.charge(holds[0], None)  # one more, after every answer came
        charged = f"small24:{{calls}}:charged:{store.owner}"
        client = Redis.from_url(redis.url)
        try:
            assert await client.zcard(charged) == 1
            assert 0 < await client.pttl(charged) <= 86_400_000
        finally:
            await client.aclose()
        record = await recorded(store, budget.key)
        assert record.spent == Amount(20, 20)


async def test_issue24_a_log_batch_whose_answer_was_lost_is_logged_once(
    redis: RedisServer,
) -> None:
    entry = CallLogEntry(
        at=time.time(),
        provider="openai",
        agent="billing-bot",
        session="s",
        circuit="billing-bot/s",
        model="gpt-4o-mini",
        outcome="forwarded",
        status=200,
        input_tokens=10,
        output_tokens=5,
        cost=0.25,
    )
    async with relayed(redis, "lostlog24:") as (relay, store):
        relay.lose_answers_to(b"{calls}:log")
        await store.log_call(entry)
        assert relay.lost >= 1
        assert store.pending_writes == 1
        relay.deliver()
        await written(store)
        assert await store.calls_since(3600.0) == [entry]
        totals = await store.call_totals(CallFilter())
        assert (totals.calls, totals.cost) == (1, 0.25)


# A reservation whose answer was lost: held once


async def test_issue24_a_reservation_whose_answer_was_lost_is_held_once(
    redis: RedisServer,
) -> None:
    budget = daily()
    spend = event(budget)
    async with relayed(redis, "reserve24:") as (relay, store):
        # The decide script runs and holds the estimate; its answer is lost, and redis-py
        # sends it again at once on a fresh connection, whose answer comes.
        relay.lose_answers_to(b"{calls}:seq", times=1)
        admitted = await store.admit(circuit_key("bot", "s"), fingerprint(1), {}, spend)
        assert relay.lost == 1
        assert admitted.call is not None
        assert (admitted.call.allowed, admitted.call.count) == (True, 1)  # counted once
        hold = admitted.spend.hold
        assert hold is not None
        record = await recorded(store, budget.key)
        assert record.held == spend.estimate  # one hold, though the script ran twice

        await store.charge(hold, USED)
        record = await recorded(store, budget.key)
        assert (record.spent, record.held) == (USED, Amount())
        # The next identical call is the circuit's second, not its third.
        again = await store.admit(circuit_key("bot", "s"), fingerprint(1), {}, spend)
        assert again.call is not None
        assert again.call.count == 2


async def test_issue24_a_reservation_never_answered_gives_its_hold_back_once_redis_answers(
    redis: RedisServer,
) -> None:
    budget = daily()
    spend = event(budget)
    async with (
        relayed(redis, "never24:", "deny") as (relay, store),
        started(RedisCallStore(redis.url, key_prefix="never24:")) as direct,
    ):
        # Both tries run in Redis and neither answer comes: the call is refused as in an
        # outage, and its hold (taken once) is released when Redis answers again.
        relay.lose_answers_to(b"{calls}:seq")
        refused = await store.admit(circuit_key("bot", "s"), fingerprint(1), {}, spend)
        assert relay.lost == 2
        assert refused.spend.unavailable
        assert store.pending_writes == 0  # a release moves no money but back: not counted
        record = await recorded(direct, budget.key)
        assert record.held == spend.estimate

        relay.deliver()

        async def given_back() -> bool:
            record = await recorded(direct, budget.key)
            return record.held == Amount()

        await recovered(store, given_back)
        record = await recorded(direct, budget.key)
        assert record.spent == Amount()


async def test_issue24_the_release_of_a_reservation_that_never_ran_gives_back_no_other_hold(
    redis: RedisServer,
) -> None:
    budget = daily()
    spend = event(budget)
    async with relayed(redis, "notrun24:", "deny") as (relay, store):
        first = await store.admit(circuit_key("bot", "s"), fingerprint(1), {}, spend)
        assert first.spend.hold is not None
        relay.lose_answers_to(b"{calls}:seq", run=False)  # the decision never reaches Redis
        refused = await store.admit(circuit_key("bot", "s"), fingerprint(2), {}, spend)
        assert relay.lost == 2
        assert refused.spend.unavailable
        relay.deliver()
        client = Redis.from_url(redis.url)
        try:
            charged = f"notrun24:{{calls}}:charged:{store.owner}"

            async def released() -> bool:  # the release is the first charge script call
                return bool(await client.zcard(charged))

            await recovered(store, released)
        finally:
            await client.aclose()
        record = await recorded(store, budget.key)
        assert record.held == spend.estimate  # the first call's hold stands
        await store.charge(first.spend.hold, USED)
        record = await recorded(store, budget.key)
        assert (record.spent, record.held) == (USED, Amount())


async def test_issue24_a_refusal_whose_answer_was_lost_keeps_its_alert(
    redis: RedisServer,
) -> None:
    budget = daily()
    async with relayed(redis, "refuse24:") as (relay, store):
        relay.lose_answers_to(b"{calls}:seq", times=1)
        refused = await store.admit(
            circuit_key("bot", "s"), fingerprint(1), {}, event(budget, usd=2.0)
        )
        assert relay.lost == 1
        assert not refused.spend.allowed
        assert refused.spend.alert is not None  # the first run's answer, not the second's
        assert refused.spend.alert.threshold == 100


async def test_issue24_the_reservations_kept_stay_as_few_as_the_reservations_in_flight(
    redis: RedisServer,
) -> None:
    budget = daily()
    async with started(RedisCallStore(redis.url, key_prefix="fewres24:")) as store:
        admitted = await asyncio.gather(
            *(
                store.admit(circuit_key("bot", "s"), fingerprint(n), {}, event(budget, usd=0.01))
                for n in range(20)
            )
        )
        holds = [one.spend.hold for one in admitted if one.spend.hold is not None]
        assert len(holds) == 20
        await store.admit(circuit_key("bot", "s"), fingerprint(99), {}, event(budget, usd=0.01))
        reserved = f"fewres24:{{calls}}:reserved:{store.owner}"
        client = Redis.from_url(redis.url)
        try:
            assert await client.zcard(reserved) == 1
            assert 0 < await client.pttl(reserved) <= 86_400_000
        finally:
            await client.aclose()


async def test_issue24_a_proxied_call_whose_reservation_answer_was_lost_is_charged_once(
    redis: RedisServer,
) -> None:
    async with LossyRelay(redis.port) as relay:
        state = f"{{backend: redis, url: '{relay.url}', on_error: deny}}"
        async with running_proxy(DOLLARS, state=state) as rig:
            relay.lose_answers_to(b"{calls}:seq", times=1)
            status, _ = await chat(rig)
            assert status == 200
            assert relay.lost == 1
            (entry,) = await rig.logged()
            groups = await outage_written(rig)
            ((_, record),) = await rig.store.spend_groups()
    assert entry.outcome == "forwarded"
    assert record.held == Amount()
    assert record.spent.nano_usd == nano(entry.cost or 0.0)
    assert [(g["budget"], g["spent"], g["held"]) for g in groups] == [
        ("agent-dollars", f"${entry.cost:.4f}", "$0.0000")
    ]


# WAIT: a charge acknowledged is on a replica


async def test_issue24_an_acknowledged_charge_survives_the_master_s_death(
    pair: SentinelPair,
) -> None:
    budget = daily()
    async with started(sentinel_store(pair)) as store:
        admitted = await store.admit(circuit_key("bot", "s"), fingerprint(1), {}, event(budget))
        assert admitted.spend.allowed
        assert admitted.spend.hold is not None
        await store.charge(admitted.spend.hold, USED)
        assert store.replica_waits_short == 0

        old = pair.current_master()
        pair.master.kill()  # no persistence: what the master alone held is gone
        for _ in range(FAILOVER_POLLS):
            if pair.current_master() != old:
                break
            await asyncio.sleep(POLL_SECONDS)
        assert pair.current_master() == pair.replica.port

        record = None
        for _ in range(POLLS):
            try:
                record = await spent(store, budget.key)
                break
            except StateError:  # until the store asks the Sentinel for the new master
                await asyncio.sleep(POLL_SECONDS)
        assert record is not None
        assert record.spent == USED


async def test_issue24_too_few_replicas_under_deny_refuse_the_call_and_give_its_hold_back(
    pair: SentinelPair,
) -> None:
    budget = daily()
    async with started(sentinel_store(pair, "deny")) as store:
        pair.replica.freeze()  # it stops acknowledging: WAIT answers 0 after 200 ms
        circuit = circuit_key("bot", "s")
        refused = await store.admit(circuit, fingerprint(1), {}, event(budget, usd=0.5))
        assert not refused.spend.allowed
        assert refused.spend.unavailable
        assert refused.spend.retry_after >= 3.0
        assert store.replica_waits_short >= 1
        record = await spent(store, budget.key)
        assert record is None or record.held == Amount()  # the hold was given back

        pair.replica.thaw()
        # The refused call held nothing: the $1 budget admits two calls of $0.50 again.
        for n in (2, 3):
            again = await store.admit(circuit, fingerprint(n), {}, event(budget, usd=0.5))
            assert again.spend.hold is not None, n
            await store.charge(again.spend.hold, Amount(nano_usd=500_000_000))
        last = await store.admit(circuit, fingerprint(4), {}, event(budget, usd=0.5))
        assert not last.spend.allowed
        assert not last.spend.unavailable  # the budget refuses, not the replicas


async def test_issue24_too_few_replicas_under_allow_admit_and_count(pair: SentinelPair) -> None:
    budget = daily()
    async with started(sentinel_store(pair, "allow")) as store:
        pair.replica.freeze()
        admitted = await store.admit(circuit_key("bot", "s"), fingerprint(1), {}, event(budget))
        assert admitted.spend.allowed
        assert admitted.spend.hold is not None
        await store.charge(admitted.spend.hold, USED)
        assert store.replica_waits_short == 2  # the hold and the charge
        pair.replica.thaw()
        record = await recorded(store, budget.key)
        assert record.spent == USED


# On a cluster the WAIT goes to the master of the budgets' slot


def _replica_of(cluster: RedisCluster, master: Node) -> Node:
    for line in master.command("INFO", "replication").splitlines():
        if line.startswith("slave0:"):
            port = int(line.split("port=")[1].split(",")[0])
            return next(node for node in cluster.nodes if node.port == port)
    raise AssertionError(f"master {master.address} has no replica")


async def test_issue24_on_a_cluster_wait_asks_the_budgets_master(
    redis_cluster: RedisCluster,
) -> None:
    budget = daily()
    store = RedisCallStore(
        redis_cluster.url,
        key_prefix="wait24:",
        topology=RedisTopology(cluster=True),
        wait_replicas=1,
        wait_timeout_ms=200,
    )
    async with started(store):
        circuit = circuit_key("bot", "s")
        admitted = await store.admit(circuit, fingerprint(1), {}, event(budget))
        assert admitted.spend.hold is not None
        assert store.replica_waits_short == 0
        # Freeze the replica of the master that holds `{calls}`: only a WAIT sent to that
        # master can come back short (another master's replica still acknowledges).
        replica = _replica_of(redis_cluster, redis_cluster.master_of("wait24:{calls}:x"))
        replica.freeze()
        try:
            await store.charge(admitted.spend.hold, USED)
        finally:
            replica.thaw()
        assert store.replica_waits_short == 1
        redis_cluster.wait_ok()
        record = await recorded(store, budget.key)
        assert record.spent == USED
