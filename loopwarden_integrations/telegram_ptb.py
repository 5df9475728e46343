"""python-telegram-bot: `LoopwardenHandler(guard)` in group -1, and `GuardedBot`, the reply filter.

    guard = RoomGuard(state="redis://127.0.0.1:6379/0", bot_id=TOKEN.split(":")[0])
    app = Application.builder().bot(GuardedBot(TOKEN, guard=guard)).build()
    app.add_handler(LoopwardenHandler(guard), group=-1)

`LoopwardenHandler` sees every `message` update before the handlers of later groups. It
reads the message with the gateway's own translator
(`connectors.telegram.inbound.translate_message`), so mentions, replies, forum topics and
senders on behalf of a chat (a bot, failing closed) mean what they mean to a hosted bot.
A refused message raises `ApplicationHandlerStop`, so no later group handles it; a
refusal that opens a cooldown first posts the guard's notice in the chat (its forum topic,
if any). Updates that are not conversation (edits, messages without text, `/cmd@otherbot`)
pass through unguarded.

`GuardedBot` is PTB's `ExtBot` whose sendMessage and editMessageText text passes
`guard.outgoing` (`reply_text`, `send_message`, `edit_text` all end there): a reply that
is only silence is not sent and the call returns None. It overrides `_send_message`, the
one method every PTB send goes through.
"""

from __future__ import annotations

import logging
from typing import Any

from loopwarden_integrations.extras import missing_extra

try:
    from telegram import Update
    from telegram.ext import ApplicationHandlerStop, BaseHandler, CallbackContext, ExtBot
except ModuleNotFoundError as exc:
    raise missing_extra(__name__, "python-telegram-bot", "telegram") from exc

from connectors.skips import Skip
from connectors.telegram.inbound import BotIdentity, translate_message
from loopwarden_integrations.room_guard import RoomGuard, admit_inbound, wrong_bot_id

__all__ = ["GuardedBot", "LoopwardenHandler"]

log = logging.getLogger("loopwarden.integrations.telegram")

Context = CallbackContext[Any, Any, Any, Any]
# The Bot API methods whose `text` is a reply the silence filter decides.
_TEXT_METHODS = frozenset({"sendMessage", "editMessageText"})


class LoopwardenHandler(BaseHandler[Update, Context, None]):
    """Admits each message update through the guard; a refused one stops every later group."""

    def __init__(self, guard: RoomGuard) -> None:
        super().__init__(self._admit, block=True)
        self.guard = guard

    def check_update(self, update: object) -> bool:
        """Message updates only: edits, callbacks and the rest are not conversation."""
        return isinstance(update, Update) and update.message is not None

    async def _admit(self, update: Update, context: Context) -> None:
        message = update.message
        if message is None:
            return
        guard = self.guard
        bot = context.bot
        error = wrong_bot_id(guard, str(bot.id), "Telegram")
        if error is not None:
            log.error("%s", error)
            raise ApplicationHandlerStop
        identity = BotIdentity(guard.bot_id, bot.id, bot.username)
        inbound = translate_message(message, bot=identity, event_id=str(update.update_id))
        if isinstance(inbound, Skip):
            return
        decision = await admit_inbound(guard, inbound)
        if decision.notice is not None:
            topic = message.message_thread_id if message.is_topic_message else None
            await bot.send_message(message.chat_id, decision.notice, message_thread_id=topic)
        if not decision.allowed:
            raise ApplicationHandlerStop


class GuardedBot(ExtBot[None]):
    """An ExtBot whose sent and edited texts pass the guard's silence filter."""

    def __init__(self, token: str, *, guard: RoomGuard, **kwargs: Any) -> None:
        super().__init__(token, **kwargs)
        self._guard = guard  # PTB freezes a bot's public attributes; protected ones stay open

    @property
    def guard(self) -> RoomGuard:
        """The guard whose silence filter every sent text passes."""
        return self._guard

    async def _send_message(
        self, endpoint: str, data: dict[str, Any], *args: Any, **kwargs: Any
    ) -> Any:
        """Every send of PTB; a text method's text is filtered first (None: nothing sent)."""
        text = data.get("text")
        if endpoint in _TEXT_METHODS and isinstance(text, str):
            kept = self._guard.outgoing(f"telegram:{data.get('chat_id')}", text)
            if kept is None:
                return None
            data["text"] = kept
        return await super()._send_message(endpoint, data, *args, **kwargs)
