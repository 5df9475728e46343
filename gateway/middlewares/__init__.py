"""The pipeline's stages, one module each; `gateway.stages` assembles them in order."""

from gateway.middlewares.admin import AdminMiddleware
from gateway.middlewares.admission import AdmissionMiddleware
from gateway.middlewares.agent_dispatch import AgentDispatchMiddleware
from gateway.middlewares.bot_loop import BotLoopMiddleware, BotTurnsMiddleware
from gateway.middlewares.channel_policy import ChannelPolicyMiddleware
from gateway.middlewares.dedupe import DedupeMiddleware
from gateway.middlewares.delivery import DeliveryMiddleware
from gateway.middlewares.errors import ErrorsMiddleware
from gateway.middlewares.self_filter import SelfFilterMiddleware
from gateway.middlewares.silence import SilenceMiddleware
from gateway.middlewares.transcript import HistoryMiddleware, TranscriptMiddleware

__all__ = [
    "AdminMiddleware",
    "AdmissionMiddleware",
    "AgentDispatchMiddleware",
    "BotLoopMiddleware",
    "BotTurnsMiddleware",
    "ChannelPolicyMiddleware",
    "DedupeMiddleware",
    "DeliveryMiddleware",
    "ErrorsMiddleware",
    "HistoryMiddleware",
    "SelfFilterMiddleware",
    "SilenceMiddleware",
    "TranscriptMiddleware",
]
