"""The rig the stage tests share: the whole pipeline around one hosted bot, `parrot`."""

from __future__ import annotations

from gateway.app.context import Agent
from tests.fakes.inmemory import ConstantAgent, PipelineRig, rig_config


async def rig_with(
    yaml_text: str = "", agent: Agent | None = None
) -> tuple[PipelineRig, ConstantAgent]:
    """A started rig for `rig_config(yaml_text)`; `parrot` answers "hi" unless `agent` is given."""
    constant = ConstantAgent("hi")
    rig = PipelineRig(rig_config(yaml_text), {"parrot": agent or constant})
    await rig.start()
    return rig, constant
