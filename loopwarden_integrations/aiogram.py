"""aiogram 3: `LoopwardenMiddleware`, an outer middleware for `dp.message`; `ReplyFilter`.

    guard = RoomGuard(state="redis://127.0.0.1:6379/0", bot_id=TOKEN.split(":")[0])
    dp.message.outer_middleware(LoopwardenMiddleware(guard))
    bot.session.middleware(ReplyFilter(guard))

The outer middleware runs before aiogram's filters and handlers: a refused message reaches
no handler (the update ends unhandled), and a refusal that opens a cooldown first posts the
guard's notice in the chat (its forum topic, if any). The message is read with the rules
of the gateway's Telegram translator (`connectors.telegram.inbound`, which works on PTB's
types, so they are applied here to aiogram's): the sender is `from`, or the chat a message
is sent on behalf of (`sender_chat`, a bot: fail closed); a mention is `@username` or a
text mention of the bot, or a leading `/cmd@thisbot`; a reply to the bot counts unless it
is a forum topic's root; a private chat is direct. Messages without text and commands
addressed to another bot (`/cmd@otherbot`) pass through unguarded.

`ReplyFilter` is a session request middleware: the text of sendMessage and
editMessageText passes `guard.outgoing`; a reply that is only silence is not sent and the
call returns None.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, cast

from loopwarden_integrations.extras import missing_extra

try:
    from aiogram import BaseMiddleware, Bot
    from aiogram.client.session.middlewares.base import (
        BaseRequestMiddleware,
        NextRequestMiddlewareType,
    )
    from aiogram.enums import ChatType, MessageEntityType
    from aiogram.methods import EditMessageText, Response, SendMessage, TelegramMethod
    from aiogram.methods.base import TelegramType
    from aiogram.types import Message, TelegramObject, User
except ModuleNotFoundError as exc:
    raise missing_extra(__name__, "aiogram", "aiogram") from exc

from gateway.app.types import InboundMessage
from loopwarden_integrations.room_guard import RoomGuard, admit_inbound, wrong_bot_id

__all__ = ["LoopwardenMiddleware", "ReplyFilter"]

log = logging.getLogger("loopwarden.integrations.aiogram")

Handler = Callable[[TelegramObject, dict[str, Any]], Awaitable[Any]]


class LoopwardenMiddleware(BaseMiddleware):
    """Admits each message through the guard before aiogram's filters and handlers see it."""

    def __init__(self, guard: RoomGuard) -> None:
        self.guard = guard

    async def __call__(self, handler: Handler, event: TelegramObject, data: dict[str, Any]) -> Any:
        bot = data.get("bot")
        if not isinstance(event, Message) or not isinstance(bot, Bot):
            return await handler(event, data)
        guard = self.guard
        error = wrong_bot_id(guard, str(bot.id), "Telegram")
        if error is not None:
            log.error("%s", error)
            return None
        inbound = translate(event, await bot.me(), bot_id=guard.bot_id)
        if inbound is None:
            return await handler(event, data)
        decision = await admit_inbound(guard, inbound)
        if decision.notice is not None:
            topic = event.message_thread_id if event.is_topic_message else None
            await bot.send_message(event.chat.id, decision.notice, message_thread_id=topic)
        if not decision.allowed:
            return None
        return await handler(event, data)


class ReplyFilter(BaseRequestMiddleware):
    """Passes sent and edited texts through the guard's silence filter."""

    def __init__(self, guard: RoomGuard) -> None:
        self.guard = guard

    async def __call__(
        self,
        make_request: NextRequestMiddlewareType[TelegramType],
        bot: Bot,
        method: TelegramMethod[TelegramType],
    ) -> Response[TelegramType]:
        if isinstance(method, SendMessage | EditMessageText) and method.text is not None:
            kept = self.guard.outgoing(f"telegram:{method.chat_id}", method.text)
            if kept is None:
                # aiogram hands the result itself down the chain (its annotation says
                # Response), so None is what the caller of `bot.send_message` gets.
                return cast("Response[TelegramType]", None)
            method = cast("TelegramMethod[TelegramType]", method.model_copy(update={"text": kept}))
        return await make_request(bot, method)


def translate(message: Message, me: User, *, bot_id: str) -> InboundMessage | None:
    """The message as the gateway's Telegram translator reads it, None when not conversation."""
    text = message.text if message.text is not None else message.caption
    if not text or not text.strip():
        return None
    if message.sender_chat is not None:
        chat = message.sender_chat
        sender_id, sender_name, sender_is_bot = (
            str(chat.id),
            chat.title or chat.username or str(chat.id),
            True,
        )
    elif message.from_user is not None:
        user = message.from_user
        sender_id, sender_name, sender_is_bot = (
            str(user.id),
            user.username or user.full_name,
            user.is_bot,
        )
    else:
        return None
    addressed = _addressed(message, text, me)
    if addressed is None:
        return None
    quoted = message.reply_to_message
    reply_to_bot = (
        quoted is not None
        and quoted.forum_topic_created is None
        and quoted.from_user is not None
        and quoted.from_user.id == me.id
    )
    return InboundMessage(
        platform="telegram",
        bot_id=bot_id,
        channel_id=str(message.chat.id),
        thread_id=None,
        message_id=str(message.message_id),
        sender_id=sender_id,
        sender_name=sender_name,
        sender_is_bot=sender_is_bot,
        text=text,
        mentions_bot=addressed,
        reply_to_bot=reply_to_bot,
        is_direct=message.chat.type == ChatType.PRIVATE,
        bot_user_id=str(me.id),
    )


def _addressed(message: Message, text: str, me: User) -> bool | None:
    """Whether the message mentions the bot; None for a command addressed to another bot."""
    handle = f"@{(me.username or '').lower()}"
    entities = message.entities if message.text is not None else message.caption_entities
    for entity in entities or ():
        value = entity.extract_from(text)
        if entity.type == MessageEntityType.BOT_COMMAND and entity.offset == 0:
            _, at, target = value.partition("@")
            if at:
                return f"@{target.lower()}" == handle or None
        if (entity.type == MessageEntityType.MENTION and value.lower() == handle) or (
            entity.type == MessageEntityType.TEXT_MENTION
            and entity.user is not None
            and entity.user.id == me.id
        ):
            return True
    return False
