"""Configuration: one YAML file validated once at start-up (DESIGN.md §2 "Configuration").

A module per section: `state`, `http`, `agents`, `bots` (and `admins`), `policy` (and
`channels`, with `resolve_policy`), `call_loop` (the gateway's `policy.call_loop` and
`proxy.call_loop` alike), `pipeline`, `proxy`, `telemetry` and `links`; `root` holds
`Config`, the whole file; `loader` reads it (`parse_config` / `load_config`, safe YAML and
`${VAR}` interpolation).
`base` is what the sections share (the frozen model, secrets, `first_error`), `safeyaml`
the bounded YAML loader, `limits` the bounds every number and duration is held to, `urls`
the URL and network fields (`public_url`, `trusted_proxies`).

The public names are re-exported here (`from gateway.config import Config, parse_config`).
Config knows nothing of the features that read it: it imports no HTTP, admin, proxy or
CLI module (the import contracts in pyproject.toml hold it to that), and its own modules
import each other, never this package.
"""

from gateway.config.agents import (
    AgentConfig,
    HistoryConfig,
    HttpAgentConfig,
    McpServerConfig,
    OpenAIAgentConfig,
    PythonAgentConfig,
    ScriptedAgentConfig,
    ScriptedRule,
)
from gateway.config.base import first_error
from gateway.config.bots import (
    AdminsConfig,
    BotConfig,
    DiscordBotConfig,
    MatrixBotConfig,
    MattermostBotConfig,
    RoomBotConfig,
    SlackBotConfig,
    TelegramBotConfig,
)
from gateway.config.call_loop import CallLoopSettings
from gateway.config.http import HttpConfig
from gateway.config.loader import load_config, parse_config
from gateway.config.pipeline import PipelineConfig, TranscriptConfig
from gateway.config.policy import (
    BotLoopSettings,
    ChannelMatch,
    ChannelRule,
    Policy,
    RespondToPolicy,
    SilenceSettings,
    SpendSettings,
    ToolLoopSettings,
    with_override,
)
from gateway.config.proxy import ProxyConfig
from gateway.config.root import Config, resolve_policy
from gateway.config.state import StateConfig
from gateway.config.telemetry import TelemetryConfig

__all__ = [
    "AdminsConfig",
    "AgentConfig",
    "BotConfig",
    "BotLoopSettings",
    "CallLoopSettings",
    "ChannelMatch",
    "ChannelRule",
    "Config",
    "DiscordBotConfig",
    "HistoryConfig",
    "HttpAgentConfig",
    "HttpConfig",
    "MattermostBotConfig",
    "McpServerConfig",
    "OpenAIAgentConfig",
    "PipelineConfig",
    "Policy",
    "ProxyConfig",
    "PythonAgentConfig",
    "RespondToPolicy",
    "MatrixBotConfig",
    "RoomBotConfig",
    "ScriptedAgentConfig",
    "ScriptedRule",
    "SilenceSettings",
    "SlackBotConfig",
    "SpendSettings",
    "StateConfig",
    "TelegramBotConfig",
    "TelemetryConfig",
    "ToolLoopSettings",
    "TranscriptConfig",
    "first_error",
    "load_config",
    "parse_config",
    "resolve_policy",
    "with_override",
]
