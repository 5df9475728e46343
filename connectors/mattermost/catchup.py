"""What a channel holds that the bot has not handled yet, read from REST answers (no I/O).

Mattermost does not replay to a new websocket the events of the time it was down, so after
every (re)connect the connector asks the server for what it missed: the bot's channels
(`GET /users/{id}/channels`, each with `last_post_at`) and, for each channel with a newer
post than its `Position`, the posts changed since (`GET /channels/{id}/posts?since=<ms>`).
This module reads those answers and turns each missed post into the `posted` event the
websocket would have sent, so it takes the same inbound path as a live one.

- A `Position` is the newest `create_at` handled in a channel and the ids of the posts
  handled at that very millisecond (at most `MAX_IDS_AT_ONE_MS`), so two posts of one
  millisecond are neither skipped nor answered twice. `since` asks from the millisecond
  before (the server answers `update_at > since`), and `is_new` keeps a post only when it
  was created after the position: the server also answers posts edited or deleted since
  (and the roots of threads among them), which were handled when they were made.
- `new_posts` keeps the live posts (`delete_at` 0) that are new, oldest first (by
  `create_at`, then id); a post whose id or time is not of the right type is left out.
- `as_event` wraps a post as a `posted` event: the channel's type says whether it is a
  direct message; the sender's name is a webhook's `override_username`, else unknown (the
  translation uses the user id, and the connector asks the server for the username); the
  server's `mentions` list is not in a REST answer, so a caught-up post mentions the bot
  only by `@username` in its text.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from gateway.app.jsonbody import parse_json

MAX_IDS_AT_ONE_MS = 100
"""Post ids a Position keeps for its millisecond; more in one millisecond are not expected."""
MAX_MILLIS = 2**53
"""The largest `create_at` taken (JSON numbers are exact up to here)."""
SINCE_LIMIT = 1000
"""The most posts the server puts in a `since` answer: a full answer may have left some out."""


@dataclass(frozen=True, slots=True)
class Position:
    """Where a channel is read up to: the newest `create_at` handled, and its posts' ids."""

    at: int
    ids: frozenset[str] = frozenset()

    def is_new(self, create_at: int, post_id: str) -> bool:
        """True for a post created after this position (or in its millisecond, unhandled)."""
        return create_at > self.at or (create_at == self.at and post_id not in self.ids)

    def after(self, create_at: int, post_id: str) -> Position:
        """This position moved past one handled post (unchanged for an older post)."""
        if create_at > self.at:
            return Position(create_at, frozenset((post_id,)))
        if not self.is_new(create_at, post_id) or len(self.ids) >= MAX_IDS_AT_ONE_MS:
            return self
        return Position(self.at, self.ids | {post_id})

    def since(self) -> int:
        """The `since` query that brings every post created at this millisecond or later."""
        return max(self.at - 1, 0)

    def dumps(self) -> str:
        """The position as the state backend keeps it."""
        return json.dumps({"at": self.at, "ids": sorted(self.ids)})


def saved_mapping(saved: str | None) -> Mapping[str, object] | None:
    """A value the cursor store kept, as the JSON object it was written as; else None."""
    if saved is None:
        return None
    try:
        value = parse_json(saved)
    except ValueError:
        return None
    return value if isinstance(value, Mapping) else None


def parse_position(saved: str | None) -> Position | None:
    """A saved position, None when absent or not one `Position.dumps` wrote."""
    value = saved_mapping(saved)
    if value is None:
        return None
    at, ids = millis(value.get("at")), value.get("ids")
    if at is None or not isinstance(ids, list) or len(ids) > MAX_IDS_AT_ONE_MS:
        return None
    if not all(isinstance(post_id, str) for post_id in ids):
        return None
    return Position(at, frozenset(ids))


@dataclass(frozen=True, slots=True)
class ChannelInfo:
    """One of the bot's channels: its id, type (`O`, `P`, `D`, `G`) and newest post's time."""

    id: str
    type: str
    last_post_at: int


def member_channels(answer: object) -> list[ChannelInfo] | None:
    """The live channels of a `GET /users/{id}/channels` answer (malformed ones left out);
    None when the answer is not a list at all (the catch-up is then incomplete)."""
    if not isinstance(answer, list):
        return None
    channels = []
    for item in answer:
        if not isinstance(item, Mapping) or millis(item.get("delete_at", 0)) != 0:
            continue
        channel_id, kind = item.get("id"), item.get("type")
        last_post_at = millis(item.get("last_post_at"))
        if isinstance(channel_id, str) and channel_id and isinstance(kind, str):
            channels.append(ChannelInfo(channel_id, kind, last_post_at or 0))
    return channels


def post_position(post: Mapping[str, object]) -> tuple[int, str] | None:
    """A post's `create_at` and id, None when either is missing or of the wrong type."""
    create_at, post_id = millis(post.get("create_at")), post.get("id")
    if create_at is None or not isinstance(post_id, str) or not post_id:
        return None
    return create_at, post_id


def listed_posts(answer: object) -> list[Mapping[str, object]] | None:
    """The post objects of a `PostList` answer (`posts`, keyed by id), in no given order;
    None when the answer is not a `PostList` (that channel is then not caught up)."""
    posts = answer.get("posts") if isinstance(answer, Mapping) else None
    if not isinstance(posts, Mapping):
        return None
    return [post for post in posts.values() if isinstance(post, Mapping)]


def new_posts(posts: list[Mapping[str, object]], position: Position) -> list[Mapping[str, object]]:
    """The live posts created after `position`, oldest first."""
    found: list[tuple[int, str, Mapping[str, object]]] = []
    for post in posts:
        at = post_position(post)
        if at is not None and millis(post.get("delete_at", 0)) == 0 and position.is_new(*at):
            found.append((*at, post))
    found.sort(key=lambda item: item[:2])
    return [post for _, _, post in found]


def as_event(post: Mapping[str, object], channel: ChannelInfo) -> dict[str, object]:
    """A caught-up post as the `posted` event the websocket would have sent."""
    data: dict[str, object] = {"post": post, "channel_type": channel.type}
    props = post.get("props")
    if isinstance(props, Mapping) and isinstance(props.get("override_username"), str):
        data["sender_name"] = props["override_username"]
    return {"event": "posted", "data": data}


def millis(value: object) -> int | None:
    """A time in milliseconds from untrusted JSON: a whole number 0..2**53, else None."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_MILLIS:
        return None
    return value
