"""The `openai` agent sends the room's history: its own bot's as `assistant`, others' named."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from gateway.agents.factory import build_agent
from gateway.app.context import Agent
from gateway.config import parse_config
from tests.fakes.inmemory import InMemoryRoom, PipelineRig
from tests.fakes.llm_upstream import FakeLLM, FakeResponse, Received, text_response


@pytest.fixture
async def llm() -> AsyncIterator[FakeLLM]:
    async with FakeLLM() as fake:
        replies = iter(range(1, 1_000))
        fake.responder = lambda received: _numbered(received, next(replies))
        yield fake


def _numbered(received: Received, number: int) -> FakeResponse:
    """Each answer names its model and its number, so a test can tell who said what."""
    return text_response(f"{received.json()['model']} says {number}")


async def rig_for(llm: FakeLLM, history: str = "{}") -> tuple[PipelineRig, list[Agent]]:
    text = f"""
agents:
  alpha: {{kind: openai, base_url: "{llm.base_url}", model: model-a, system_prompt: Be brief.,
          history: {history}}}
  beta: {{kind: openai, base_url: "{llm.base_url}", model: model-b}}
bots:
  - {{id: alpha, platform: room, agent: alpha}}
  - {{id: beta, platform: room, agent: beta}}
policy: {{respond_to: {{bots: none}}}}
"""
    config = parse_config(text, env={})
    agents = {name: build_agent(name, agent) for name, agent in config.agents.items()}
    rig = PipelineRig(config, agents)
    await rig.start()
    return rig, list(agents.values())


def sent_by(llm: FakeLLM, model: str) -> list[list[dict[str, object]]]:
    """The messages of every request one model received, in order."""
    return [r.messages for r in llm.calls("/v1/chat/completions") if r.json()["model"] == model]


async def test_issue11_two_openai_bots_each_send_the_other_ones_replies(llm: FakeLLM) -> None:
    rig, agents = await rig_for(llm)
    try:
        room = InMemoryRoom(rig)
        await room.post("hi")
        await room.run()
        await room.post("and now?")
        await room.run()
        alpha_first, alpha_second = sent_by(llm, "model-a")
        beta_first, beta_second = sent_by(llm, "model-b")
        assert alpha_first == [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "alice: hi"},
        ]
        assert beta_first == [{"role": "user", "content": "alice: hi"}]
        assert alpha_second == [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "alice: hi"},
            {"role": "assistant", "content": "model-a says 1"},
            {"role": "user", "content": "beta: model-b says 2"},
            {"role": "user", "content": "alice: and now?"},
        ]
        assert beta_second == [
            {"role": "user", "content": "alice: hi"},
            {"role": "user", "content": "alpha: model-a says 1"},
            {"role": "assistant", "content": "model-b says 2"},
            {"role": "user", "content": "alice: and now?"},
        ]
    finally:
        for agent in agents:
            await agent.aclose()


async def test_issue11_the_openai_history_keeps_the_newest_within_max_tokens(
    llm: FakeLLM,
) -> None:
    # Estimated, `(len(name) + len(text) + 5) // 4 + 4`: "alice: m2" costs 7 and "alpha:
    # model-a says 3" 10, so the newest two fit in 17 and a third does not.
    rig, agents = await rig_for(llm, history="{max_messages: 40, max_tokens: 17}")
    try:
        alpha = rig.connector("alpha")
        for index in range(4):
            await alpha.push(alpha.message(f"m{index}", sender_name="alice"))
        *_, last = sent_by(llm, "model-a")
        assert last == [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "alice: m2"},
            {"role": "assistant", "content": "model-a says 3"},
            {"role": "user", "content": "alice: m3"},
        ]
    finally:
        for agent in agents:
            await agent.aclose()
