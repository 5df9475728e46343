"""The guards inside bots and agents loopwarden does not host (DESIGN.md §7).

`RoomGuard` is platform-free; each adapter module (`integrations.discord_py`,
`integrations.telegram_ptb`, `integrations.aiogram`, `integrations.slack_bolt`) imports its
library and, without it, raises an ImportError naming the extra to install.
"""

from integrations.room_guard import Decision, RoomGuard, RoomGuardError

__all__ = ["Decision", "RoomGuard", "RoomGuardError"]
