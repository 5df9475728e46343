"""The `telegram` platform: python-telegram-bot's Bot, long polling or a webhook."""

from __future__ import annotations

from connectors.skips import Skip
from connectors.telegram.connector import TelegramConnector
from connectors.telegram.inbound import BotIdentity, to_inbound, translate_update
from gateway.app.connector import ConnectorServices
from gateway.config import TelegramBotConfig

__all__ = ["BotIdentity", "Skip", "TelegramConnector", "create", "to_inbound", "translate_update"]


def create(bot: TelegramBotConfig, services: ConnectorServices) -> TelegramConnector:
    """The connector of one hosted Telegram bot (adds its webhook route in webhook mode)."""
    return TelegramConnector(bot, services)
