"""Why a connector dropped an inbound event: one vocabulary for every platform.

Each value is a `reason` label of `events_dropped_total{platform,reason}` at `/metrics`
and a key of a connector's `dropped` counter, so a reason means the same on Discord,
Slack and Telegram. The translation modules (`connectors/<platform>/inbound.py`) return
the first seven; the connectors count the rest.
"""

from __future__ import annotations

import enum


class Skip(enum.StrEnum):
    """Why an inbound event was dropped instead of reaching the pipeline."""

    MALFORMED = "malformed"
    """Not a payload of the platform's shape (wrong JSON types, missing ids, unparsable)."""
    UNSUPPORTED = "unsupported"
    """A well-formed event of a kind the gateway does not answer (edits, reactions…)."""
    SERVICE = "service_message"
    """A system message: joins, pins, topic changes."""
    NO_TEXT = "no_text"
    """A message without text (a photo, a sticker, a file alone)."""
    NO_SENDER = "no_sender"
    """A message with no sender id to answer or budget by."""
    OWN = "own_message"
    """The hosted bot's own message, echoed back by the platform."""
    OTHER_BOT = "addressed_to_other_bot"
    """A command addressed to another bot (Telegram `/cmd@otherbot`)."""
    NOT_VISIBLE = "not_visible"
    """A peer's message the platform would not show this bot (Telegram privacy mode)."""
    TOO_LARGE = "too_large"
    """A webhook body over the route's limit (answered 413)."""
    UNAUTHORIZED = "unauthorized"
    """A webhook request without a valid signature or secret token (answered 401)."""
    ENCRYPTED = "encrypted_room"
    """A message in an end-to-end encrypted room, which the gateway cannot read (Matrix)."""
    HISTORY = "before_first_sync"
    """A message older than the connector's first sync: history, never answered (Matrix)."""
    SYNC_GAP = "sync_gap"
    """A sync gap paged back only in part: counted once a gap, its older events unknown (Matrix)."""
    CATCH_UP_LIMIT = "catch_up_limit"
    """Made while the connection was down, past what a catch-up reads (Mattermost): a post,
    or a channel whose posts were not read."""
    QUEUE_FULL = "queue_full"
    """Too many messages waiting for the pipeline in one channel, or in all of them."""
    STOPPING = "stopping"
    """Arrived while the gateway or the connector was stopping, and cannot come again."""
    SINK_ERROR = "sink_error"
    """The pipeline raised on it (and, on Telegram, kept raising for every attempt)."""
