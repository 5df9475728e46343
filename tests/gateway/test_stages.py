"""The assembled gateway pipeline: the metrics every stage feeds, and the stages' order."""

from __future__ import annotations

from tests.fakes.inmemory import PipelineRig, rig_config
from tests.gateway.middlewares.stage_rig import rig_with


async def test_issue3_metrics_expose_every_family_the_issue_names() -> None:
    rig, _ = await rig_with("policy: {respond_to: {humans: mentions}}")
    connector = rig.connector()
    connector.rate_limit_next(2.0)
    await connector.push(connector.message("hello", mentions_bot=True))
    await connector.push(connector.message("not for you"))
    await connector.push(connector.message("beep", sender_id="U_B", sender_is_bot=True))
    exposition = rig.metrics.render().decode()
    for sample in (
        'messages_in_total{platform="room"} 3.0',
        'replies_out_total{platform="room"} 2.0',
        'refusals_total{reason="not_addressed",stage="admission"} 1.0',
        'guard_decisions_total{code="ok",guard="bot_loop",shadow="false"} 1.0',
        'guard_decisions_total{code="sent",guard="silence",shadow="false"} 2.0',
        'delivery_retries_total{platform="room"} 1.0',
    ):
        assert sample in exposition, sample


async def test_messages_counted_in() -> None:
    rig, _ = await rig_with()
    connector = rig.connector()
    for _ in range(3):
        await connector.push(connector.message("hello"))
    assert rig.metrics.value("messages_in_total", platform="room") == 3
    assert rig.metrics.value("replies_out_total", platform="room") == 3
    assert b'messages_in_total{platform="room"} 3.0' in rig.metrics.render()


async def test_delivery_wraps_admin_so_acks_are_chunked_too() -> None:
    rig = PipelineRig(rig_config("admins: {room: [U_ALICE]}"), max_message_length=120)
    await rig.start()
    connector = rig.connector()
    await connector.push(connector.message("/loop help"))
    assert len(connector.sent) > 1
    assert all(len(text) <= 120 for text in connector.texts())
