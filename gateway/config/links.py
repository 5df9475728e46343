"""The `links:` section: rooms that are one conversation (a bridge), and the room → scope map.

A bridge (mautrix, hookshot, a relay bot) copies every message of a Matrix room into a
Telegram group and back, so a bot ping-pong that crosses it runs in both rooms at once.
`links: [[matrix:!abc:example.org, telegram:-100123]]` names such rooms; `RoomLinks.scope`
is the one place a room becomes the key its budgets, bot-turn count, pause and runtime
overrides are kept under: the link's first room as written for a linked room, the room
itself otherwise. The bot-loop stages, admission, the channel policy and the admin
commands all ask it, so linked rooms share one pair budget, one bot-turn cap, one pause
and one set of `/loop` changes.

Each room is `platform:channel` exactly as the gateway writes a room key
(`InboundMessage.room`): a known platform, a colon, the channel id (which may hold more
colons, as Matrix room ids do). A room is printable ASCII with no spaces, at most
`MAX_LINK_ROOM_CHARS` characters, so a look-alike or an invisible character is refused
rather than silently naming a room no message ever has. A link names two to
`MAX_LINK_ROOMS` rooms, a room is in at most one link, and there are at most `MAX_LINKS`
links. Errors name the field (`links.<n>.<m>`) and never echo the value.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated

from pydantic import AfterValidator, BeforeValidator, Field

from gateway.config.base import FieldError
from gateway.config.bots import AdminsConfig

MAX_LINK_ROOM_CHARS = 256
MAX_LINK_ROOMS = 16
MAX_LINKS = 1_000
PLATFORMS = tuple(AdminsConfig.model_fields)
"""The platforms a linked room may be on: those a bot can be hosted on."""


def _text_only(value: object) -> object:
    # YAML reads `telegram: -100123` (a space after the colon) as a mapping: say what is wrong.
    if not isinstance(value, str):
        # ValueError, not TypeError: pydantic reports only the former as the field's error.
        raise ValueError("must be a room written platform:channel (no space after the colon)")  # noqa: TRY004
    return value


def room_problem(value: str) -> str | None:
    """Why `value` is not a linkable room key, or None when it is one."""
    if len(value) > MAX_LINK_ROOM_CHARS:
        return f"must be at most {MAX_LINK_ROOM_CHARS} characters, got {len(value):,}"
    if not (value.isascii() and value.isprintable()) or " " in value:
        return "must be printable ASCII without spaces (a room key, platform:channel)"
    platform, _, channel = value.partition(":")
    if not channel:
        return "must be a room key, platform:channel (e.g. telegram:-100123)"
    if platform not in PLATFORMS:
        return f"must start with a known platform ({', '.join(PLATFORMS)})"
    return None


def _linkable(value: str) -> str:
    problem = room_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


LinkedRoom = Annotated[str, BeforeValidator(_text_only), AfterValidator(_linkable)]
"""One room of a link: `platform:channel`, validated by `room_problem`."""

RoomLink = Annotated[tuple[LinkedRoom, ...], Field(min_length=2, max_length=MAX_LINK_ROOMS)]
"""The rooms of one conversation: two or more."""

Links = Annotated[tuple[RoomLink, ...], Field(max_length=MAX_LINKS)]
"""The `links:` section."""


def check_links(links: Sequence[Sequence[str]]) -> None:
    """Raise `FieldError` at `links.<n>.<m>` for a room named twice (in one link or two)."""
    seen: dict[str, int] = {}
    for index, link in enumerate(links):
        for position, room in enumerate(link):
            if room in seen:
                where = "this link" if seen[room] == index else f"links.{seen[room]}"
                raise FieldError(
                    f"links.{index}.{position}", f"the room is already linked in {where}"
                )
            seen[room] = index


@dataclass(frozen=True, slots=True)
class RoomLinks:
    """Maps a room key to its scope (the link's key) and to the rooms linked with it."""

    _groups: Mapping[str, tuple[str, ...]]

    @classmethod
    def of(cls, links: Sequence[Sequence[str]]) -> RoomLinks:
        """The map of a validated `links:` section (each room in at most one link)."""
        return cls({room: tuple(link) for link in links for room in link})

    def scope(self, room: str) -> str:
        """The key the room's budgets, pause and overrides are kept under.

        The link's first room for a linked room, the room itself otherwise.
        """
        group = self._groups.get(room)
        return room if group is None else group[0]

    def linked(self, room: str) -> tuple[str, ...]:
        """Every room of the room's link, the room included; () when it is in none."""
        return self._groups.get(room, ())

    def rooms(self) -> tuple[str, ...]:
        """Every linked room, in the order the config names them."""
        return tuple(self._groups)
