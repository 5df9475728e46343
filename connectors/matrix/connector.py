"""The Matrix connector: matrix-nio's AsyncClient syncs and sends, the runtime hands over.

Why matrix-nio (over mautrix): its error answers keep `retry_after_ms`, so a homeserver's
`M_LIMIT_EXCEEDED` reaches delivery as the wait it asked for (mautrix's errors drop it);
its client can be told never to retry a 429 or a timeout itself (`max_limit_exceeded=0`,
`max_timeouts=0`), so delivery alone decides; `room_send` takes our transaction id; and it
is maintained by the Matrix community, asyncio and aiohttp like the gateway. Its
end-to-end encryption is not used (`encryption_enabled=False`).

Composition, not inheritance: an `AsyncClient` does the HTTP of the client-server API,
`connectors.matrix.inbound` translates each timeline event's JSON (`event.source`), the
pure `connectors.matrix.outbound` builds what is sent, and this class wires them to the
gateway's sink through the connector runtime.

Decisions where DESIGN.md is silent:
- The sync position is one cursor in the state backend (`matrix:<bot id>`: the sync token
  and the time of the first sync), saved only once every event of a batch was handed
  over and its sink call returned, so a crash (SIGKILL included) syncs the batch again
  and the pipeline's dedupe answers each message once. Without a saved cursor the first
  sync only notes where "now" is: nothing before it is ever answered, and events that a
  later sync brings from before that time (the history of a room joined later) are
  dropped as `before_first_sync`.
- A sync asks for up to `timeline_limit` (`TIMELINE_LIMIT`) events a room, where
  Synapse's default is 10, and leaves out the bot's own events (`not_senders`): they are
  never answered, so a busy bot's replies fill neither a timeline nor a gap's pages. A
  room whose timeline is still `limited` (more events arrived while the gateway was down
  or busy) has its missed events paged back with `/messages` (`connectors.matrix.gap`):
  up to `gap_pages` (`GAP_PAGES`) pages of `timeline_limit` events, down to the previous
  sync position, handed over in order before the batch, each once. A gap still open after
  that (or one the homeserver refuses to page) is a warning and one `sync_gap` counted,
  and its older events are never answered; a connection failure while paging syncs the
  batch again after a pause.
- A batch is handed over room by room in order (`connectors.lanes`), rooms concurrently.
  A room's lane holds `timeline_limit` messages and all lanes 10,000; when they are full
  (a gap's pages before the batch, or many busy rooms) the connector waits for them to
  empty instead of dropping (`queue_full` is never counted here): the next sync is only
  asked for once the batch is handed over, so the homeserver holds the rest meanwhile, and
  the missed events of every limited room of one sync (at most `gap_pages` pages a room)
  are the most held at once. An event the pipeline fails on is dropped (`sink_error`);
  one refused because the gateway is stopping ends the sync loop without saving the
  position (the next run takes the batch again).
- An encrypted room (its `m.room.encryption` state in a sync, or found by asking the
  homeserver for that state the first time a room speaks) is refused: a warning the
  first time, and every message of it dropped and counted as `encrypted_room`.
- The bot does not join rooms by itself: invite it and join it with its account (the
  tutorial shows how), so nobody can make it spend by inviting it somewhere.
- A sync that fails (connection, 5xx, a refused token) marks the bot disconnected
  (`/readyz` 503) and is retried with doubling delays; `M_LIMIT_EXCEEDED` waits as told.
- `send` is one `PUT /send/m.room.message/{txn}` whose transaction id is derived from the
  event answered and the chunk (`outbound.transaction_id`): the homeserver refuses to post
  a transaction twice, so a retry after a timeout or a restart cannot duplicate a reply,
  and every failure of the connection (a timeout too) is retryable. `M_LIMIT_EXCEEDED`
  raises `DeliveryError(retryable=True, retry_after=retry_after_ms / 1000)`; other
  errors are final. Streamed replies edit with `m.replace` (`Capabilities.edits`).
- No typing notifications: Matrix bots rarely send them and they cost a request each.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import aiohttp
from nio import (
    AsyncClient,
    AsyncClientConfig,
    RoomGetStateEventError,
    RoomSendResponse,
    SyncResponse,
    WhoamiResponse,
)

from connectors.lanes import Lanes
from connectors.matrix.gap import Gap, fill_gap
from connectors.matrix.inbound import (
    ENCRYPTION,
    PLATFORM,
    BotIdentity,
    encryption_seen,
    member_names,
    translate_event,
)
from connectors.matrix.outbound import (
    LIMIT_EXCEEDED,
    errcode,
    retry_after,
    to_content,
    to_edit,
    transaction_id,
)
from connectors.runtime import ConnectorRuntime, Outcome
from connectors.skips import Skip
from connectors.tasks import BackgroundTasks
from connectors.timing import Timing
from gateway.app.connector import Capabilities, ConnectorServices, Sink
from gateway.app.errors import ConnectorError, DeliveryError
from gateway.app.types import InboundMessage, Reply
from gateway.config import MatrixBotConfig

log = logging.getLogger(__name__)

MAX_MESSAGE_LENGTH = 16_000
"""Well inside Synapse's 65,536-byte event limit for any UTF-8 text (4 bytes a character)."""
TIMING = Timing(retry_delays=(0.5, 30.0))
NOT_FOUND = "M_NOT_FOUND"
TIMELINE_LIMIT = 1000
"""Events a sync brings per room (and a gap's page holds); Synapse's default is 10."""
GAP_PAGES = 10
"""Pages of `/messages` that fill one room's sync gap, so 10,000 missed events a room."""


def sync_filter(timeline_limit: int, events: dict[str, Any] | None = None) -> dict[str, Any]:
    """A sync's filter: room timelines of up to `timeline_limit` events (those `events`
    lets through), no presence, receipts, typing or account data."""
    return {
        "presence": {"types": []},
        "account_data": {"types": []},
        "room": {
            "ephemeral": {"types": []},
            "account_data": {"types": []},
            "timeline": {"limit": timeline_limit, **(events or {})},
        },
    }


FIRST_SYNC_FILTER = sync_filter(1)
"""The first sync only notes where "now" is: one event a room is enough."""


class MatrixConnector:
    """One hosted Matrix user: `/sync` long polling in, `m.room.message` out."""

    name = PLATFORM
    capabilities = Capabilities(
        max_message_length=MAX_MESSAGE_LENGTH,
        threads=True,
        knows_bots=True,
        typing=False,
        edits=True,
    )

    def __init__(
        self,
        config: MatrixBotConfig,
        services: ConnectorServices,
        *,
        timing: Timing = TIMING,
        timeline_limit: int = TIMELINE_LIMIT,
        gap_pages: int = GAP_PAGES,
    ) -> None:
        self.bot_id = config.id
        self._config = config
        self._runtime = ConnectorRuntime(
            PLATFORM,
            config.id,
            services,
            log=log,
            secrets=[config.access_token.get_secret_value()],
        )
        self.dropped = self._runtime.dropped
        self._cursors = services.cursors
        self._cursor_key = f"{PLATFORM}:{config.id}"
        self._timing = timing
        self._timeline_limit = timeline_limit
        self._events_filter: dict[str, Any] = {"not_senders": [config.user_id]}
        self._sync_filter = sync_filter(timeline_limit, self._events_filter)
        self._gap_pages = gap_pages
        self._backoff = timing.backoff()
        self._identity = BotIdentity(config.id, config.user_id, config.bot_users)
        self._client: AsyncClient | None = None
        self._since: str | None = None
        self._since_ms = 0
        self._connected = False
        self._closing = False
        self._refused = False
        self._encrypted: dict[str, bool] = {}
        self._names: dict[str, dict[str, str]] = {}
        self._answering: dict[str, tuple[str, int]] = {}
        self._batch: Lanes[InboundMessage] = Lanes(self._hand_over, per_lane=timeline_limit)
        self._tasks = BackgroundTasks()

    @property
    def connected(self) -> bool:
        """True while the homeserver answers the sync."""
        return self._connected

    @property
    def bot_user_id(self) -> str:
        """The bot's Matrix user id (`@helper:example.org`)."""
        return self._config.user_id

    # ------------------------------------------------------------------- lifecycle

    async def start(self, sink: Sink) -> None:
        """Check the token (whoami), find the sync position, start syncing."""
        self._closing = self._refused = False
        client = AsyncClient(
            self._config.homeserver,
            self._config.user_id,
            config=AsyncClientConfig(
                max_limit_exceeded=0, max_timeouts=0, encryption_enabled=False
            ),
        )
        client.access_token = self._config.access_token.get_secret_value()
        ready = False
        try:
            await self._authenticate(client)
            await self._load_position(client)
            ready = True
        finally:
            if not ready:  # also when the runtime's connect timeout cancels us
                await client.close()
        self._client, self._runtime.sink = client, sink
        self._tasks.spawn(self._sync_forever())
        self._connected = True
        log.info("matrix bot %s started as %s", self.bot_id, self._config.user_id)

    async def _authenticate(self, client: AsyncClient) -> None:
        """whoami: the token must be this bot's user's, else a ConnectorError."""
        try:
            answer = await client.whoami()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ConnectorError(
                PLATFORM, f"bot {self.bot_id}: the homeserver did not answer ({type(exc).__name__})"
            ) from None
        if not isinstance(answer, WhoamiResponse):
            raise ConnectorError(
                PLATFORM,
                f"bot {self.bot_id}: the homeserver refused the access token ({errcode(answer)})",
            )
        if answer.user_id != self._config.user_id:
            raise ConnectorError(
                PLATFORM,
                f"bot {self.bot_id}: the access token is {answer.user_id}'s, "
                f"not user_id {self._config.user_id}'s",
            )
        client.user_id, client.device_id = answer.user_id, answer.device_id

    async def _load_position(self, client: AsyncClient) -> None:
        """The saved sync position, or a first sync that marks "now" (answering nothing)."""
        saved = await self._cursors.cursor_get(self._cursor_key) if self._cursors else None
        position = _parse_position(saved)
        if position is not None:
            self._since, self._since_ms = position
            return
        answer = await client.sync(timeout=0, sync_filter=FIRST_SYNC_FILTER)
        if not isinstance(answer, SyncResponse):
            raise ConnectorError(
                PLATFORM, f"bot {self.bot_id}: the first sync failed ({errcode(answer)})"
            )
        self._since, self._since_ms = answer.next_batch, int(self._timing.clock() * 1000)
        self._learn_rooms(answer)
        await self._save_position()

    async def aclose(self) -> None:
        """Stop syncing, let go of waiting hand-overs, close the HTTP session."""
        self._closing = True
        self._connected = False
        await self._tasks.cancel()
        await self._batch.aclose()
        self._runtime.sink = None
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    # --------------------------------------------------------------------- syncing

    async def _sync_forever(self) -> None:
        """Sync, hand each batch over, then save the position; until closed. Never raises."""
        self._backoff.reset()
        while not self._closing:
            client = self._client
            if client is None:
                return
            try:
                answer = await client.sync(
                    timeout=int(self._config.sync_timeout * 1000),
                    since=self._since,
                    sync_filter=self._sync_filter,
                )
                gaps = await self._fill_gaps(client, answer)
            except Exception as exc:  # whatever went wrong, syncing goes on after a pause
                await self._sync_failed(self._runtime.describe(exc))
                continue
            if not isinstance(answer, SyncResponse):
                if errcode(answer) == LIMIT_EXCEEDED:
                    await self._timing.sleep(retry_after(answer.retry_after_ms))
                else:
                    await self._sync_failed(errcode(answer))
                continue
            if not self._connected:
                log.info("matrix bot %s: syncing again", self.bot_id)
            self._connected = True
            self._backoff.reset()
            if not await self._handle_batch(answer, gaps):
                log.info("matrix bot %s: the gateway is stopping, syncing ends", self.bot_id)
                return
            self._since = answer.next_batch
            await self._save_position()

    async def _sync_failed(self, why: str) -> None:
        self._connected = False
        log.warning(
            "matrix bot %s: sync failed (%s); retrying in %.1fs",
            self.bot_id,
            why,
            self._backoff.delay,
        )
        await self._backoff.wait()

    async def _fill_gaps(self, client: AsyncClient, answer: object) -> dict[str, Gap]:
        """The missed events of each room of a sync whose timeline is `limited`, by room."""
        gaps: dict[str, Gap] = {}
        if not isinstance(answer, SyncResponse) or self._since is None:
            return gaps
        for room_id, info in answer.rooms.join.items():
            if not info.timeline.limited:
                continue
            gap = await fill_gap(
                client,
                room_id,
                info.timeline,
                since=self._since,
                since_ms=self._since_ms,
                page_size=self._timeline_limit,
                events_filter=self._events_filter,
                max_pages=self._gap_pages,
                sleep=self._timing.sleep,
            )
            if not gap.complete:
                log.warning(
                    "matrix bot %s: room %s missed more events than a sync brings; %d found "
                    "by paging back, older ones are not answered (%s)",
                    self.bot_id,
                    room_id,
                    len(gap.events),
                    gap.why,
                )
                self._runtime.drop(Skip.SYNC_GAP, f"the older events of room {room_id}")
            gaps[room_id] = gap
        return gaps

    async def _handle_batch(self, answer: SyncResponse, gaps: dict[str, Gap]) -> bool:
        """Hand a batch over, each room's missed events first; rooms concurrently, each in
        order. False when the gateway refused it (stopping)."""
        self._learn_rooms(answer)
        try:
            for room_id, info in answer.rooms.join.items():
                encrypted = await self._is_encrypted(room_id)
                missed = gaps[room_id].events if room_id in gaps else []
                for event in (*missed, *(e.source for e in info.timeline.events)):
                    message = self._translate(room_id, event, encrypted=encrypted)
                    if message is not None and not self._batch.put(room_id, message):
                        await self._batch.join()  # full: let the lanes empty, then queue
                        self._batch.put(room_id, message)
            await self._batch.join()
        finally:
            await self._batch.aclose()
        return not self._refused

    def _translate(self, room_id: str, event: object, *, encrypted: bool) -> InboundMessage | None:
        return self._runtime.accept(
            lambda: translate_event(
                event,
                room_id=room_id,
                bot=self._identity,
                since_ms=self._since_ms,
                encrypted=encrypted,
                names=self._names.get(room_id),
                received_at=self._timing.clock(),
            ),
            f"an event of room {room_id}",
        )

    async def _hand_over(self, message: InboundMessage) -> None:
        outcome = await self._runtime.offer(message)
        if outcome is Outcome.REFUSED:
            self._refused = True
        elif outcome is Outcome.FAILED:
            self._runtime.drop(Skip.SINK_ERROR, f"event {message.message_id}")

    def _learn_rooms(self, answer: SyncResponse) -> None:
        """Note each joined room's encryption and members' display names from a batch."""
        for room_id, info in answer.rooms.join.items():
            events = [e.source for e in (*info.state, *info.timeline.events)]
            if encryption_seen(events):
                self._refuse_room(room_id)
            names = member_names(events)
            if names:
                self._names.setdefault(room_id, {}).update(names)

    async def _is_encrypted(self, room_id: str) -> bool:
        """Whether a room is encrypted: known from a sync, else asked once (fail closed)."""
        known = self._encrypted.get(room_id)
        if known is not None:
            return known
        client = self._client
        if client is None:
            return True
        try:
            answer = await client.room_get_state_event(room_id, ENCRYPTION)
        except (aiohttp.ClientError, TimeoutError):
            return True
        if isinstance(answer, RoomGetStateEventError):
            if errcode(answer) != NOT_FOUND:
                return True
            self._encrypted[room_id] = False
            return False
        self._refuse_room(room_id)
        return True

    def _refuse_room(self, room_id: str) -> None:
        if self._encrypted.get(room_id):
            return
        self._encrypted[room_id] = True
        log.warning(
            "matrix bot %s: room %s is end-to-end encrypted; loopwarden answers in "
            "unencrypted rooms only, so its messages are dropped (encrypted_room)",
            self.bot_id,
            room_id,
        )

    async def _save_position(self) -> None:
        if self._cursors is None or self._since is None:
            return
        value = json.dumps({"since": self._since, "first_sync_ms": self._since_ms})
        try:
            await self._cursors.cursor_set(self._cursor_key, value)
        except Exception as exc:  # the batch comes again next run; dedupe answers it once
            log.warning(
                "matrix bot %s: could not save the sync position (%s)",
                self.bot_id,
                type(exc).__name__,
            )

    # --------------------------------------------------------------------- outbound

    async def send(self, channel_id: str, reply: Reply) -> str | None:
        """Post one chunk; `M_LIMIT_EXCEEDED` raises a retryable DeliveryError."""
        if reply.reply_to:
            self._answering[channel_id] = (reply.reply_to, 0)
        else:
            answered, chunk = self._answering.get(channel_id, ("", -1))
            self._answering[channel_id] = (answered, chunk + 1)
        answered, chunk = self._answering[channel_id]
        content = to_content(reply, msgtype=self._config.reply_msgtype)
        txn = transaction_id(self.bot_id, channel_id, answered, chunk, reply.text)
        return await self._put(channel_id, content, txn, "send")

    async def edit(self, channel_id: str, message_id: str, reply: Reply) -> None:
        """Make a posted message read the reply's text (`m.replace`)."""
        content = to_edit(message_id, reply, msgtype=self._config.reply_msgtype)
        txn = transaction_id(self.bot_id, channel_id, "edit", message_id, reply.text)
        await self._put(channel_id, content, txn, "edit")

    async def _put(self, room_id: str, content: dict[str, Any], txn: str, what: str) -> str:
        client = self._client
        where = f"matrix bot {self.bot_id}: {what}"
        if client is None:
            raise DeliveryError(f"{where}: not started", retryable=True)
        try:
            answer = await client.room_send(room_id, "m.room.message", content, tx_id=txn)
        except (aiohttp.ClientError, TimeoutError) as exc:
            # The transaction id makes a second attempt harmless, even after a timeout.
            raise DeliveryError(f"{where} failed ({type(exc).__name__})", retryable=True) from None
        if isinstance(answer, RoomSendResponse):
            return str(answer.event_id)
        if errcode(answer) == LIMIT_EXCEEDED:
            raise DeliveryError(
                f"{where} rate limited",
                retryable=True,
                retry_after=retry_after(answer.retry_after_ms),
            )
        raise DeliveryError(f"{where} failed ({errcode(answer)})")

    async def typing(self, channel_id: str, thread_id: str | None) -> None:
        """No typing notifications on Matrix (see the module docstring)."""


def _parse_position(saved: str | None) -> tuple[str, int] | None:
    """A saved cursor as (sync token, first sync in ms), None when absent or unreadable."""
    if saved is None:
        return None
    try:
        value = json.loads(saved)
    except ValueError:
        return None
    since = value.get("since") if isinstance(value, dict) else None
    first = value.get("first_sync_ms") if isinstance(value, dict) else None
    if not isinstance(since, str) or not isinstance(first, int):
        return None
    return since, first
