"""RoomGuard against the gateway's pipeline (issue 21): one decision chain, held to itself.

Hypothesis draws a policy (pair and room budgets, cooldown, bot-turn cap, notices on or
off, enforce or shadow, `respond_to`) and a room's traffic: messages from three bots and a
human in two channels, mentioning the bot or replying to it or not, some redelivered,
with time passing between them. Every event goes through a `RoomGuard` for the bot
`parrot` (user id `U_parrot`) and through the gateway's whole pipeline around the hosted
bot `parrot` (tests/fakes/inmemory.PipelineRig), each on a store of its own of one
backend (memory, sqlite, redis), both driven by one fake clock. Event by event, both
must answer alike: admitted or not, the reason code, the shadow flag and the notice
(the gateway's names the admin command, the guard's stops before it).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import tempfile
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.state.base import StateStore
from gateway.state.memory import MemoryStateStore
from gateway.state.redis import RedisStateStore
from gateway.state.sqlite import SqliteStateStore
from loopwarden_integrations import Decision, RoomGuard
from tests.fakes.inmemory import ConstantAgent, FakeClock, PipelineRig, rig_config

BACKENDS = ["memory", "sqlite", pytest.param("redis", marks=pytest.mark.redis)]
# (user id, name, is a bot): the hosted bot `parrot` hears three bots and a human.
SENDERS = (("U_echo", "echo", True), ("U_robin", "robin", True), ("U_wren", "wren", True))
HUMAN = ("U_alice", "alice", False)
ADMIN_SENTENCE = " An admin can /loop reset."
_runs = itertools.count()

Outcome = tuple[bool, str, bool, str | None]
"""(admitted, reason, shadow, notice): what one message got."""

policies = st.fixed_dictionaries(
    {
        "respond_to": st.fixed_dictionaries(
            {
                "humans": st.sampled_from(["all", "mentions", "none"]),
                "bots": st.sampled_from(["all", "all", "mentions", "none"]),
            }
        ),
        "bot_loop": st.fixed_dictionaries(
            {
                "enabled": st.sampled_from([True, True, True, False]),
                "max_events_per_window": st.integers(1, 4),
                "window_seconds": st.sampled_from([10.0, 30.0, 90.0]),
                "cooldown_seconds": st.sampled_from([0.0, 20.0, 45.0]),
                "max_consecutive_bot_turns": st.integers(0, 6),
                "room_max_events_per_window": st.integers(0, 8),
                "room_window_seconds": st.sampled_from([10.0, 40.0, 120.0]),
                "announce_cooldown": st.booleans(),
                "mode": st.sampled_from(["enforce", "enforce", "shadow"]),
            }
        ),
    }
)
# A new message: (channel, sender, mentions the bot, replies to the bot, seconds before it).
new_messages = st.tuples(
    st.integers(0, 1),
    st.sampled_from((*SENDERS, *SENDERS, HUMAN)),
    st.booleans(),
    st.booleans(),
    st.sampled_from([0.0, 0.5, 3.0, 17.0, 61.0]),
)
# A redelivery of one of the last three messages (well within the dedupe window).
redeliveries = st.integers(1, 3)
traffic = st.lists(st.one_of(new_messages, redeliveries), min_size=1, max_size=40)

Message = tuple[int, tuple[str, str, bool], bool, bool, float]


def rig_store(backend: str, clock: FakeClock, workdir: Path, redis_url: str | None) -> StateStore:
    """The pipeline's store: the backend under test, fresh, on `clock`."""
    if backend == "memory":
        return MemoryStateStore(clock=clock)
    if backend == "sqlite":
        return SqliteStateStore(workdir / "gateway.sqlite3", clock=clock)
    assert redis_url is not None
    return RedisStateStore(redis_url, key_prefix=f"conformance{next(_runs)}:", clock=clock)


def guard_state(backend: str, workdir: Path, redis_url: str | None) -> str:
    """The guard's `state=` argument: the same backend, a store of its own."""
    if backend == "memory":
        return "memory"
    if backend == "sqlite":
        return f"sqlite:///{workdir / 'guard.sqlite3'}"
    assert redis_url is not None
    return redis_url


def counts(rig: PipelineRig, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Every sample of the counter `name`, by its labels."""
    return {
        tuple(sorted(sample.labels.items())): sample.value
        for metric in rig.metrics.registry.collect()
        for sample in metric.samples
        if sample.name == name
    }


def grown(
    before: dict[tuple[tuple[str, str], ...], float],
    after: dict[tuple[tuple[str, str], ...], float],
) -> list[dict[str, str]]:
    """The label sets whose count went up."""
    return [dict(labels) for labels, value in after.items() if value > before.get(labels, 0.0)]


async def through_pipeline(
    rig: PipelineRig, agent: ConstantAgent, message: Message, message_id: str, run: str
) -> Outcome:
    """What the gateway's pipeline did with one message, read off its metrics and posts."""
    channel, (sender_id, name, is_bot), mentions, reply, _ = message
    connector = rig.connector()
    refusals, verdicts = counts(rig, "refusals_total"), counts(rig, "guard_decisions_total")
    turns, sent = len(agent.turns), len(connector.sent)
    await connector.push(
        connector.message(
            "hello",
            sender_id=sender_id,
            sender_name=name,
            sender_is_bot=is_bot,
            channel_id=f"{run}-{channel}",
            message_id=message_id,
            mentions_bot=mentions,
            reply_to_bot=reply,
        )
    )
    notices = [
        text.removesuffix(ADMIN_SENTENCE)
        for text in connector.texts()[sent:]
        if text.startswith("Loop guard:")
    ]
    assert len(notices) <= 1
    notice = notices[0] if notices else None
    refused = grown(refusals, counts(rig, "refusals_total"))
    shadowed = [
        labels
        for labels in grown(verdicts, counts(rig, "guard_decisions_total"))
        if labels["shadow"] == "true" and labels["code"] != "ok"
    ]
    admitted = len(agent.turns) > turns
    if refused:
        [refusal] = refused
        return admitted, refusal["reason"], False, notice
    if shadowed:
        return admitted, shadowed[0]["code"], True, notice
    return admitted, "ok", False, notice


def through_guard(decision: Decision) -> Outcome:
    """The guard's decision as an outcome (a bot loop guard that is off admits as `ok`)."""
    reason = "ok" if decision.reason == "disabled" else decision.reason
    return decision.allowed, reason, decision.shadow, decision.notice


async def replay(
    backend: str,
    policy: dict[str, object],
    trace: list[Message | int],
    workdir: Path,
    redis_url: str | None,
) -> None:
    """Run `trace` through a RoomGuard and the pipeline; both must answer every message alike."""
    clock = FakeClock()
    agent = ConstantAgent("hi")
    config = rig_config("policy: " + json.dumps(policy))
    rig = PipelineRig(
        config,
        {"parrot": agent},
        state=rig_store(backend, clock, workdir, redis_url),
        clock=clock,
    )
    await rig.state.start()
    await rig.start()
    guard = RoomGuard(
        policy,
        guard_state(backend, workdir, redis_url),
        bot_id=rig.connector().bot_user_id,
        bot_name="parrot",
        clock=clock,
    )
    run = uuid.uuid4().hex[:12]  # rooms of their own on a shared redis-server
    sent: list[tuple[Message, str]] = []
    try:
        for n, event in enumerate(trace):
            if isinstance(event, int):
                if not sent:
                    continue
                message, message_id = sent[-min(event, len(sent))]
            else:
                message, message_id = event, f"m{n}"
                sent.append((message, message_id))
            clock.advance(message[4])
            channel, (sender_id, name, is_bot), mentions, reply, _ = message
            decision = await guard.admit(
                f"room:{run}-{channel}",
                sender_id,
                is_bot,
                mentions_bot=mentions,
                reply_to_bot=reply,
                message_id=message_id,
                sender_name=name,
            )
            gateway = await through_pipeline(rig, agent, message, message_id, run)
            assert through_guard(decision) == gateway, (n, event)
    finally:
        await guard.aclose()
        await rig.state.aclose()


@pytest.mark.parametrize("backend", BACKENDS)
@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(policy=policies, trace=traffic)
def test_issue21_room_guard_decides_as_the_pipeline_on_every_backend(
    backend: str,
    policy: dict[str, object],
    trace: list[Message | int],
    request: pytest.FixtureRequest,
) -> None:
    url = request.getfixturevalue("redis_url") if backend == "redis" else None
    with tempfile.TemporaryDirectory() as workdir:
        asyncio.run(replay(backend, policy, trace, Path(workdir), url))
