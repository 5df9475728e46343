"""The `room` platform: a local web chat room on the gateway's own HTTP server (the demo)."""

from __future__ import annotations

from connectors.room.connector import RoomConnector
from connectors.room.hub import RoomHub
from gateway.config import RoomBotConfig
from gateway.connector import ConnectorServices

__all__ = ["RoomConnector", "RoomHub", "create"]


def create(bot: RoomBotConfig, services: ConnectorServices) -> RoomConnector:
    """Seat one hosted bot in the app's room hub (created, with its routes, on first use)."""
    return RoomConnector(bot, RoomHub.for_app(services.http, http_host=services.http_host))
