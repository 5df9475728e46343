"""The guards inside bots and agents loopwarden does not host (DESIGN.md §7).

`RoomGuard` is platform-free; each adapter module (`loopwarden_integrations.discord_py`,
`.telegram_ptb`, `.aiogram`, `.slack_bolt`, `.langchain`, `.openai_agents`, `.praisonai`)
imports its library and, without it, raises an ImportError naming the extra to install.

The package was the top-level `integrations` until issue 22 (a name Django projects and
other applications use for their own code); that path is a deprecated alias for one
release (integrations/__init__.py).
"""

from loopwarden_integrations.room_guard import Decision, RoomGuard, RoomGuardError

__all__ = ["Decision", "RoomGuard", "RoomGuardError"]
