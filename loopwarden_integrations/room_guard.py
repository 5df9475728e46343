"""RoomGuard: the gateway's bot-loop and silence decisions for a bot loopwarden does not host.

A bot written with discord.py, python-telegram-bot, aiogram or slack-bolt asks
`admit(room, sender_id, sender_is_bot, ...)` before it handles a message and passes what
it posts through `outgoing(room, text)`. The decisions are the pipeline's, taken on the
same `StateStore` (built by `gateway.state.factory.build_state`), in the pipeline's order:

- self: a message whose sender id is `bot_id` is refused (`self`), counted nowhere.
- duplicate: with a `message_id`, a second admission of the same message by this bot is
  refused (`duplicate`), through `state.claim`: a platform's redelivery is charged once.
- bot turns, respond_to, bot loop and notice: the pipeline's own steps, called in the
  pipeline's order with the same arguments, so the decision is written once and a guarded
  bot is cut where a hosted one is (tests/integrations/test_room_guard_conformance.py
  holds the two to each other on every backend):
  `gateway.app.middlewares.bot_loop.count_bot_turn` (the `bot_turns` stage: a human
  message resets the count even when it is turned away), `turned_away` (the admission
  stage's `respond_to` rule), `decide_bot_message` (the `bot_loop` stage: bot messages
  beyond `max_consecutive_bot_turns` are refused `bot_turn_cap` without charging the
  pair; otherwise `state.pair_decide` records the exchange between `bot_id` and the
  sender, and a message its pair admitted is charged to the room budget, whatever the
  pair, so a ring of three or more bots is cut as a pair is), and `claim_notice` with
  `notice_text`: the refusal that opens a cooldown (`budget_exceeded`,
  `room_budget_exceeded`) carries the notice to post, when `announce_cooldown` is on and
  the cooldown is longer than 0, and later refusals of it (`cooldown`, `room_cooldown`)
  are silent. The notice is claimed in state as the gateway claims it, so every bot
  process and gateway on one sqlite file or one Redis posts one notice per cooldown.
  In shadow mode (`bot_loop.mode: shadow`) the decision is taken the same way and the
  message is admitted anyway, with `shadow` set on what would have been refused.
- `outgoing` is the silence stage's `apply_silence` (reasoning blocks removed, NO_REPLY
  and narration become None), unless `silence.enabled` is false.

Decisions where DESIGN.md is silent:
- `bot_id` is the bot's platform user id (Discord user id, Telegram user id, Slack bot
  user `U…`), the id the gateway's pair keys and self filter use, so a gateway and guarded
  bots in one room on one Redis share budgets. Ids are compared exactly: a look-alike id
  is another sender.
- Rooms are the gateway's room keys (`discord:<channel>`, `telegram:<chat>`,
  `slack:<channel>`); the adapters build them.
- `state` is `memory` (this guard alone), `sqlite:///relative/path` or
  `sqlite:////absolute/path` (taken literally, no percent-decoding), or a `redis://`,
  `rediss://` or `unix://` URL (the gateway's Redis backend with its defaults: key prefix
  `lw:`, `on_error: allow`). Anything else is a `ConfigError` on `state` that never
  echoes the value (a URL may hold a password).
- `policy` is a `gateway.config.Policy` or a mapping shaped like the config file's
  `policy:` section, validated the same way (errors name `policy.<field>`). Pauses and
  runtime overrides set on a gateway are not read: the guard's policy is the one given.
- The notices name no admin command (a guarded bot has none): `notice_text` with no
  prefix, the gateway's text without its last sentence.
- Two faces: `await admit(...)` in async code, `admit_sync(...)` in threads (slack-bolt's
  `App`). The store lives on one event loop, its home: the loop of the first `admit`, or
  a private loop thread for the first `admit_sync`. Calls from other loops or threads are
  handed to the home loop; `admit_sync` on the home loop itself is a `RoomGuardError`
  (it would wait on itself forever).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import TypeVar

from pydantic import SecretStr, ValidationError

from gateway.app.errors import ConfigError, LoopwardenError
from gateway.app.middlewares.admission import turned_away
from gateway.app.middlewares.bot_loop import (
    claim_notice,
    count_bot_turn,
    decide_bot_message,
    notice_text,
)
from gateway.app.types import InboundMessage
from gateway.config import Policy, StateConfig, first_error
from gateway.state.base import StateStore
from gateway.state.factory import build_state
from guards.silence import apply_silence

log = logging.getLogger("loopwarden.integrations")

T = TypeVar("T")

# How long a message id is remembered for `duplicate`: the gateway's dedupe default.
DUPLICATE_TTL = 600.0
_STATE_FORMS = "must be 'memory', 'sqlite:///path/to/file' or a 'redis://host:port/db' URL"
_SQLITE = "sqlite:///"
_REDIS_SCHEMES = ("redis://", "rediss://", "unix://")
# A Python caller can hand the policy any int; the Redis backend's Lua script reads numbers
# as doubles (a 5,000-digit one cannot even be written out), so counts stay below 2**53.
_COUNTS = ("max_events_per_window", "max_consecutive_bot_turns", "room_max_events_per_window")
_MAX_COUNT = 2**53


class RoomGuardError(LoopwardenError):
    """A RoomGuard used in a way it cannot serve (a closed home loop, sync on its own loop)."""


@dataclass(frozen=True, slots=True)
class Decision:
    """The verdict on one inbound message, and the cooldown notice to post once, if any.

    `reason`: `ok`, `disabled` (bot loop guard off), `self`, `duplicate`, `humans_off`,
    `bots_off`, `not_addressed`, `bot_turn_cap`, `budget_exceeded`, `cooldown`,
    `room_budget_exceeded` or `room_cooldown`.
    `count` is the pair's events in the window (the bot-turn count for `bot_turn_cap`, the
    room's bot messages in its window for the room budget's);
    `retry_after` the cooldown seconds left. `shadow` is True when shadow mode admitted a
    message enforce would have refused (`reason` says why).
    """

    allowed: bool
    reason: str
    retry_after: float = 0.0
    count: int = 0
    notice: str | None = None
    shadow: bool = False


_SELF = Decision(False, "self")
_DUPLICATE = Decision(False, "duplicate")
_HUMAN = Decision(True, "ok")
_DISABLED = Decision(True, "disabled")


class RoomGuard:
    """Admits inbound messages and filters outgoing ones for one bot, on a shared StateStore."""

    def __init__(
        self,
        policy: Policy | Mapping[str, object] | None = None,
        state: str = "memory",
        *,
        bot_id: str,
        bot_name: str | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        if not isinstance(bot_id, str) or not bot_id:
            raise ConfigError("bot_id", "must be the bot's platform user id, a non-empty string")
        self.bot_id = bot_id
        self.bot_name = bot_name or bot_id
        self.policy = _policy(policy)
        settings = self.policy.bot_loop
        self._settings = settings
        self._pair_policy = settings.guard_policy()
        self._shadow = settings.mode == "shadow"
        self._silence = self.policy.silence.guard_policy()
        self._state = build_state(state_config(state), clock=clock)
        self._home: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._starting: asyncio.Task[None] | None = None
        self._started = False
        self._lock = threading.Lock()

    @property
    def state(self) -> StateStore:
        """The StateStore the decisions are kept in (the gateway's own backends)."""
        return self._state

    async def __aenter__(self) -> RoomGuard:
        await self._call(self._ready())
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def admit(
        self,
        room: str,
        sender_id: str,
        sender_is_bot: bool,
        *,
        mentions_bot: bool = False,
        reply_to_bot: bool = False,
        is_direct: bool = False,
        message_id: str | None = None,
        sender_name: str | None = None,
    ) -> Decision:
        """Decide one inbound message of `room`: answer it, or ignore it (and maybe notice)."""
        if sender_id == self.bot_id:
            return _SELF
        return await self._call(
            self._admit(
                room,
                sender_id,
                sender_is_bot,
                mentions_bot=mentions_bot,
                reply_to_bot=reply_to_bot,
                is_direct=is_direct,
                message_id=message_id,
                sender_name=sender_name,
            )
        )

    def admit_sync(
        self,
        room: str,
        sender_id: str,
        sender_is_bot: bool,
        *,
        mentions_bot: bool = False,
        reply_to_bot: bool = False,
        is_direct: bool = False,
        message_id: str | None = None,
        sender_name: str | None = None,
    ) -> Decision:
        """`admit` for threaded code (slack-bolt's `App`): runs on the guard's home loop."""
        if sender_id == self.bot_id:
            return _SELF
        return self._run_sync(
            self._admit(
                room,
                sender_id,
                sender_is_bot,
                mentions_bot=mentions_bot,
                reply_to_bot=reply_to_bot,
                is_direct=is_direct,
                message_id=message_id,
                sender_name=sender_name,
            )
        )

    def outgoing(self, room: str, text: str) -> str | None:
        """The text to post in `room`, or None to post nothing (silence, reasoning removed)."""
        if not self.policy.silence.enabled:
            return text
        kept = apply_silence(text, self._silence)
        if kept is None:
            log.debug("bot %s: silence in %s, nothing posted", self.bot_id, room)
        return kept

    async def aclose(self) -> None:
        """Close the state store (and the private loop thread, when the sync face made one)."""
        home = self._home
        if home is None:
            return
        if self._thread is None:
            if home is asyncio.get_running_loop():
                await self._close_store()
                return
            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self._close_store(), home))
            return
        await asyncio.get_running_loop().run_in_executor(None, self.close)

    def close(self) -> None:
        """Close from threaded code; the sync face's counterpart of `aclose`."""
        home, thread = self._home, self._thread
        if home is None or home.is_closed():
            return
        self._run_sync(self._close_store())
        if thread is not None:
            home.call_soon_threadsafe(home.stop)
            thread.join()
            home.close()

    async def _admit(
        self,
        room: str,
        sender_id: str,
        sender_is_bot: bool,
        *,
        mentions_bot: bool,
        reply_to_bot: bool,
        is_direct: bool,
        message_id: str | None,
        sender_name: str | None,
    ) -> Decision:
        """`admit`'s steps, on the home loop."""
        await self._ready()
        state = self._state
        message_key = None if message_id is None else f"{room}:{message_id}"
        if message_key is not None and not await state.claim(
            f"room-guard:{self.bot_id}:{message_key}", DUPLICATE_TTL
        ):
            return _DUPLICATE
        settings = self._settings
        turns = await count_bot_turn(
            state, settings, room, is_bot=sender_is_bot, message_key=message_key
        )
        refusal = turned_away(
            self.policy.respond_to,
            sender_is_bot=sender_is_bot,
            mentions_bot=mentions_bot,
            reply_to_bot=reply_to_bot,
            is_direct=is_direct,
        )
        if refusal is not None:
            return Decision(False, refusal[0])
        if not sender_is_bot:
            return _HUMAN
        if not settings.enabled:
            return _DISABLED
        name = sender_name or sender_id
        verdict = await decide_bot_message(
            state,
            settings,
            self._pair_policy,
            room=room,
            self_bot_id=self.bot_id,
            sender_id=sender_id,
            sender_name=name,
            message_key=message_key,
            turns=turns,
        )
        if verdict.allowed:
            return Decision(True, verdict.reason, count=verdict.count)
        if self._shadow:
            return Decision(True, verdict.reason, verdict.retry_after, verdict.count, shadow=True)
        notice = None
        if await claim_notice(
            state, settings, verdict, room=room, self_bot_id=self.bot_id, sender_id=sender_id
        ):
            notice = notice_text(
                settings, verdict, bot_name=self.bot_name, sender_name=name, prefix=None
            )
        return Decision(False, verdict.reason, verdict.retry_after, verdict.count, notice)

    async def _ready(self) -> None:
        """Start the store once, on the home loop; every caller waits for the same start."""
        if self._started:
            return
        if self._starting is None:
            self._starting = asyncio.ensure_future(self._state.start())
        await self._starting
        self._started = True

    async def _close_store(self) -> None:
        """Close the store if it was started (on the home loop)."""
        if self._starting is not None:
            await self._starting
            self._starting = None
            self._started = False
            await self._state.aclose()

    async def _call(self, coro: Coroutine[None, None, T]) -> T:
        """Await `coro` on the home loop: here when this loop is home, else handed over."""
        running = asyncio.get_running_loop()
        home = self._home
        if home is None:
            with self._lock:
                if self._home is None:
                    self._home = running
                home = self._home
        if home is running:
            return await coro
        if home.is_closed():
            coro.close()
            raise RoomGuardError(_CLOSED_HOME)
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, home))

    def _run_sync(self, coro: Coroutine[None, None, T]) -> T:
        """Run `coro` on the home loop and wait for it from this thread."""
        home = self._sync_home()
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is home or home.is_closed():
            coro.close()
            raise RoomGuardError(
                _CLOSED_HOME
                if home.is_closed()
                else "admit_sync was called on the event loop this guard runs on; "
                "use `await guard.admit(...)` there"
            )
        future: concurrent.futures.Future[T] = asyncio.run_coroutine_threadsafe(coro, home)
        return future.result()

    def _sync_home(self) -> asyncio.AbstractEventLoop:
        """The home loop; a private loop thread when the sync face is the first to ask."""
        with self._lock:
            if self._home is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=loop.run_forever,
                    name=f"loopwarden-room-guard-{self.bot_id}",
                    daemon=True,
                )
                thread.start()
                self._home, self._thread = loop, thread
            return self._home


_CLOSED_HOME = (
    "the event loop this RoomGuard started on has closed; make one RoomGuard per event loop"
)


async def admit_inbound(guard: RoomGuard, msg: InboundMessage) -> Decision:
    """`guard.admit` of a message the gateway's platform translators produced (the adapters)."""
    return await guard.admit(
        msg.room,
        msg.sender_id,
        msg.sender_is_bot,
        mentions_bot=msg.mentions_bot,
        reply_to_bot=msg.reply_to_bot,
        is_direct=msg.is_direct,
        message_id=msg.message_id,
        sender_name=msg.sender_name,
    )


def wrong_bot_id(guard: RoomGuard, user_id: str, platform: str) -> ConfigError | None:
    """The error when the guard holds another id than the bot's platform user id, else None.

    The adapters log it and ignore the message (fail closed): with the wrong id the self
    filter and the pair keys would be wrong, and a gateway sharing the state would disagree.
    """
    if user_id == guard.bot_id:
        return None
    return ConfigError(
        "bot_id",
        f"the guard's bot_id is {guard.bot_id!r} but this bot's {platform} user id is "
        f"{user_id!r}; give RoomGuard the bot's user id",
    )


def admit_inbound_sync(guard: RoomGuard, msg: InboundMessage) -> Decision:
    """`admit_inbound` through the guard's sync face (slack-bolt's `App`)."""
    return guard.admit_sync(
        msg.room,
        msg.sender_id,
        msg.sender_is_bot,
        mentions_bot=msg.mentions_bot,
        reply_to_bot=msg.reply_to_bot,
        is_direct=msg.is_direct,
        message_id=msg.message_id,
        sender_name=msg.sender_name,
    )


def state_config(state: object) -> StateConfig:
    """The StateConfig of a `state=` argument, or a ConfigError on `state` naming the forms."""
    if not isinstance(state, str):
        raise ConfigError("state", f"{_STATE_FORMS}, got a {type(state).__name__}")
    if state == "memory":
        return StateConfig()
    if state.startswith(_SQLITE):
        path = state[len(_SQLITE) :]
        if not path or "\x00" in path or not _encodable(path):
            raise ConfigError(
                "state",
                "a sqlite state needs a file path after sqlite:/// (sqlite:///bots.sqlite3, "
                "or sqlite:////var/lib/bots.sqlite3 for an absolute path), without NUL bytes "
                "or undecodable characters",
            )
        return StateConfig(backend="sqlite", path=path)
    if state.startswith(_REDIS_SCHEMES):
        return StateConfig(backend="redis", url=SecretStr(state))
    scheme, sep, _ = state.partition(":")
    seen = f"one starting {scheme[:16]!r}:" if sep and scheme.isascii() else "something else"
    raise ConfigError("state", f"{_STATE_FORMS}, got {seen}")


def _encodable(text: str) -> bool:
    """True when `text` is valid Unicode (no lone surrogates from undecodable bytes)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _policy(policy: object) -> Policy:
    """The guard's Policy, validated like the config file's `policy:` section."""
    if policy is None:
        return Policy()
    if isinstance(policy, Policy):
        return policy
    if not isinstance(policy, Mapping):
        raise ConfigError(
            "policy",
            "must be a mapping shaped like the config file's policy: section "
            f"(or a gateway.config.Policy), got a {type(policy).__name__}",
        )
    try:
        validated = Policy.model_validate(policy)
    except ValidationError as exc:
        path, reason = first_error(exc)
        raise ConfigError(f"policy.{path}", reason) from None
    except ValueError as exc:  # pydantic lets Python's int size limit through as it is
        raise ConfigError("policy", f"holds a value that cannot be read ({exc})") from None
    for field in _COUNTS:
        if getattr(validated.bot_loop, field) > _MAX_COUNT:
            raise ConfigError(
                f"policy.bot_loop.{field}",
                f"must be at most {_MAX_COUNT} (2**53, what Redis' Lua counts exactly)",
            )
    return validated
