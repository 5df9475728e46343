"""discord.py: `guard_bot(bot, guard)` puts a RoomGuard in front of a Client or commands.Bot.

    guard = RoomGuard(state="redis://127.0.0.1:6379/0", bot_id="<the bot's user id>")
    bot = commands.Bot(command_prefix="!", intents=intents)
    guard_bot(bot, guard)

Inbound: the client's MESSAGE_CREATE parser is wrapped, so a refused message is never
turned into a `discord.Message`: no `on_message` listener, prefix command or `wait_for`
sees it. Messages are read with the gateway's own translator
(`connectors.discord.inbound.translate_message`, the raw payload), so a guarded bot and a
hosted one agree on who is a bot, what is a mention and which room a thread belongs to.
What the translator does not treat as conversation (the bot's own posts, joins, pins,
messages without text) passes through unguarded. Each channel's messages are admitted and
parsed one at a time, in the order they arrived. A refusal that opens a cooldown posts the
guard's notice in the channel.

Outbound: `discord.abc.Messageable.send` (channels, threads, DMs, `ctx.send`,
`message.reply`) passes its text through `guard.outgoing` for the bots given to
`guard_bot`; other clients of the process are untouched. A reply that is only silence is
not posted and `send` returns None; with files or embeds, those are posted without the
text. Edits (`Message.edit`) and webhooks are not filtered.

This relies on two discord.py 2.x internals the gateway's connector uses too:
`Client._connection.parsers` and `Messageable._get_channel`.
"""

from __future__ import annotations

import asyncio
import logging
import warnings
import weakref
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from loopwarden_integrations.extras import missing_extra

try:
    with warnings.catch_warnings():
        # discord.py imports the stdlib `audioop` (for voice), deprecated since Python 3.11.
        warnings.filterwarnings("ignore", "'audioop' is deprecated", DeprecationWarning)
        import discord
        from discord.state import ConnectionState
except ModuleNotFoundError as exc:
    raise missing_extra(__name__, "discord.py", "discord") from exc

from connectors.discord.inbound import BotIdentity, translate_message
from connectors.skips import Skip
from loopwarden_integrations.room_guard import RoomGuard, admit_inbound, wrong_bot_id

__all__ = ["guard_bot"]

log = logging.getLogger("loopwarden.integrations.discord")

ClientT = TypeVar("ClientT", bound=discord.Client)

# What `send` posts besides its text: with any of these, a silenced text is just dropped.
_PAYLOAD = ("embed", "embeds", "file", "files", "stickers", "view", "poll")
_GUARDS: weakref.WeakKeyDictionary[ConnectionState[Any], RoomGuard] = weakref.WeakKeyDictionary()
_original_send = discord.abc.Messageable.send


def guard_bot(bot: ClientT, guard: RoomGuard) -> ClientT:
    """Guard `bot`'s inbound messages and outgoing sends with `guard`; returns `bot`."""
    state = bot._connection
    _GUARDS[state] = guard
    parsers = state.parsers
    parsers["MESSAGE_CREATE"] = _GuardedParser(bot, guard, parsers["MESSAGE_CREATE"])
    discord.abc.Messageable.send = _send  # type: ignore[method-assign]
    return bot


class _GuardedParser:
    """MESSAGE_CREATE: admit the raw message first, then hand it to discord.py's parser."""

    def __init__(self, bot: discord.Client, guard: RoomGuard, parse: Callable[[Any], None]) -> None:
        self._bot = bot
        self._guard = guard
        self._parse = parse
        self._lanes: dict[object, asyncio.Task[None]] = {}

    def __call__(self, data: Any) -> None:
        channel = data.get("channel_id") if isinstance(data, Mapping) else None
        before = self._lanes.get(channel)
        task = asyncio.get_running_loop().create_task(self._admit(data, before))
        self._lanes[channel] = task
        task.add_done_callback(lambda done: self._finished(channel, done))

    async def _admit(self, data: Any, before: asyncio.Task[None] | None) -> None:
        """Wait for the channel's previous message, decide this one, parse it if admitted."""
        if before is not None:
            await asyncio.wait((before,))
        me = self._bot.user
        if me is None:  # not logged in: nothing to guard against yet
            self._parse(data)
            return
        user_id = str(me.id)
        error = wrong_bot_id(self._guard, user_id, "Discord")
        if error is not None:
            log.error("%s", error)
            return
        identity = BotIdentity(self._guard.bot_id, user_id)
        inbound = translate_message(data, bot=identity, thread_parent=self._thread_parent(data))
        if isinstance(inbound, Skip):
            self._parse(data)
            return
        decision = await admit_inbound(self._guard, inbound)
        if decision.notice is not None:
            await self._post(data, decision.notice)
        if decision.allowed:
            self._parse(data)

    def _thread_parent(self, data: Mapping[str, Any]) -> str | None:
        """The parent channel's id when the message is in a thread the client knows."""
        try:
            channel = self._bot.get_channel(int(data["channel_id"]))
        except (KeyError, TypeError, ValueError):
            return None
        if isinstance(channel, discord.Thread):
            return str(channel.parent_id)
        return None

    async def _post(self, data: Mapping[str, Any], text: str) -> None:
        """Post the cooldown notice where the message was; a failure is logged, not raised."""
        try:
            channel = self._bot.get_partial_messageable(int(data["channel_id"]))
            await channel.send(text)
        except discord.DiscordException as exc:
            log.warning("could not post the cooldown notice: %s", exc)

    def _finished(self, channel: object, task: asyncio.Task[None]) -> None:
        """Forget an idle lane; log what went wrong (nothing raised may end the client)."""
        if self._lanes.get(channel) is task:
            del self._lanes[channel]
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("guarding a Discord message failed", exc_info=exc)


async def _send(self: discord.abc.Messageable, content: Any = None, **kwargs: Any) -> Any:
    """`Messageable.send` with the text through the guard of the bot that sends it."""
    state = getattr(self, "_state", None)
    guard = None if state is None else _GUARDS.get(state)
    if guard is None or content is None:
        return await _original_send(self, content, **kwargs)
    channel = await self._get_channel()
    kept = guard.outgoing(f"discord:{channel.id}", str(content))
    if kept is None and not any(kwargs.get(name) for name in _PAYLOAD):
        return None
    return await _original_send(self, kept, **kwargs)
