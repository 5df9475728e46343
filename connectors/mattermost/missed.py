"""Reading what a Mattermost bot missed while its websocket was down, bounded.

Mattermost does not replay to a new websocket what the old one missed, so after every
`hello` the connector runs `MissedPosts.read` before it reads a live event. It lists the
bot's channels (`GET /users/{id}/channels`); for each channel whose `last_post_at` is newer
than its position (`connectors.mattermost.cursors`), it asks for the posts changed since
(`GET /channels/{id}/posts?since=<ms>`) and feeds those created after the position, oldest
first, as `posted` events into the connector's inbound path (`connectors.mattermost.catchup`
reads the answers).

Decisions where DESIGN.md is silent:
- Bounded: the newest `CATCH_UP_POSTS` posts of a channel and the `CATCH_UP_CHANNELS` most
  recently active channels are read; each post or channel left out is logged and counted
  as `catch_up_limit` (the server itself answers at most 1,000 posts a channel).
- A 429 (after the wait it asks for, at most `MAX_RETRY_AFTER`), a 5xx or a failed
  connection (after doubling delays) is tried again, `CATCH_UP_ATTEMPTS` tries in all. A
  channel list or a channel that still cannot be read, or is not of the API's shape, is
  logged and the read is incomplete: the floor stays, and the channel is read again at the
  next reconnect, unless a live post there moved its position first (then what was
  posted while down there is not answered).
- A channel the read found posts in keeps its position (`ChannelCursors.hold`) before the
  floor moves, so a crash before those posts are handled reads them again.
- A channel whose `last_post_at` is the millisecond of its position is not read: a second
  post of that very millisecond, made while down and the channel's newest, is missed,
  where reading every channel at each reconnect would cost a request per channel.
- The ids in URLs are the server's own, checked to be Mattermost ids first.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

import aiohttp

from connectors.mattermost.catchup import (
    SINCE_LIMIT,
    ChannelInfo,
    Position,
    as_event,
    listed_posts,
    member_channels,
    new_posts,
)
from connectors.mattermost.cursors import ChannelCursors
from connectors.mattermost.inbound import MATTERMOST_ID
from connectors.mattermost.outbound import error_id, retry_after
from connectors.runtime import ConnectorRuntime
from connectors.skips import Skip
from connectors.timing import Timing

log = logging.getLogger(__name__)

CATCH_UP_POSTS = 500
"""Posts of one channel fed by a read, the newest; older ones are counted `catch_up_limit`."""
CATCH_UP_CHANNELS = 500
"""Channels read at once, the most recently active; the others count `catch_up_limit`."""
CATCH_UP_ATTEMPTS = 3
"""Tries of one request that may pass: a 429, a 5xx, a connection that failed."""
MAX_RETRY_AFTER = 60.0
"""The longest a read waits for a 429 before its next try (seconds)."""


@dataclass(frozen=True, slots=True)
class Answer:
    """One REST answer: its status, headers and JSON value (None when not JSON)."""

    status: int
    headers: Mapping[str, str]
    body: object


Get = Callable[[str], Awaitable[Answer | None]]
"""A GET of an API path; None when the connector has no session (it is closing)."""


class MissedPosts:
    """Feeds one bot's missed posts, channel by channel, into its inbound path."""

    def __init__(
        self,
        *,
        get: Get,
        cursors: ChannelCursors,
        runtime: ConnectorRuntime,
        feed: Callable[[Mapping[str, object]], None],
        timing: Timing,
        max_posts: int = CATCH_UP_POSTS,
        max_channels: int = CATCH_UP_CHANNELS,
    ) -> None:
        self._get = get
        self._cursors = cursors
        self._runtime = runtime
        self._feed = feed
        self._timing = timing
        self._max_posts = max(max_posts, 1)
        self._max_channels = max(max_channels, 1)
        self._bot_id = runtime.bot_id

    async def read(self, user_id: str) -> bool:
        """Feed what `user_id` missed; True when every channel that may be behind was read."""
        behind = await self._behind(user_id)
        if behind is None:
            return False
        left_out = behind[self._max_channels :]
        for _ in left_out:
            self._runtime.drop(Skip.CATCH_UP_LIMIT, "a channel left out of the catch-up")
        if left_out:
            log.warning(
                "mattermost bot %s: %d channels with posts made while disconnected were "
                "left out of the catch-up (at most %d are read)",
                self._bot_id,
                len(left_out),
                self._max_channels,
            )
        complete, fed = not left_out, 0
        for channel, position in behind[: self._max_channels]:
            read = await self._read_channel(channel, position)
            complete = complete and read is not None
            fed += read or 0
        if fed:
            log.info("mattermost bot %s: caught up %d posts", self._bot_id, fed)
        return complete

    async def _behind(self, user_id: str) -> list[tuple[ChannelInfo, Position]] | None:
        """The channels with a post newer than their position, most recently active first."""
        answer = await self._fetch(f"/users/{user_id}/channels", "GET channels")
        channels = member_channels(answer)
        if channels is None:
            if answer is not None:
                log.warning(
                    "mattermost bot %s: catch-up: the channel list is no list", self._bot_id
                )
            return None
        behind = []
        for channel in channels:
            if not MATTERMOST_ID.match(channel.id):
                continue
            position = await self._cursors.position(channel.id)
            if channel.last_post_at > position.at or (
                channel.last_post_at == position.at and not position.ids
            ):
                behind.append((channel, position))
        behind.sort(key=lambda item: item[0].last_post_at, reverse=True)
        return behind

    async def _read_channel(self, channel: ChannelInfo, position: Position) -> int | None:
        """Feed one channel's posts after `position`; how many, None when it was not read."""
        path = f"/channels/{channel.id}/posts?since={position.since()}"
        answer = await self._fetch(path, "GET posts since")
        listed = listed_posts(answer)
        if listed is None:
            if answer is not None:
                log.warning(
                    "mattermost bot %s: catch-up: channel %s answered no post list",
                    self._bot_id,
                    channel.id,
                )
            return None
        posts = new_posts(listed, position)
        excess = max(len(posts) - self._max_posts, 0)
        if excess or len(listed) >= SINCE_LIMIT:
            log.warning(
                "mattermost bot %s: channel %s: %d posts made while disconnected, the newest "
                "%d answered (a catch-up takes %d a channel, the server gives at most %d)",
                self._bot_id,
                channel.id,
                len(posts),
                len(posts) - excess,
                self._max_posts,
                SINCE_LIMIT,
            )
        if posts:
            self._cursors.hold(channel.id, position)
        for post in posts[:excess]:
            self._runtime.drop(Skip.CATCH_UP_LIMIT, f"post {post.get('id')}")
        for post in posts[excess:]:
            self._feed(as_event(post, channel))
        return len(posts) - excess

    async def _fetch(self, path: str, what: str) -> object:
        """A GET's JSON answer, tried again while it may pass; None (logged) when not given."""
        backoff = self._timing.backoff()
        for attempt in range(1, CATCH_UP_ATTEMPTS + 1):
            pause: Callable[[], Awaitable[None]] | None = None
            try:
                answer = await self._get(path)
            except (aiohttp.ClientError, TimeoutError) as exc:
                why, pause = type(exc).__name__, backoff.wait
            else:
                if answer is None:
                    return None
                if answer.status == 200:
                    return answer.body
                why = error_id(answer.status, answer.body)
                if answer.status == 429:
                    wait = min(retry_after(answer.headers), MAX_RETRY_AFTER)
                    pause = functools.partial(self._timing.sleep, wait)
                elif answer.status >= 500:
                    pause = backoff.wait
            if pause is None or attempt == CATCH_UP_ATTEMPTS:
                log.warning("mattermost bot %s: catch-up %s failed (%s)", self._bot_id, what, why)
                return None
            await pause()
        return None
