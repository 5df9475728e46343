"""The Telegram connector: PTB's `Bot` for the Bot API, our own getUpdates loop, a webhook.

Composition, not inheritance: a `telegram.Bot` does the HTTP and typing of the Bot API,
`connectors.telegram.inbound` translates updates, and this class only wires the two to the
gateway's sink. PTB's Application/Updater are not used: they confirm an update's offset
before it is handled, and this connector confirms it only after the sink returned.

Decisions where DESIGN.md is silent:
- Polling fetches a batch with our own getUpdates call (raw JSON, so one malformed update
  is dropped alone instead of failing the whole batch forever). Updates of different chats
  in a batch are handled concurrently, those of one chat in order (`connectors.lanes`,
  joined once per batch); the next getUpdates, which confirms the batch, is sent only
  once every update of it was handed over and its sink call returned (or it was
  deliberately dropped). `aclose` confirms what was handled. When the sink raises, that
  update and the rest of its chat stay unconfirmed and are fetched again after a short
  wait; after `MAX_SINK_ATTEMPTS` (5) failures the update is dropped (`sink_error`) and
  logged, so one poisonous update cannot stall a chat forever. An update the gateway
  refuses because it is stopping (`GatewayStopping`) is no failure: polling ends there,
  and the update stays unconfirmed for the next run to answer.
- A failing getUpdates (dropped connection, 5xx, 409 conflict, a refused token, any other
  error) marks the bot disconnected (`/readyz` 503) and is retried with doubling delays
  (`gateway.app.backoff`); `RetryAfter` waits as told. Nothing ends the loop but `aclose`
  and a stopping gateway.
- Webhook mode registers `/telegram/{bot_id}`; a request without the right
  `X-Telegram-Bot-Api-Secret-Token` gets 401 (counted as `unauthorized`), one while the
  bot is not running 503, a body over `MAX_BODY_BYTES` (1 MiB) 413 (`too_large`), a body
  `gateway.app.jsonbody.parse_json` refuses (not JSON, not UTF-8, nested deeper than 64, a
  5,000-digit number…) 400, an update that could not be handed to the pipeline 500
  (Telegram redelivers it; dedupe answers once), anything else 200: also JSON that is not
  an update object, or one whose fields have the wrong types, which is dropped and counted
  (`malformed`), since Telegram would redeliver it forever. With `webhook_url` set,
  `start` registers it with `setWebhook`; without it the webhook is assumed to be
  registered by the operator. `aclose` leaves the webhook set, so Telegram queues updates
  while the gateway restarts.
- Replies are translated by the pure `outbound` module. A send that fails with
  `RetryAfter` (429) raises `DeliveryError(retryable=True, retry_after=…)`, as does a
  failure to connect (nothing was sent). Any other failure, a timeout included (the
  message may have been posted), is not retryable: a reply is posted at most once.
- Streamed replies (`Capabilities.edits`): `edit` is one `editMessageText`; a 429 is
  retryable as for a send, and an edit Telegram refuses because the message already
  reads so ("message is not modified") is done. Other bots of the process are offered
  the message as first posted, not its edits.
- "typing…" is shown only when the reply takes longer than `typing_delay` (1 s) and no
  message was posted into the chat meanwhile: a quick answer needs no indicator, and the
  saved sendChatAction calls count against the bot's Bot API rate limits.
- Hosted bots feed each other (Telegram never delivers a bot's message to another bot):
  each message a bot posts into a group is offered to every other hosted Telegram bot of
  the process that has seen that group (received an update from it), as a bot-authored
  inbound message with event id `peer:<chat id>:<sender user id>:<message id>` (message
  ids are only unique within a chat). The bots meet on the gateway's `PeerBus` (each
  subscribes while it runs); the receiving bot hands peer messages over on lanes of its
  own, in order per chat (at most 1,000 waiting per chat, 10,000 in all: more are dropped
  as `queue_full`; one the pipeline fails on is dropped as `sink_error`).
"""

from __future__ import annotations

import hmac
import json
import logging
import math
from collections import Counter
from collections.abc import Mapping
from urllib.parse import urlencode

from aiohttp import web
from telegram import Bot, Message
from telegram.error import (
    BadRequest,
    Conflict,
    InvalidToken,
    NetworkError,
    RetryAfter,
    TelegramError,
)
from telegram.request import HTTPXRequest

from connectors.lanes import Lanes
from connectors.runtime import ConnectorRuntime, Outcome
from connectors.skips import Skip
from connectors.tasks import BackgroundTasks
from connectors.telegram.inbound import (
    PLATFORM,
    BotIdentity,
    is_group,
    parse_update,
    translate_message,
    translate_peer,
)
from connectors.telegram.outbound import (
    not_modified,
    nothing_sent,
    retry_after_seconds,
    to_chat_action,
    to_edit_message_text,
    to_send_message,
)
from connectors.timing import Timing
from gateway.app.connector import Capabilities, ConnectorServices, Sink
from gateway.app.errors import ConnectorError, DeliveryError
from gateway.app.jsonbody import JsonBodyError, parse_json, read_body
from gateway.app.types import InboundMessage, Reply
from gateway.config import TelegramBotConfig

log = logging.getLogger(__name__)

SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"
ALLOWED_UPDATES = ("message",)
MAX_MESSAGE_LENGTH = 4096
MAX_BODY_BYTES = 1024 * 1024
BATCH_LIMIT = 100
TIMING = Timing(retry_delays=(0.5, 30.0), typing_delay=1.0)
MAX_SINK_ATTEMPTS = 5


class TelegramConnector:
    """One hosted Telegram bot: long polling or webhook in, sendMessage out."""

    name = PLATFORM
    # Telegram counts a message's length in UTF-16 code units (an emoji counts twice).
    capabilities = Capabilities(
        max_message_length=MAX_MESSAGE_LENGTH,
        threads=True,
        knows_bots=True,
        typing=True,
        length_unit="utf16",
        edits=True,
    )

    def __init__(
        self, config: TelegramBotConfig, services: ConnectorServices, *, timing: Timing = TIMING
    ) -> None:
        self.bot_id = config.id
        self._config = config
        self._token = config.token.get_secret_value()
        secret = config.webhook_secret
        self._runtime = ConnectorRuntime(
            PLATFORM,
            config.id,
            services,
            log=log,
            secrets=(self._token, secret.get_secret_value() if secret else ""),
        )
        self.dropped = self._runtime.dropped
        self._peers = services.peers
        self._timing = timing
        self._backoff = timing.backoff()
        self._posts: dict[str, int] = {}
        self._root = config.api_base_url.rstrip("/")
        self._bot: Bot | None = None
        self._poller: HTTPXRequest | None = None
        self._identity: BotIdentity | None = None
        self._connected = False
        self._closing = False
        self._refused = False  # the gateway said it is stopping: take nothing more
        self._offset: int | None = None
        self._group_chats: set[int] = set()
        self._sink_failures: Counter[int] = Counter()
        # The batch being handed over: its chats' lanes, the update ids handed over or
        # dropped, and the chats stopped at an update the sink did not take.
        self._batch: Lanes[tuple[int | None, InboundMessage]] = Lanes(self._handle_update)
        self._handled: set[int] = set()
        self._stalled: set[str] = set()
        self._peer_lanes: Lanes[InboundMessage] = Lanes(self._runtime.hand_over)
        self._tasks = BackgroundTasks()
        if config.mode == "webhook":
            services.http.router.add_post(f"/telegram/{config.id}", self.handle_webhook)

    @property
    def connected(self) -> bool:
        """True while the Bot API answers (polling) or once the webhook is registered."""
        return self._connected

    @property
    def bot_user_id(self) -> str:
        """The bot's Telegram user id ("" before `start`)."""
        return str(self._identity.user_id) if self._identity else ""

    # ------------------------------------------------------------------- lifecycle

    async def start(self, sink: Sink) -> None:
        """Check the token (getMe), set up polling or the webhook, start the workers."""
        self._closing = False
        self._refused = False
        poller = HTTPXRequest(connection_pool_size=1)
        bot = Bot(
            self._token,
            base_url=f"{self._root}/bot",
            base_file_url=f"{self._root}/file/bot",
            get_updates_request=poller,
        )
        ready = False
        try:
            await bot.initialize()
            me = bot.bot
            if self._config.mode == "polling":
                await bot.delete_webhook()
            elif self._config.webhook_url:
                secret = self._config.webhook_secret
                await bot.set_webhook(
                    self._config.webhook_url,
                    secret_token=secret.get_secret_value() if secret else None,
                    allowed_updates=ALLOWED_UPDATES,
                )
            ready = True
        except InvalidToken:
            raise ConnectorError(
                PLATFORM, f"bot {self.bot_id}: the Bot API refused the token"
            ) from None
        except TelegramError as exc:
            raise ConnectorError(
                PLATFORM, f"bot {self.bot_id}: start failed: {self._runtime.describe(exc)}"
            ) from None
        finally:
            if not ready:  # also when the runtime's connect timeout cancels us
                await bot.shutdown()
        self._bot, self._poller, self._runtime.sink = bot, poller, sink
        self._identity = BotIdentity(
            bot_id=self.bot_id,
            user_id=me.id,
            username=me.username or "",
            reads_all_group_messages=bool(me.can_read_all_group_messages),
        )
        self._peers.subscribe(PLATFORM, self)
        if self._config.mode == "polling":
            self._tasks.spawn(self._poll_forever())
        self._connected = True
        log.info("telegram bot %s started as @%s (%s)", self.bot_id, me.username, self._config.mode)

    async def aclose(self) -> None:
        """Stop polling and the peer worker, confirm handled updates, release the HTTP pool."""
        self._closing = True
        self._connected = False
        self._peers.unsubscribe(PLATFORM, self)
        await self._tasks.cancel()
        await self._peer_lanes.aclose()
        self._runtime.sink = None
        bot, self._bot = self._bot, None
        if bot is None:
            return
        if self._config.mode == "polling" and self._offset is not None:
            await self._confirm_offset()
        await bot.shutdown()

    # --------------------------------------------------------------------- polling

    async def _poll_forever(self) -> None:
        """Fetch batches of updates and hand them over until closed; never raises."""
        self._backoff.reset()
        while not self._closing:
            try:
                batch = await self._fetch_updates()
            except RetryAfter as exc:
                wait = retry_after_seconds(exc)
                log.warning("telegram bot %s: getUpdates rate limited for %.0fs", self.bot_id, wait)
                await self._timing.sleep(wait)
                continue
            except Exception as exc:  # whatever went wrong, polling goes on after a pause
                self._connected = False
                level = (
                    logging.ERROR if isinstance(exc, InvalidToken | Conflict) else logging.WARNING
                )
                log.log(
                    level,
                    "telegram bot %s: getUpdates failed (%s); retrying in %.1fs",
                    self.bot_id,
                    self._runtime.describe(exc),
                    self._backoff.delay,
                )
                await self._backoff.wait()
                continue
            if not self._connected:
                log.info("telegram bot %s: polling again", self.bot_id)
            self._connected = True
            self._backoff.reset()
            if batch:
                log.debug("telegram bot %s: getUpdates gave %d update(s)", self.bot_id, len(batch))
                if not await self._handle_batch(batch):
                    if self._refused:
                        log.info(
                            "telegram bot %s: the gateway is stopping, polling ends", self.bot_id
                        )
                        return
                    # Not a hot loop while the pipeline refuses.
                    await self._timing.sleep(self._backoff.first)
            elif self._config.poll_timeout <= 0:
                await self._timing.sleep(self._backoff.first)

    async def _fetch_updates(self) -> list[object]:
        """One raw getUpdates call: the JSON objects, each parsed later on its own."""
        poller = self._poller
        if poller is None:
            raise ValueError("not started")
        params: dict[str, str | int] = {
            "timeout": math.ceil(self._config.poll_timeout),
            "limit": BATCH_LIMIT,
            "allowed_updates": json.dumps(ALLOWED_UPDATES),
        }
        if self._offset is not None:
            params["offset"] = self._offset
        result = await poller.post(
            f"{self._root}/bot{self._token}/getUpdates?{urlencode(params)}",
            read_timeout=self._config.poll_timeout + 10.0,
        )
        if not isinstance(result, list):
            raise TypeError("getUpdates answered something other than a list")
        return list(result)

    async def _handle_batch(self, batch: list[object]) -> bool:
        """Hand a batch over (chats concurrently, each chat in order), then move the offset.

        The offset moves past the longest run of updates that were handed over or dropped,
        also when the batch is cut short by `aclose`, so only unhandled updates come again.
        False when an update was not taken by the sink (it comes again with the next fetch).
        """
        ids = sorted({i for i in map(_update_id, batch) if i is not None})
        self._handled.clear()
        self._stalled.clear()
        try:
            for raw in batch:
                update_id = _update_id(raw)
                message = self._prepare(raw)
                if message is not None:
                    # A batch (at most BATCH_LIMIT) always fits the lanes.
                    self._batch.put(message.channel_id, (update_id, message))
                elif update_id is not None:
                    self._handled.add(update_id)
            await self._batch.join()
        finally:
            await self._batch.aclose()
            first_open = next((i for i in ids if i not in self._handled), None)
            if first_open is not None:
                self._offset = first_open
            elif ids:
                self._offset = ids[-1] + 1
        return first_open is None

    async def _handle_update(self, item: tuple[int | None, InboundMessage]) -> None:
        """Hand one update of the batch over, unless its chat stopped at an earlier one."""
        update_id, message = item
        if message.channel_id in self._stalled:
            return
        outcome = await self._runtime.offer(message)
        if outcome is Outcome.REFUSED:
            self._refused = True
        failed = outcome is Outcome.FAILED and not self._refused
        if outcome is Outcome.TAKEN or (failed and self._give_up(update_id)):
            if update_id is not None:
                self._handled.add(update_id)
        else:
            self._stalled.add(message.channel_id)

    def _give_up(self, update_id: int | None) -> bool:
        """True once an update failed in the sink `MAX_SINK_ATTEMPTS` times (then dropped)."""
        if update_id is None:
            return True
        self._sink_failures[update_id] += 1
        if self._sink_failures[update_id] < MAX_SINK_ATTEMPTS:
            return False
        del self._sink_failures[update_id]
        self._runtime.drop(Skip.SINK_ERROR, f"update {update_id}")
        log.error(
            "telegram bot %s: update %s dropped after %d failed hand-overs",
            self.bot_id,
            update_id,
            MAX_SINK_ATTEMPTS,
        )
        return True

    async def _confirm_offset(self) -> None:
        """Tell Telegram what was handled, so a restart does not see it again."""
        poller = self._poller
        if poller is None:
            return
        query = urlencode({"offset": self._offset, "limit": 1, "timeout": 0})
        try:
            await poller.post(f"{self._root}/bot{self._token}/getUpdates?{query}", read_timeout=2.0)
        except TelegramError as exc:
            log.warning(
                "telegram bot %s: could not confirm handled updates (%s)",
                self.bot_id,
                self._runtime.describe(exc),
            )

    # --------------------------------------------------------------------- webhook

    async def handle_webhook(self, request: web.Request) -> web.Response:
        """`POST /telegram/{bot_id}`: verify the secret token, hand the update over."""
        secret = self._config.webhook_secret
        presented = request.headers.get(SECRET_HEADER, "")
        if secret is None or not hmac.compare_digest(
            presented.encode(), secret.get_secret_value().encode()
        ):
            self._runtime.drop(Skip.UNAUTHORIZED, "a webhook request")
            log.warning("telegram bot %s: webhook request with a bad secret token", self.bot_id)
            return web.Response(status=401, text="unauthorized")
        if self._runtime.sink is None or self._closing:
            return web.Response(status=503, text="not ready")
        body = await read_body(request, MAX_BODY_BYTES)
        if body is None:
            self._runtime.drop(Skip.TOO_LARGE, "a webhook body")
            return web.Response(status=413, text=f"the body is larger than {MAX_BODY_BYTES} bytes")
        try:
            raw = parse_json(body)
        except JsonBodyError as exc:
            self._runtime.drop(Skip.MALFORMED, "a webhook body")
            return web.Response(status=400, text=f"the body must be a JSON update: {exc}")
        message = self._prepare(raw)
        if message is not None and await self._runtime.offer(message) is not Outcome.TAKEN:
            return web.Response(status=500, text="not handled")
        return web.Response(text="ok")

    # ------------------------------------------------------------------ inbound

    def _prepare(self, raw: object) -> InboundMessage | None:
        """Translate one raw update, noting group membership; None (counted) when dropped."""
        identity = self._identity
        if identity is None:
            return None
        update = parse_update(raw)
        if isinstance(update, Skip):
            self._runtime.drop(update, f"update {_update_id(raw)}")
            return None
        message = update.message
        if message is None:
            self._runtime.drop(Skip.UNSUPPORTED, f"update {update.update_id}")
            return None

        def translate() -> InboundMessage | Skip:
            self._note_chat(message, identity)
            return translate_message(
                message,
                bot=identity,
                event_id=str(update.update_id),
                received_at=self._timing.clock(),
            )

        return self._runtime.accept(translate, f"update {update.update_id}")

    def _note_chat(self, message: Message, identity: BotIdentity) -> None:
        """Remember the groups this bot is in (peers feed it only those)."""
        if not is_group(message):
            return
        left = message.left_chat_member
        if left is not None and left.id == identity.user_id:
            self._group_chats.discard(message.chat.id)
        else:
            self._group_chats.add(message.chat.id)

    # ----------------------------------------------------------------- peers

    def receive_peer(self, event: object) -> None:
        """Queue a message another hosted bot posted, if this bot is in that group."""
        identity = self._identity
        if (
            not isinstance(event, Message)
            or self._closing
            or identity is None
            or event.chat.id not in self._group_chats
        ):
            return
        message = self._runtime.accept(
            lambda: translate_peer(event, bot=identity, received_at=self._timing.clock()),
            f"peer message {event.message_id}",
        )
        if message is not None and not self._peer_lanes.put(message.channel_id, message):
            self._runtime.drop(Skip.QUEUE_FULL, f"peer message {message.message_id}")
            log.warning("telegram bot %s: too many peer messages waiting, one dropped", self.bot_id)

    def _offer_to_peers(self, message: Message) -> None:
        if not is_group(message):
            return
        self._group_chats.add(message.chat.id)
        self._peers.publish(PLATFORM, self, message)

    # ---------------------------------------------------------------- outbound

    async def send(self, channel_id: str, reply: Reply) -> str | None:
        """Post one chunk; a 429 raises a retryable DeliveryError with Telegram's wait."""
        bot = self._bot
        if bot is None:
            raise DeliveryError(f"telegram bot {self.bot_id}: not started", retryable=True)
        call = to_send_message(channel_id, reply)
        try:
            message = await bot.send_message(
                chat_id=call.chat_id,
                text=call.text,
                message_thread_id=call.message_thread_id,
                reply_parameters=call.reply_parameters,
            )
        except TelegramError as exc:
            raise self._delivery_error("sendMessage", exc) from None
        self._posts[channel_id] = self._posts.get(channel_id, 0) + 1
        self._offer_to_peers(message)
        return str(message.message_id)

    async def edit(self, channel_id: str, message_id: str, reply: Reply) -> None:
        """Give a posted message new text; a 429 raises a retryable DeliveryError."""
        bot = self._bot
        if bot is None:
            raise DeliveryError(f"telegram bot {self.bot_id}: not started", retryable=True)
        call = to_edit_message_text(channel_id, message_id, reply)
        try:
            await bot.edit_message_text(
                chat_id=call.chat_id, message_id=call.message_id, text=call.text
            )
        except TelegramError as exc:
            if not (isinstance(exc, BadRequest) and not_modified(exc)):
                raise self._delivery_error("editMessageText", exc) from None

    def _delivery_error(self, method: str, exc: TelegramError) -> DeliveryError:
        """The one mapping of a failed send or edit: 429 and nothing-sent are retryable.

        A 429 waits as Telegram says; any other failure may have posted, so is final.
        """
        if isinstance(exc, RetryAfter):
            return DeliveryError(
                f"telegram bot {self.bot_id}: rate limited",
                retryable=True,
                retry_after=retry_after_seconds(exc),
            )
        return DeliveryError(
            f"telegram bot {self.bot_id}: {method} failed: {self._runtime.describe(exc)}",
            retryable=isinstance(exc, NetworkError) and nothing_sent(exc),
        )

    async def typing(self, channel_id: str, thread_id: str | None) -> None:
        """Show "typing…" if no reply came within `typing_delay` (best effort, never raises)."""
        posted = self._posts.get(channel_id, 0)
        if self._timing.typing_delay > 0:
            await self._timing.sleep(self._timing.typing_delay)
        bot = self._bot
        if bot is None or self._closing or self._posts.get(channel_id, 0) != posted:
            return
        try:
            action = to_chat_action(channel_id, thread_id)
            await bot.send_chat_action(
                chat_id=action.chat_id,
                action=action.action,
                message_thread_id=action.message_thread_id,
            )
        except (TelegramError, DeliveryError) as exc:
            log.debug(
                "telegram bot %s: typing failed (%s)", self.bot_id, self._runtime.describe(exc)
            )


def _update_id(raw: object) -> int | None:
    value = raw.get("update_id") if isinstance(raw, Mapping) else None
    return value if isinstance(value, int) else None
