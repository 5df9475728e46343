"""The `room` platform: a local web chat room on the gateway's own HTTP server (the demo)."""

from __future__ import annotations

from connectors.room.connector import PLATFORM, RoomConnector
from connectors.room.hub import RoomHub
from connectors.room.reclaim import ForgetRoom
from gateway.app.connector import ConnectorServices
from gateway.config import RoomBotConfig

__all__ = ["RoomConnector", "RoomHub", "create"]


def create(bot: RoomBotConfig, services: ConnectorServices) -> RoomConnector:
    """Seat one hosted bot in the app's room hub (created, with its routes, on first use).

    The hub forgets a room it reclaims through `services.forget_room`, by its room key.
    """
    forget = None if services.forget_room is None else _by_name(services.forget_room)
    hub = RoomHub.for_app(services.http, http_host=services.http_host, forget=forget)
    return RoomConnector(bot, hub)


def _by_name(forget_room: ForgetRoom) -> ForgetRoom:
    """`forget_room`, which takes a room key (`room:lobby`), for the hub's room names."""
    return lambda name: forget_room(f"{PLATFORM}:{name}")
