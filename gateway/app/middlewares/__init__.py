"""The pipeline's stages, one module each; `gateway.app.stages` assembles them in order."""

from gateway.app.middlewares.admin import AdminMiddleware
from gateway.app.middlewares.admission import AdmissionMiddleware
from gateway.app.middlewares.agent_dispatch import AgentDispatchMiddleware
from gateway.app.middlewares.bot_loop import BotLoopMiddleware, BotTurnsMiddleware
from gateway.app.middlewares.channel_policy import ChannelPolicyMiddleware
from gateway.app.middlewares.dedupe import DedupeMiddleware
from gateway.app.middlewares.delivery import DeliveryMiddleware
from gateway.app.middlewares.errors import ErrorsMiddleware
from gateway.app.middlewares.self_filter import SelfFilterMiddleware
from gateway.app.middlewares.silence import SilenceMiddleware
from gateway.app.middlewares.transcript import HistoryMiddleware, TranscriptMiddleware

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
