"""A local fake Telegram Bot API server, over real loopback HTTP, for python-telegram-bot.

It serves `/bot<token>/<method>` like api.telegram.org: parameters from the query string,
form bodies (urlencoded or multipart, non-string values JSON-encoded, as PTB sends them) or
JSON bodies; answers `{"ok": true, "result": …}` or `{"ok": false, "error_code", "description"
[, "parameters"]}`. Several bots (tokens) share one fake, and group chats are shared between
them: one message in a group has one `message_id` for every member bot, and each bot has its
own update queue and `update_id` sequence.

Like Telegram, a message a bot sends is never delivered to other bots; unlike Telegram, the
injection helpers do deliver messages from (unhosted) bots, so tests can play another bot.
`allowed_updates` is recorded but not applied, so a connector's own filtering is exercised.

Hooks: `group_message` / `private_message` / `topic_message` / `photo_message` /
`service_message` / `senderless_message` / `unknown_update` inject updates; `sent` and
`chat_actions` record what bots posted; `fail_next_sends(n)` answers the next n sendMessage
calls with 429 and `retry_after`; `editMessageText` changes a bot's own message (recorded
in `edits`; `text_of` is a message's text now), `fail_next_edits(n)` answers the next n
with 429 and `refuse_next_edits(n)` with "message can't be edited"; `drop_next_polls(n)`
closes the connection of the next n getUpdates calls without an answer; `on_send` lets a
test react to every posted message; `send_latency` delays every sendMessage answer (a
far-away API, for benchmarks).
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import json
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from aiohttp import web

from tests.fakes.loopback import LOOPBACK_HOST, serve_loopback

Json = dict[str, Any]

_MENTION = re.compile(r"(?<![\w@])@[A-Za-z0-9_]{3,32}")
_COMMAND = re.compile(r"(?<!\S)/[A-Za-z0-9_]{1,32}(?:@[A-Za-z0-9_]{3,32})?")
MAX_TEXT = 4096


@dataclass(frozen=True, slots=True)
class FakeUser:
    """A Telegram user or bot account as the fake knows it."""

    id: int
    first_name: str
    username: str | None = None
    is_bot: bool = False

    def to_json(self) -> Json:
        """The `User` object of the Bot API."""
        data: Json = {"id": self.id, "is_bot": self.is_bot, "first_name": self.first_name}
        if self.username:
            data["username"] = self.username
        return data


@dataclass(frozen=True, slots=True)
class FakeChat:
    """A chat: `private`, `group`, `supergroup` (optionally a forum) or `channel`."""

    id: int
    type: str
    title: str | None = None
    is_forum: bool = False

    def to_json(self) -> Json:
        """The `Chat` object of the Bot API."""
        data: Json = {"id": self.id, "type": self.type}
        if self.title:
            data["title"] = self.title
        if self.is_forum:
            data["is_forum"] = True
        return data


@dataclass(slots=True)
class FakeBot:
    """One bot account on the fake: its token, user, update queue and webhook."""

    token: str
    user: FakeUser
    can_read_all_group_messages: bool = True
    updates: list[Json] = field(default_factory=list)  # pending, sorted by update_id
    next_update_id: int = 1000
    webhook_url: str = ""
    webhook_secret: str | None = None
    allowed_updates: list[str] | None = None
    confirmed_offset: int = 0
    polls: int = 0
    wakeup: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(frozen=True, slots=True)
class SentMessage:
    """One message a bot posted with sendMessage."""

    token: str
    chat_id: int
    message_id: int
    text: str
    thread_id: int | None
    reply_to: int | None
    sent_at: float


@dataclass(frozen=True, slots=True)
class EditedText:
    """One editMessageText that changed a message."""

    token: str
    chat_id: int
    message_id: int
    text: str


@dataclass(frozen=True, slots=True)
class ChatAction:
    """One sendChatAction call."""

    token: str
    chat_id: int
    action: str
    thread_id: int | None


class _ApiError(Exception):
    """An error answer of the Bot API."""

    def __init__(self, code: int, description: str, parameters: Json | None = None) -> None:
        super().__init__(description)
        self.code = code
        self.description = description
        self.parameters = parameters


def _utf16_len(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def entities_for(text: str) -> list[Json]:
    """The `mention` and `bot_command` entities Telegram would parse out of plain text."""
    found: list[tuple[int, int, str]] = []
    for pattern, kind in ((_MENTION, "mention"), (_COMMAND, "bot_command")):
        found.extend((m.start(), m.end(), kind) for m in pattern.finditer(text))
    found.sort()
    return [
        {
            "type": kind,
            "offset": _utf16_len(text[:start]),
            "length": _utf16_len(text[start:end]),
        }
        for start, end, kind in found
    ]


class TelegramFake:
    """The fake Bot API server; use as `async with TelegramFake() as fake:`."""

    def __init__(self) -> None:
        self.bots: dict[str, FakeBot] = {}
        self.chats: dict[int, FakeChat] = {}
        self.members: dict[int, set[str]] = {}
        self.messages: dict[tuple[int, int], Json] = {}
        self.sent: list[SentMessage] = []
        self.send_attempts = 0
        self.edits: list[EditedText] = []
        self.edit_attempts = 0
        self.chat_actions: list[ChatAction] = []
        self.calls: list[tuple[str, str]] = []
        self.on_send: Callable[[SentMessage], None] | None = None
        self.send_latency = 0.0
        self._message_ids: dict[int, itertools.count[int]] = {}
        self._fail_sends: list[int] = []
        self._fail_edits: list[int] = []
        self._refuse_edits = 0
        self._drop_polls = 0
        self._app = web.Application()
        self._app.router.add_route("*", "/bot{token}/{method}", self._dispatch)
        self._runner: web.AppRunner | None = None
        self.base_url = ""

    async def __aenter__(self) -> TelegramFake:
        self._runner = web.AppRunner(self._app, handle_signals=False, handler_cancellation=True)
        port = await serve_loopback(self._runner)
        self.base_url = f"http://{LOOPBACK_HOST}:{port}"
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    # ----------------------------------------------------------------- setup helpers

    def add_bot(
        self, token: str, user_id: int, username: str, *, reads_all: bool = True
    ) -> FakeBot:
        """Register a bot account (its token is what the connector is configured with)."""
        bot = FakeBot(
            token=token,
            user=FakeUser(user_id, username.replace("_", " "), username, is_bot=True),
            can_read_all_group_messages=reads_all,
        )
        self.bots[token] = bot
        return bot

    def add_chat(self, chat: FakeChat, *tokens: str) -> FakeChat:
        """Create a chat with the given bots as members."""
        self.chats[chat.id] = chat
        self.members.setdefault(chat.id, set()).update(tokens)
        return chat

    def fail_next_sends(self, count: int, *, retry_after: int = 1) -> None:
        """Answer the next `count` sendMessage calls with 429 and `retry_after`."""
        self._fail_sends.extend([retry_after] * count)

    def fail_next_edits(self, count: int, *, retry_after: int = 1) -> None:
        """Answer the next `count` editMessageText calls with 429 and `retry_after`."""
        self._fail_edits.extend([retry_after] * count)

    def refuse_next_edits(self, count: int) -> None:
        """Answer the next `count` editMessageText calls with "message can't be edited"."""
        self._refuse_edits += count

    def text_of(self, chat_id: int, message_id: int) -> str:
        """The text of a message now, with its edits."""
        return str(self.messages[(chat_id, message_id)].get("text", ""))

    def drop_next_polls(self, count: int = 1) -> None:
        """Close the connection of the next `count` getUpdates calls without answering."""
        self._drop_polls += count

    @property
    def pending_drops(self) -> int:
        """getUpdates calls still to be dropped by `drop_next_polls`."""
        return self._drop_polls

    def sent_to(self, chat_id: int, token: str | None = None) -> list[SentMessage]:
        """Messages posted into one chat, optionally by one bot only."""
        return [
            m for m in self.sent if m.chat_id == chat_id and (token is None or m.token == token)
        ]

    def pending(self, token: str) -> list[Json]:
        """Updates of one bot not yet confirmed by a getUpdates offset."""
        return list(self.bots[token].updates)

    # ------------------------------------------------------------- injection helpers

    def _new_message_id(self, chat_id: int) -> int:
        counter = self._message_ids.setdefault(chat_id, itertools.count(1))
        return next(counter)

    def build_message(
        self,
        chat: FakeChat,
        sender: FakeUser | None,
        text: str | None,
        *,
        thread_id: int | None = None,
        reply_to: int | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> Json:
        """A `Message` object in `chat`, stored so later replies can quote it."""
        message_id = self._new_message_id(chat.id)
        message: Json = {"message_id": message_id, "date": int(time.time()), "chat": chat.to_json()}
        if sender is not None:
            message["from"] = sender.to_json()
        if text is not None:
            message["text"] = text
            entities = entities_for(text)
            if entities:
                message["entities"] = entities
        if thread_id is not None:
            message["message_thread_id"] = thread_id
            if chat.is_forum:
                message["is_topic_message"] = True
        if reply_to is not None and (chat.id, reply_to) in self.messages:
            message["reply_to_message"] = self.messages[(chat.id, reply_to)]
        message.update(extra or {})
        self.messages[(chat.id, message_id)] = message
        return message

    def deliver(self, token: str, payload: Mapping[str, Any]) -> Json:
        """Queue one update (any payload besides update_id) for one bot; returns it."""
        bot = self.bots[token]
        update: Json = {"update_id": bot.next_update_id, **payload}
        bot.next_update_id += 1
        bisect.insort(bot.updates, update, key=_update_id)
        bot.wakeup.set()
        return update

    def redeliver(self, token: str, update: Mapping[str, Any]) -> None:
        """Queue an update again with its original update_id (a redelivery)."""
        bot = self.bots[token]
        bisect.insort(bot.updates, dict(update), key=_update_id)
        bot.wakeup.set()

    def _to_members(self, chat: FakeChat, message: Json, key: str = "message") -> list[Json]:
        return [self.deliver(token, {key: message}) for token in sorted(self.members[chat.id])]

    def group_message(
        self,
        chat: FakeChat,
        sender: FakeUser,
        text: str,
        *,
        reply_to: int | None = None,
        thread_id: int | None = None,
    ) -> list[Json]:
        """A text message in a group, delivered to every member bot; returns the updates."""
        message = self.build_message(chat, sender, text, reply_to=reply_to, thread_id=thread_id)
        return self._to_members(chat, message)

    def topic_message(self, chat: FakeChat, sender: FakeUser, text: str, topic: int) -> list[Json]:
        """A text message in a forum topic (`message_thread_id`, `is_topic_message`)."""
        return self.group_message(chat, sender, text, thread_id=topic)

    def private_message(self, token: str, sender: FakeUser, text: str) -> Json:
        """A direct message from `sender` to one bot (the private chat's id is the user's)."""
        chat = self.chats.setdefault(
            sender.id, FakeChat(sender.id, "private", title=None, is_forum=False)
        )
        self.members.setdefault(chat.id, set()).add(token)
        return self.deliver(token, {"message": self.build_message(chat, sender, text)})

    def photo_message(self, chat: FakeChat, sender: FakeUser) -> list[Json]:
        """A photo with no caption (no text at all)."""
        photo = [{"file_id": "AgADfake", "file_unique_id": "fake1", "width": 90, "height": 90}]
        message = self.build_message(chat, sender, None, extra={"photo": photo})
        return self._to_members(chat, message)

    def service_message(self, chat: FakeChat, sender: FakeUser, joined: FakeUser) -> list[Json]:
        """A `new_chat_members` service message."""
        extra = {"new_chat_members": [joined.to_json()]}
        message = self.build_message(chat, sender, None, extra=extra)
        return self._to_members(chat, message)

    def senderless_message(self, chat: FakeChat, text: str) -> list[Json]:
        """A message with neither `from` nor `sender_chat` (as in a channel)."""
        return self._to_members(chat, self.build_message(chat, None, text))

    def unknown_update(self, token: str) -> Json:
        """An update of a type no connector knows."""
        return self.deliver(token, {"future_update_kind": {"id": 1, "flavour": "new"}})

    # ---------------------------------------------------------------------- server

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        token = request.match_info["token"]
        method = request.match_info["method"].lower()
        self.calls.append((token, method))
        if method == "getupdates" and self._drop_polls and token in self.bots:
            self._drop_polls -= 1
            if request.transport is not None:
                request.transport.close()
            return web.Response(status=500)
        try:
            result = await self._call(token, method, request)
        except _ApiError as exc:
            body: Json = {"ok": False, "error_code": exc.code, "description": exc.description}
            if exc.parameters:
                body["parameters"] = exc.parameters
            return web.json_response(body, status=exc.code)
        return web.json_response({"ok": True, "result": result})

    async def _call(self, token: str, method: str, request: web.Request) -> Any:
        bot = self.bots.get(token)
        if bot is None:
            raise _ApiError(401, "Unauthorized")
        handler = self._handlers().get(method)
        if handler is None:
            raise _ApiError(404, "Not Found")
        return await handler(bot, await _params(request))

    def _handlers(self) -> dict[str, Callable[[FakeBot, Json], Any]]:
        return {
            "getme": self._get_me,
            "getupdates": self._get_updates,
            "sendmessage": self._send_message,
            "editmessagetext": self._edit_message_text,
            "sendchataction": self._send_chat_action,
            "setwebhook": self._set_webhook,
            "deletewebhook": self._delete_webhook,
            "getwebhookinfo": self._get_webhook_info,
            "close": self._ok,
            "logout": self._ok,
        }

    async def _ok(self, bot: FakeBot, params: Json) -> bool:
        return True

    async def _get_me(self, bot: FakeBot, params: Json) -> Json:
        return {
            **bot.user.to_json(),
            "can_join_groups": True,
            "can_read_all_group_messages": bot.can_read_all_group_messages,
            "supports_inline_queries": False,
        }

    async def _get_updates(self, bot: FakeBot, params: Json) -> list[Json]:
        if bot.webhook_url:
            raise _ApiError(
                409,
                "Conflict: can't use getUpdates method while webhook is active; "
                "use deleteWebhook to delete the webhook first",
            )
        bot.polls += 1
        offset = _int(params.get("offset"))
        limit = min(max(_int(params.get("limit")) or 100, 1), 100)
        timeout = float(params.get("timeout") or 0)
        if "allowed_updates" in params:
            bot.allowed_updates = _json(params["allowed_updates"])
        if offset is not None:
            if offset < 0:
                del bot.updates[:offset]
            else:
                del bot.updates[: bisect.bisect_left(bot.updates, offset, key=_update_id)]
                bot.confirmed_offset = max(bot.confirmed_offset, offset)
        if not bot.updates and timeout > 0:
            bot.wakeup.clear()
            try:
                await asyncio.wait_for(bot.wakeup.wait(), timeout)
            except TimeoutError:
                return []
        return bot.updates[:limit]

    async def _send_message(self, bot: FakeBot, params: Json) -> Json:
        self.send_attempts += 1
        if self.send_latency:
            await asyncio.sleep(self.send_latency)
        if self._fail_sends:
            retry_after = self._fail_sends.pop(0)
            raise _ApiError(
                429,
                f"Too Many Requests: retry after {retry_after}",
                {"retry_after": retry_after},
            )
        chat_id = _int(params.get("chat_id"))
        chat = self.chats.get(chat_id) if chat_id is not None else None
        if chat is None or bot.token not in self.members.get(chat.id, set()):
            raise _ApiError(400, "Bad Request: chat not found")
        text = str(params.get("text") or "")
        if not text.strip():
            raise _ApiError(400, "Bad Request: message text is empty")
        if len(text) > MAX_TEXT:
            raise _ApiError(400, "Bad Request: message is too long")
        thread_id = _int(params.get("message_thread_id"))
        reply_to = _int((_json(params.get("reply_parameters")) or {}).get("message_id"))
        if reply_to is None:
            reply_to = _int(params.get("reply_to_message_id"))
        message = self.build_message(chat, bot.user, text, thread_id=thread_id, reply_to=reply_to)
        sent = SentMessage(
            token=bot.token,
            chat_id=chat.id,
            message_id=message["message_id"],
            text=text,
            thread_id=thread_id,
            reply_to=reply_to,
            sent_at=time.monotonic(),
        )
        self.sent.append(sent)
        if self.on_send is not None:
            self.on_send(sent)
        return message

    async def _edit_message_text(self, bot: FakeBot, params: Json) -> Json:
        self.edit_attempts += 1
        if self._fail_edits:
            retry_after = self._fail_edits.pop(0)
            raise _ApiError(
                429,
                f"Too Many Requests: retry after {retry_after}",
                {"retry_after": retry_after},
            )
        chat_id, message_id = _int(params.get("chat_id")), _int(params.get("message_id"))
        message = self.messages.get((chat_id, message_id)) if chat_id and message_id else None
        if message is None or message.get("from", {}).get("id") != bot.user.id:
            raise _ApiError(400, "Bad Request: message to edit not found")
        if self._refuse_edits:
            self._refuse_edits -= 1
            raise _ApiError(400, "Bad Request: message can't be edited")
        text = str(params.get("text") or "")
        if not text.strip():
            raise _ApiError(400, "Bad Request: message text is empty")
        if len(text) > MAX_TEXT:
            raise _ApiError(400, "Bad Request: MESSAGE_TOO_LONG")
        if text == message.get("text"):
            raise _ApiError(
                400,
                "Bad Request: message is not modified: specified new message content and "
                "reply markup are exactly the same as a current content and reply markup "
                "of the message",
            )
        message["text"] = text
        message["edit_date"] = int(time.time())
        self.edits.append(EditedText(bot.token, message["chat"]["id"], message["message_id"], text))
        return message

    async def _send_chat_action(self, bot: FakeBot, params: Json) -> bool:
        chat_id = _int(params.get("chat_id"))
        if chat_id is None or chat_id not in self.chats:
            raise _ApiError(400, "Bad Request: chat not found")
        action = str(params.get("action") or "")
        thread_id = _int(params.get("message_thread_id"))
        self.chat_actions.append(ChatAction(bot.token, chat_id, action, thread_id))
        return True

    async def _set_webhook(self, bot: FakeBot, params: Json) -> bool:
        url = str(params.get("url") or "")
        if url and not url.startswith(("https://", "http://")):
            raise _ApiError(400, "Bad Request: bad webhook: An HTTPS URL must be provided")
        bot.webhook_url = url
        secret = params.get("secret_token")
        bot.webhook_secret = str(secret) if secret else None
        if "allowed_updates" in params:
            bot.allowed_updates = _json(params["allowed_updates"])
        return True

    async def _delete_webhook(self, bot: FakeBot, params: Json) -> bool:
        bot.webhook_url = ""
        bot.webhook_secret = None
        if str(params.get("drop_pending_updates", "")).lower() in ("true", "1"):
            bot.updates.clear()
        return True

    async def _get_webhook_info(self, bot: FakeBot, params: Json) -> Json:
        return {
            "url": bot.webhook_url,
            "has_custom_certificate": False,
            "pending_update_count": len(bot.updates),
        }


async def _params(request: web.Request) -> Json:
    """Query string, then form or JSON body, as the Bot API accepts them."""
    params: Json = dict(request.query)
    if request.can_read_body:
        if request.content_type == "application/json":
            body = await request.json()
            if not isinstance(body, dict):
                raise _ApiError(400, "Bad Request: parameters must be a JSON object")
            params.update(body)
        else:
            form = await request.post()
            params.update({key: value for key, value in form.items() if isinstance(value, str)})
    return params


def _update_id(update: Json) -> int:
    return int(update["update_id"])


def _int(value: object) -> int | None:
    if value is None or value == "":
        return None
    if isinstance(value, int):
        return value
    try:
        return int(str(value))
    except ValueError:
        raise _ApiError(400, "Bad Request: invalid integer parameter") from None


def _json(value: object) -> Any:
    """A parameter that PTB JSON-encodes in form posts (objects, arrays) or a JSON value."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            raise _ApiError(400, "Bad Request: can't parse JSON parameter") from None
    return value


def update_payload(update: Mapping[str, Any]) -> bytes:
    """An update as the body Telegram posts to a webhook."""
    return json.dumps(update).encode()
