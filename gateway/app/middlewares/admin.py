"""Admin commands in chat: `/loop …` and `!loop …` (also `/loop@botname …`) as the first word.

`/new` (also `!new`, `/new@botname`) is `/loop forget`: it empties the conversation's
memory (DESIGN.md §3). In a direct message the person talking to the bot may run it, and
`/loop forget`, for their own conversation; in a group both are admin commands, and a
non-admin's is refused like any other and changes nothing.

The stage parses, authorises, claims and audits; `AdminService` does the work. A command
never reaches the agent; its answer is the gateway's own (`Reply.system`), not that of
the hosted bot that ran it. It is executed and acknowledged once per message however many
hosted bots see it (`admin:` + message key, claimed in the state store), and that one
execution writes the one audit entry. A bot's command is dropped unexecuted and
unanswered (audited); a person not listed for the platform gets a short refusal that
gives nothing away. Authorisation is by platform user id, never by display name.

Decisions where DESIGN.md is silent:
- The prefix is matched case-insensitively and a Telegram `@botname` suffix is ignored
  whichever hosted bot it names: the command concerns the room, not one bot.
- The acknowledgement quotes the prefix the person used, so Slack users see `!loop`.
- The audit entry of an admin's command goes to the audit trail's admin log; every other
  (a non-admin's refused command, a bot's, a person's own forget in a DM) to its
  `others` log, bounded per sender, so no number of them pushes an admin's out
  (gateway/state/audit.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from gateway.admin.service import AdminService
from gateway.app import messages
from gateway.app.context import TurnContext
from gateway.app.middlewares.transcript import conversation_room
from gateway.app.pipeline import Handler
from gateway.app.refusals import DecisionLog
from gateway.app.types import Reply
from gateway.config import Config
from gateway.state.base import AuditEntry, AuditStore

_PREFIXES = ("/loop", "!loop")
_NEW = ("/new", "!new")
_AUDITED_COMMAND_CHARS = 200


@dataclass(frozen=True, slots=True)
class Command:
    """A parsed admin command: the prefix as typed (lower-cased) and the words after it."""

    prefix: str
    args: tuple[str, ...]


def parse_command(text: str) -> Command | None:
    """The command in `text`, or None when its first word is not `/loop`, `!loop` or `/new`.

    `/new` (the words after it ignored) reads as `forget`.
    """
    stripped = text.lstrip()
    if stripped[:5].lower() not in _PREFIXES and stripped[:4].lower() not in _NEW:
        return None
    words = stripped.split()
    prefix = words[0].lower().partition("@")[0]
    if prefix in _NEW:
        return Command(prefix, ("forget",))
    if prefix not in _PREFIXES:
        return None
    return Command(prefix, tuple(words[1:]))


class AdminMiddleware:
    """Handles `/loop` commands; everything else goes on to the inner stages."""

    name = "admin"

    def __init__(
        self,
        config: Config,
        admin: AdminService,
        audit: AuditStore,
        decisions: DecisionLog,
        *,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._admins = config.admins
        self._ttl = config.pipeline.dedupe_ttl_seconds
        self._admin = admin
        self._audit_log = audit
        self._decisions = decisions
        self._wall_clock = wall_clock

    async def __call__(self, ctx: TurnContext, call_next: Handler) -> Reply | None:
        msg = ctx.message
        self._admin.register_bot(msg.bot_id, msg.bot_user_id)
        command = parse_command(msg.text)
        if command is None:
            return await call_next(ctx)
        if not await ctx.state.claim("admin:" + msg.message_key, self._ttl):
            # Another hosted bot that sees this message runs it; a command never goes on.
            return None
        if msg.sender_is_bot:
            await self._audit(ctx, allowed=False, outcome="ignored: sent by a bot")
            self._decisions.refuse(ctx, self.name, "bot_command", "bots cannot run commands")
            return None
        forget = bool(command.args) and command.args[0].lower() == "forget"
        is_admin = msg.sender_id in self._admins.for_platform(msg.platform)
        if not is_admin and not (forget and msg.is_direct):
            await self._audit(ctx, allowed=False, outcome="refused")
            self._decisions.refuse(ctx, self.name, "not_authorised", "command refused")
            return Reply(
                messages.REFUSAL,
                thread_id=msg.thread_id,
                reply_to=msg.message_id,
                ephemeral_to=msg.sender_id,
                system=True,
            )
        room = conversation_room(msg) if forget else msg.room
        ack = await self._admin.run(
            room, command.args, thread_id=msg.thread_id, prefix=command.prefix
        )
        outcome = "done" if ack.ok else "rejected"
        # A person's own forget in a DM is allowed, but goes to the `others` log.
        await self._audit(ctx, allowed=True, outcome=outcome, by_admin=is_admin)
        name = command.args[0].lower() if command.args else "help"
        said = " ".join(command.args)[:_AUDITED_COMMAND_CHARS] or "help"
        self._decisions.note(
            ctx, self.name, name, f"{said} by {msg.sender_name or msg.sender_id} ({outcome})"
        )
        return Reply(ack.text, thread_id=msg.thread_id, reply_to=msg.message_id, system=True)

    async def _audit(
        self, ctx: TurnContext, *, allowed: bool, outcome: str, by_admin: bool = False
    ) -> None:
        """One audit entry, in the admin log only for what an admin did (gateway/state/audit.py)."""
        msg = ctx.message
        await self._audit_log.audit(
            AuditEntry(
                at=self._wall_clock(),
                platform=msg.platform,
                room=msg.room,
                user_id=msg.sender_id,
                user_name=msg.sender_name,
                command=msg.text.strip()[:_AUDITED_COMMAND_CHARS],
                allowed=allowed,
                outcome=outcome,
                kind="admin" if allowed and by_admin else "others",
            )
        )
