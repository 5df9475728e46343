"""The `discord` platform: one discord.py Client per hosted bot, gateway in, REST replies out."""

from __future__ import annotations

from connectors.discord.connector import DiscordConnector, RoutedHTTPClient
from connectors.discord.inbound import BotIdentity, to_inbound, translate_message
from connectors.skips import Skip
from gateway.app.connector import ConnectorServices
from gateway.config import DiscordBotConfig

__all__ = [
    "BotIdentity",
    "DiscordConnector",
    "RoutedHTTPClient",
    "Skip",
    "create",
    "to_inbound",
    "translate_message",
]


def create(bot: DiscordBotConfig, services: ConnectorServices) -> DiscordConnector:
    """The connector of one hosted Discord bot."""
    return DiscordConnector(bot, services)
