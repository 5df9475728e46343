"""The gateway's pipeline: every stage, in order, built once at start-up.

Outermost first:

    errors → dedupe → self_filter → delivery → admin → transcript → channel_policy
           → bot_turns → admission → bot_loop → silence → history → agent_dispatch

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
- transcript: room memory (`pipeline.transcript`; off with `max_messages: 0`): every
  message that is not a command, and this bot's reply as it goes out, appended to the
  room's or thread's transcript (gateway/app/middlewares/transcript.py says what is not).
- channel_policy: the room's effective policy, with its guard policies, into
  `ctx.resolved` (from the policy cache `/loop` commands share).
- bot_turns: the room's consecutive-bot-turn count, updated for every message (the
  bot-loop module owns it; before admission, so a human message nobody answers still
  resets it).
- admission: paused rooms; who this bot answers (`respond_to`).
- bot_loop: consecutive-bot-turn cap, pair budget, cooldown notice.
- silence: NO_REPLY and narration never reach delivery.
- history: the transcript read into `turn.history` within the agent's `history`, only
  for a turn the agent takes (with room memory on).
- agent_dispatch: the agent's turn, bounded by the turn timeout; the tool-loop and
  call-loop verdicts the agent reports are counted and a halt is logged.

Each stage's `name` is what metrics and logs call it (`refusals_total{stage}`,
`errors_total{stage}`). With an `activity` feed, the stages' decisions, each message past
the self filter and each reply delivered are recorded there too (gateway/observability/activity.py).
"""

from __future__ import annotations

from gateway.admin.service import AdminService
from gateway.app.middlewares import (
    AdminMiddleware,
    AdmissionMiddleware,
    AgentDispatchMiddleware,
    BotLoopMiddleware,
    BotTurnsMiddleware,
    ChannelPolicyMiddleware,
    DedupeMiddleware,
    DeliveryMiddleware,
    ErrorsMiddleware,
    HistoryMiddleware,
    SelfFilterMiddleware,
    SilenceMiddleware,
    TranscriptMiddleware,
)
from gateway.app.pipeline import Handler, Middleware, build_pipeline
from gateway.app.refusals import DecisionLog, RecentRefusals
from gateway.config import Config
from gateway.delivery.sender import Delivery
from gateway.observability.activity import ActivityFeed
from gateway.observability.metrics import Metrics
from gateway.state.base import StateStore


def build_gateway_pipeline(
    config: Config,
    *,
    state: StateStore,
    admin: AdminService,
    delivery: Delivery,
    recent: RecentRefusals,
    metrics: Metrics | None = None,
    activity: ActivityFeed | None = None,
) -> Handler:
    """Assemble the stages (skipping those switched off in `pipeline:`) into one handler.

    Each stage is handed the one protocol of `state` it uses (gateway/state/base.py); the
    bot-loop stages read the turn's decisions (`TurnContext.state`). `metrics` defaults to
    the delivery's, so one registry holds every counter. The room's policy comes from
    `admin.policies`, the cache `/loop status`, `policy` and `set` use.
    """
    decisions = DecisionLog(metrics or delivery.metrics, recent, activity)
    memory = config.pipeline.transcript
    inner: list[Middleware] = []
    if config.pipeline.dedupe:
        inner.append(DedupeMiddleware(state, config.pipeline.dedupe_ttl_seconds, decisions))
    inner += [SelfFilterMiddleware(decisions), DeliveryMiddleware(delivery, activity)]
    if config.pipeline.admin_commands:
        inner.append(AdminMiddleware(config, admin, state, decisions))
    if memory.max_messages:
        inner.append(TranscriptMiddleware(state, memory, admin, decisions.metrics))
    inner += [
        ChannelPolicyMiddleware(admin.policies, state),
        BotTurnsMiddleware(),
        AdmissionMiddleware(state, decisions),
        BotLoopMiddleware(decisions),
        SilenceMiddleware(decisions),
    ]
    if memory.max_messages:
        inner.append(HistoryMiddleware(state, admin, decisions.metrics))
    inner.append(AgentDispatchMiddleware(config.pipeline, decisions))
    return build_pipeline([ErrorsMiddleware(decisions.metrics), *inner])
