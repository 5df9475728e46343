"""The `matrix` platform: matrix-nio's AsyncClient, `/sync` in and `m.room.message` out."""

from __future__ import annotations

from connectors.matrix.connector import MatrixConnector
from connectors.matrix.inbound import BotIdentity, to_inbound, translate_event
from connectors.skips import Skip
from gateway.app.connector import ConnectorServices
from gateway.config import MatrixBotConfig

__all__ = ["BotIdentity", "MatrixConnector", "Skip", "create", "to_inbound", "translate_event"]


def create(bot: MatrixBotConfig, services: ConnectorServices) -> MatrixConnector:
    """The connector of one hosted Matrix user."""
    return MatrixConnector(bot, services)
