"""Room memory (DESIGN.md §3): the transcript stage records the room, the history stage reads it.

A room's transcript is kept per room and per thread in the state store
(`pipeline.transcript`: `max_messages`, `ttl`), shared by every hosted bot in the room and,
on sqlite or redis, by restarts and replicas. Where each message is recorded:

    errors → dedupe → self_filter → delivery → admin → transcript → channel_policy → …
           → bot_loop → silence → history → agent_dispatch

- transcript, inside admin: every message that is not an admin command is appended before
  anything decides whether this bot answers it, so humans, foreign bots and messages no
  bot answers are all in it. Dedupe (outer) drops a redelivery to this bot; the entry is
  keyed by the message key, so a message several hosted bots see is appended once.
- A hosted bot's post is not appended when another hosted bot receives it (the platform
  delivers each chunk as a message of its own): its own turn appends the reply whole,
  after the inner stages return it, keyed by the message it answers and the bot. That is
  the reply as it goes to the room: after the silence filter (stripped of a silence
  token), before delivery sends it, so a hosted bot that receives it finds it there. A
  reply whose delivery then fails stays recorded.
- Not recorded: admin commands and their acknowledgements (they are for the gateway, not
  the conversation), messages with no text (an image alone), whatever silence kept
  back, a turn admission or the loop guard refused, and the stages' own notices
  (cooldown, silence notice, timeout).
- history, innermost, before agent_dispatch: only a turn the agent will take reads the
  transcript. `turn.history` gets the newest entries before this message within the
  agent's `history` (`max_messages`, `max_tokens`), oldest first: the bot's own as
  `assistant`, everyone else's as `user` with the sender's name. "Before" is before the
  message's own entry: it and what other turns appended after it are left out (the
  agent has the message; the others came later). A hosted bot's message is found as the
  reply it is a chunk of: the sender's newest entry holding its text.

Decisions where DESIGN.md is silent:
- A direct message's transcript is the bot's own (`room@bot`): on Telegram a private
  chat's id is the person's id for every bot, and one bot's DM is no other bot's memory.
- A transcript is forgotten `ttl` after its last message, whole, the way a Redis key
  expires (not message by message).
- Tokens are estimated, no tokenizer is downloaded: a quarter of the characters of
  `Name: text`, rounded up, plus 4 for the message's framing (`estimate_tokens`).
- Memory is an aid: a record that cannot be read is skipped and counted
  (`transcript_records_skipped_total`); a store that fails to append or read is logged
  and counted under `errors_total{stage}`, and the turn goes on without it.
- Gateways sharing a Redis are expected to host the same bots (replicas): a hosted bot is
  known by its platform user id (`AdminService.is_hosted_bot`), and a bot hosted by
  another gateway with another config is recorded as a foreign bot too.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Literal

from gateway.admin.service import AdminService
from gateway.app.context import TurnContext
from gateway.app.pipeline import Handler
from gateway.app.types import HistoryEntry, InboundMessage, Reply
from gateway.config import HistoryConfig, TranscriptConfig
from gateway.observability.metrics import Metrics
from gateway.state import transcripts
from gateway.state.base import TranscriptEntry, TranscriptStore

log = logging.getLogger("loopwarden.transcript")

MESSAGE_OVERHEAD_TOKENS = 4
# Read past `history.max_messages`: the message being answered and a few that came after
# it (other turns in the room run meanwhile) are in the transcript and are left out.
_LATER = 8
Role = Literal["user", "assistant"]


def conversation_room(msg: InboundMessage) -> str:
    """The room a message's transcript belongs to: `platform:channel`, a DM's `…@bot`."""
    return f"{msg.room}@{msg.bot_id}" if msg.is_direct else msg.room


def conversation(msg: InboundMessage) -> str:
    """The transcript scope of a message: its room's, or its thread's."""
    return transcripts.scope(conversation_room(msg), msg.thread_id)


def estimate_tokens(name: str, text: str) -> int:
    """Tokens a history message costs, estimated: `Name: text` at 4 characters a token."""
    return (len(name) + len(text) + 5) // 4 + MESSAGE_OVERHEAD_TOKENS


# HistoryEntry's frozen __init__ sets each field through object.__setattr__; its slot
# descriptors do the same in about half the time, and a turn builds one per history
# message (as guards/loop_guard.py builds its decisions).
_new_object = object.__new__
_set_role = vars(HistoryEntry)["role"].__set__
_set_name = vars(HistoryEntry)["name"].__set__
_set_text = vars(HistoryEntry)["text"].__set__


def history_for(
    entries: Sequence[TranscriptEntry], *, me: str, limits: HistoryConfig
) -> tuple[HistoryEntry, ...]:
    """The newest entries within both limits, oldest first, as the bot `me` sees them."""
    kept: list[HistoryEntry] = []
    budget = limits.max_tokens
    most = limits.max_messages
    for entry in reversed(entries):
        if len(kept) >= most:
            break
        budget -= estimate_tokens(entry.sender_name, entry.text)
        if budget < 0:
            break
        role: Role = "assistant" if entry.sender_id == me else "user"
        seen: HistoryEntry = _new_object(HistoryEntry)
        _set_role(seen, role)
        _set_name(seen, entry.sender_name)
        _set_text(seen, entry.text)
        kept.append(seen)
    kept.reverse()
    return tuple(kept)


def _bot_user(ctx: TurnContext) -> str:
    """The hosted bot's platform user id (as the self filter reads it)."""
    return ctx.message.bot_user_id or ctx.connector.bot_user_id


class TranscriptMiddleware:
    """Appends every message of the room and this bot's replies to the room's transcript."""

    name = "transcript"

    def __init__(
        self,
        transcripts: TranscriptStore,
        config: TranscriptConfig,
        admin: AdminService,
        metrics: Metrics,
    ) -> None:
        self._transcripts = transcripts
        self._max_messages = config.max_messages
        self._ttl = config.ttl
        self._admin = admin
        self._metrics = metrics

    async def __call__(self, ctx: TurnContext, call_next: Handler) -> Reply | None:
        msg = ctx.message
        me = _bot_user(ctx)
        self._admin.register_bot(msg.bot_id, me)
        scope = conversation(msg)
        if msg.text and not msg.text.isspace() and not self._admin.is_hosted_bot(msg.sender_id):
            await self._append(
                ctx,
                scope,
                TranscriptEntry(msg.message_key, msg.sender_id, msg.sender_name, msg.text),
            )
        reply = await call_next(ctx)
        if reply is not None and _is_agent_reply(ctx):
            key = f"{msg.message_key}>{msg.bot_id}"
            await self._append(
                ctx, scope, TranscriptEntry(key, me, ctx.bot.display_name, reply.text)
            )
        return reply

    async def _append(self, ctx: TurnContext, scope: str, entry: TranscriptEntry) -> None:
        try:
            await self._transcripts.transcript_append(
                scope, entry, max_messages=self._max_messages, ttl=self._ttl
            )
        except Exception as exc:  # memory is an aid: a store failure must not cost the turn
            self._metrics.error(self.name)
            log.warning("%s: message not recorded: %s: %s", scope, type(exc).__name__, exc)


def _is_agent_reply(ctx: TurnContext) -> bool:
    """Whether the reply going out is the agent's (after silence), not a stage's notice."""
    result = ctx.result
    if result is None or result.text is None:
        return False
    return not any(d.stage == "silence" and d.code == "notice" for d in ctx.decisions)


class HistoryMiddleware:
    """Fills `turn.history` from the room's transcript for the agent about to answer."""

    name = "history"

    def __init__(self, transcripts: TranscriptStore, admin: AdminService, metrics: Metrics) -> None:
        self._transcripts = transcripts
        self._admin = admin
        self._metrics = metrics

    async def __call__(self, ctx: TurnContext, call_next: Handler) -> Reply | None:
        limits = ctx.config.agents[ctx.bot.agent].history
        if limits.max_messages and limits.max_tokens:
            ctx.history = await self._load(ctx, limits)
        return await call_next(ctx)

    async def _load(self, ctx: TurnContext, limits: HistoryConfig) -> tuple[HistoryEntry, ...]:
        msg = ctx.message
        scope = conversation(msg)
        try:
            transcript = await self._transcripts.transcript_recent(
                scope, limits.max_messages + _LATER
            )
        except Exception as exc:  # memory is an aid: a store failure must not cost the turn
            self._metrics.error(self.name)
            log.warning("%s: history not read: %s: %s", scope, type(exc).__name__, exc)
            return ()
        if transcript.skipped:
            self._metrics.transcript_skipped(transcript.skipped)
            log.warning("%s: %d unreadable history record(s) skipped", scope, transcript.skipped)
        entries = transcript.entries
        own = _own_entry(entries, msg, from_hosted=self._admin.is_hosted_bot(msg.sender_id))
        return history_for(
            entries if own is None else entries[:own], me=_bot_user(ctx), limits=limits
        )


def _own_entry(
    entries: Sequence[TranscriptEntry], msg: InboundMessage, *, from_hosted: bool
) -> int | None:
    """Where the message being answered is in the transcript, newest first; None if absent.

    A hosted bot's message is a chunk of the reply its turn recorded whole: the sender's
    newest entry holding its text.
    """
    text = msg.text.strip()
    for index in range(len(entries) - 1, -1, -1):
        entry = entries[index]
        if entry.key == msg.message_key:
            return index
        if from_hosted and text and entry.sender_id == msg.sender_id and text in entry.text:
            return index
    return None
