"""The gateway's agents when their budget cannot be checked (issue 24): one clear sentence.

Real parts: the Gateway runtime with an openai agent before the fake LLM, its call store
on a real Redis master whose replica is frozen (SIGSTOP) under `state.wait_replicas: 1`
and `on_error: deny`, so every budgeted model call is refused `state_unavailable`. The
room's human is told once, in one sentence without internals; a bot is told nothing;
each refusal is in the request log as `state_unavailable` and counted.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.app import messages
from gateway.app.runtime import Gateway
from gateway.calls.entry import CallLogEntry
from gateway.calls.redis_store import RedisCallStore
from tests.fakes.inmemory import FakeClock
from tests.fakes.llm_upstream import FakeLLM
from tests.fakes.redis_cluster import SentinelPair, running_sentinel
from tests.gateway.runtime_helpers import FakePlatform
from tests.gateway.test_spend import CHAT, question, said, sent, spend_config

pytestmark = pytest.mark.redis


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[SentinelPair]:
    with running_sentinel(tmp_path / "sentinel") as started:
        yield started
        started.replica.thaw()


async def test_issue24_an_unreachable_budget_tells_the_human_once_in_one_sentence(
    pair: SentinelPair,
) -> None:
    clock = FakeClock(time.time())
    calls = RedisCallStore(
        f"redis://127.0.0.1:{pair.master.port}/0",
        on_error="deny",
        wait_replicas=1,
        wait_timeout_ms=100,
        key_prefix="agents24:",
    )
    async with FakeLLM() as llm:
        platform = FakePlatform()
        gateway = Gateway(
            spend_config(llm, "{limit_tokens: 1000}"),
            calls=calls,
            clock=clock,
            wall_clock=clock,
            connector_factory=platform,
            connect_timeout=5.0,
            start_backoff=(0.01, 0.05),
        )
        await gateway.start()
        try:
            alpha = platform.made["alpha"]
            await alpha.push(said(question(1)))
            assert len(llm.calls(CHAT)) == 1  # the replica acknowledges: answered
            pair.replica.freeze()
            await alpha.push(said(question(2)))
            await alpha.push(said(question(3)))
            await alpha.push(said(question(4), sender="u-bot-other"))
            assert len(llm.calls(CHAT)) == 1  # none of them reached the model
            notice = messages.SPEND_UNAVAILABLE
            assert sent(alpha)[1:] == [notice]  # once, to the human
            assert notice.count(".") == 1
            assert "state" not in notice
            assert "redis" not in notice.lower()
            refused = gateway.metrics.value(
                "refusals_total", stage="spend", reason="state_unavailable"
            )
            assert refused == 3
        finally:
            pair.replica.thaw()
            await gateway.stop(1.0)
        outcomes = sorted(entry.outcome for entry in await _logged(pair, "agents24:"))
        assert outcomes == ["forwarded"] + ["state_unavailable"] * 3


async def _logged(pair: SentinelPair, prefix: str) -> list[CallLogEntry]:
    """The request log the gateway wrote (its store is closed with it)."""
    store = RedisCallStore(f"redis://127.0.0.1:{pair.master.port}/0", key_prefix=prefix)
    await store.start()
    try:
        return await store.calls_since(3600.0)
    finally:
        await store.aclose()
