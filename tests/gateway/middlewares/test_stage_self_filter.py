"""The self filter: a bot never handles its own messages, and unknown bot-ness is a bot."""

from __future__ import annotations

from tests.fakes.inmemory import ConstantAgent, InMemoryConnector, PipelineRig, rig_config
from tests.gateway.middlewares.stage_rig import rig_with


async def test_self_filter_by_author_id_not_name() -> None:
    rig, agent = await rig_with()
    connector = rig.connector()
    await connector.push(connector.message("me", sender_id=connector.bot_user_id, sender_name="x"))
    await connector.push(connector.message("not me", sender_id="U_OTHER", sender_name="parrot"))
    assert [m.text for m in agent.turns] == ["not me"]
    assert rig.metrics.value("refusals_total", stage="self_filter", reason="self") == 1


async def test_issue3_unknown_botness_is_treated_as_bot() -> None:
    # On a platform that cannot tell bots from people, a sender reported as a person is
    # still treated as a bot (fail closed): the bot rules of admission apply to it.
    agent = ConstantAgent("hi")
    rig = PipelineRig(rig_config("policy: {respond_to: {bots: none}}"), {"parrot": agent})
    rig.connectors["parrot"] = connector = InMemoryConnector("parrot", knows_bots=False)
    await rig.start()
    await connector.push(connector.message("who am I", sender_id="U_UNKNOWN", is_direct=True))
    assert agent.turns == []
    assert rig.metrics.value("refusals_total", stage="admission", reason="bots_off") == 1
    # The connector's own word "bot" is kept on a platform that does tell.
    known, _ = await rig_with("policy: {respond_to: {bots: none}}")
    told = known.connector()
    await told.push(told.message("beep", sender_id="U_BOT", sender_is_bot=True))
    assert known.metrics.value("refusals_total", stage="admission", reason="bots_off") == 1
