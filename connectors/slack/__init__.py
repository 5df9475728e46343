"""The `slack` platform: a slack-bolt AsyncApp over Socket Mode or the Events API."""

from __future__ import annotations

from connectors.skips import Skip
from connectors.slack.connector import SlackConnector
from connectors.slack.inbound import BotIdentity, to_inbound, translate_payload
from gateway.app.connector import ConnectorServices
from gateway.config import SlackBotConfig

__all__ = ["BotIdentity", "Skip", "SlackConnector", "create", "to_inbound", "translate_payload"]


def create(bot: SlackBotConfig, services: ConnectorServices) -> SlackConnector:
    """The connector of one hosted Slack app (adds its Events API route unless Socket Mode)."""
    return SlackConnector(bot, services)
