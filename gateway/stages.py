"""The gateway's pipeline: every stage, in order, built once at start-up.

Outermost first:

    errors → dedupe → self_filter → delivery → admin → channel_policy → admission
           → bot_loop → silence → agent_dispatch

- errors: counts every message in; nothing raised inside escapes to the connector.
- dedupe: a redelivered or retried platform event is handled once (`pipeline.dedupe`).
- self_filter: a bot never handles what its own platform user wrote; on a platform that
  cannot tell bots from people, every sender counts as a bot.
- delivery: sends whatever reply the inner stages return. It deliberately sits outside
  every stage that can speak, not at the bottom of DESIGN.md's list: admin
  acknowledgements and refusals, the cooldown notice, the silence notice and the agent's
  reply all take this one path to the platform (chunking, retries, metrics). The agent's
  reply still flows agent → silence → delivery, as the design's diagram has it.
- admin: `/loop` commands, handled here and never passed on (`pipeline.admin_commands`);
  they come before admission and the loop guard, so they work in a paused room.
- channel_policy: the room's effective policy into `ctx.policy`.
- admission: paused rooms; who this bot answers (`respond_to`); a human message it
  refuses still resets the room's consecutive-bot-turn count.
- bot_loop: pair budget, cooldown notice, consecutive-bot-turn cap.
- silence: NO_REPLY and narration never reach delivery.
- agent_dispatch: the agent's turn, bounded by the turn timeout; the tool-loop and
  call-loop verdicts the agent reports are counted and a halt is logged.
"""

from __future__ import annotations

from gateway.admin import AdminService
from gateway.config import Config
from gateway.delivery import Delivery
from gateway.metrics import Metrics
from gateway.middlewares import (
    AdminMiddleware,
    AdmissionMiddleware,
    AgentDispatchMiddleware,
    BotLoopMiddleware,
    ChannelPolicyMiddleware,
    DedupeMiddleware,
    DeliveryMiddleware,
    ErrorsMiddleware,
    PolicyCache,
    SelfFilterMiddleware,
    SilenceMiddleware,
)
from gateway.pipeline import Handler, Middleware, build_pipeline
from gateway.refusals import DecisionLog, RecentRefusals


def build_gateway_pipeline(
    config: Config,
    *,
    admin: AdminService,
    delivery: Delivery,
    recent: RecentRefusals,
    metrics: Metrics | None = None,
) -> Handler:
    """Assemble the stages (skipping those switched off in `pipeline:`) into one handler.

    `metrics` defaults to the delivery's, so one registry holds every counter.
    """
    decisions = DecisionLog(metrics or delivery.metrics, recent)
    policies = PolicyCache(config)
    stack: list[Middleware] = [ErrorsMiddleware(decisions.metrics)]
    if config.pipeline.dedupe:
        stack.append(DedupeMiddleware(config.pipeline.dedupe_ttl_seconds, decisions))
    stack += [SelfFilterMiddleware(decisions), DeliveryMiddleware(delivery)]
    if config.pipeline.admin_commands:
        stack.append(AdminMiddleware(config, admin, decisions))
    stack += [
        ChannelPolicyMiddleware(policies),
        AdmissionMiddleware(decisions),
        BotLoopMiddleware(policies, decisions),
        SilenceMiddleware(policies, decisions),
        AgentDispatchMiddleware(config.pipeline, decisions),
    ]
    return build_pipeline(stack)
