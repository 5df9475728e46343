"""A RoomGuard that keeps every decision it made, so a test knows when its bots are done."""

from __future__ import annotations

from typing import Any

from loopwarden_integrations import Decision, RoomGuard


class RecordingGuard(RoomGuard):
    """Records the decisions of both faces (`admit` and `admit_sync`), in order."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.decisions: list[Decision] = []

    async def admit(self, room: str, sender_id: str, sender_is_bot: bool, **kw: Any) -> Decision:
        decision = await super().admit(room, sender_id, sender_is_bot, **kw)
        self.decisions.append(decision)
        return decision

    def admit_sync(self, room: str, sender_id: str, sender_is_bot: bool, **kw: Any) -> Decision:
        decision = super().admit_sync(room, sender_id, sender_is_bot, **kw)
        self.decisions.append(decision)
        return decision
