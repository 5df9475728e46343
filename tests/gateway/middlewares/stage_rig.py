"""The rig the stage tests share: the whole pipeline around one hosted bot, `parrot`."""

from __future__ import annotations

from gateway.app.context import Agent
from tests.fakes.inmemory import ConstantAgent, InMemoryRoom, PipelineRig, rig_config


async def rig_with(
    yaml_text: str = "", agent: Agent | None = None
) -> tuple[PipelineRig, ConstantAgent]:
    """A started rig for `rig_config(yaml_text)`; `parrot` answers "hi" unless `agent` is given."""
    constant = ConstantAgent("hi")
    rig = PipelineRig(rig_config(yaml_text), {"parrot": agent or constant})
    await rig.start()
    return rig, constant


def notices(room: InMemoryRoom) -> list[str]:
    """The loop guard's notices posted in `room`, in order."""
    return [post.text for post in room.bot_posts() if post.text.startswith("Loop guard:")]


def pongs(room: InMemoryRoom) -> int:
    """How many `pong` answers the bots posted in `room`."""
    return sum(1 for post in room.bot_posts() if post.text == "pong")
