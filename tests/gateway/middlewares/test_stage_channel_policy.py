"""The channel-policy stage: the room's effective policy, resolved once, onto the turn."""

from __future__ import annotations

from gateway.app.policies import PolicyCache
from gateway.app.types import AgentResult
from tests.fakes.inmemory import rig_config
from tests.gateway.agents.agent_turns import make_turn
from tests.gateway.middlewares.stage_rig import rig_with


async def test_result_and_policy_set_on_the_turn() -> None:
    rig, _ = await rig_with(
        "channels: [{match: {channel: 'C9'}, policy: {bot_loop: {max_events_per_window: 3}}}]"
    )
    connector = rig.connector()
    await connector.push(connector.message("hello", channel_id="C9"))
    turn = rig.turns[-1]
    assert turn.result == AgentResult("hi")
    assert turn.policy.bot_loop.max_events_per_window == 3


RULED = "channels: [{match: {channel: 'C9'}, policy: {call_loop: {max_repeats: 2}}}]"


async def test_issue10_turns_of_one_room_share_one_resolved_policy() -> None:
    rig, _ = await rig_with(RULED)
    connector = rig.connector()
    for _ in range(2):
        await connector.push(connector.message("hello", channel_id="C9"))
    first, second = rig.turns
    assert first.resolved is second.resolved
    assert first.resolved.policy is first.policy
    assert first.resolved.call_loop.max_repeats == 2
    assert first.resolved.bot_loop == first.policy.bot_loop.guard_policy()
    assert first.resolved.tool_loop == first.policy.tool_loop.guard_config()


async def test_issue10_admin_commands_read_the_pipelines_resolution() -> None:
    rig, _ = await rig_with(RULED)
    connector = rig.connector()
    await connector.push(connector.message("hello", channel_id="C9"))
    # The same object, not an equal one resolved a second way.
    assert await rig.admin.effective_policy("room:C9") is rig.turns[-1].policy
    await rig.admin.set("room:C9", "call_loop.max_repeats", "4")
    await connector.push(connector.message("again", channel_id="C9"))
    assert rig.turns[-1].resolved.call_loop.max_repeats == 4
    assert await rig.admin.effective_policy("room:C9") is rig.turns[-1].policy


def test_issue10_a_turn_given_a_policy_derives_its_guard_policies_from_it() -> None:
    config = rig_config(RULED)
    strict = PolicyCache(config).resolve("room", "C9", None, {})
    turn = make_turn("hi")
    assert turn.resolved.call_loop.max_repeats == 5
    turn.resolved = strict
    assert turn.policy is strict.policy
    turn.policy = config.policy
    assert turn.resolved.policy is config.policy
    assert turn.resolved.call_loop.max_repeats == 5
