"""The `mattermost` platform: REST API v4 and the websocket event stream, over aiohttp."""

from __future__ import annotations

from connectors.mattermost.connector import MattermostConnector
from connectors.mattermost.inbound import BotIdentity, to_inbound, translate_event
from connectors.skips import Skip
from gateway.app.connector import ConnectorServices
from gateway.config import MattermostBotConfig

__all__ = ["BotIdentity", "MattermostConnector", "Skip", "create", "to_inbound", "translate_event"]


def create(bot: MattermostBotConfig, services: ConnectorServices) -> MattermostConnector:
    """The connector of one hosted Mattermost bot account."""
    return MattermostConnector(bot, services)
