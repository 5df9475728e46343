"""The running gateway: state, agents, HTTP server, connectors and the pipeline, wired once.

`Gateway(config)` builds everything that can fail on configuration (state backend, agents,
connector factories and the webhook routes they add, the pipeline) so a bad config or a
missing platform extra is a `ConfigError` before anything connects. `start()` opens the
state, serves HTTP and connects every bot; `stop(drain_seconds)` stops taking messages,
lets turns in flight finish (bounded), and closes everything.

Decisions where DESIGN.md is silent:
- The sink runs each inbound message's turn as a task the gateway tracks (so `stop` can
  drain it) and awaits it, returning the turn's reply: a connector that awaits the sink
  handles its messages one at a time, in order; one that wants turns to overlap calls the
  sink from tasks of its own. While stopping, the sink raises `GatewayStopping`, so a
  connector leaves that message unacknowledged (Telegram then redelivers it to the next run).
- A connector whose first `start` fails or does not finish within `connect_timeout` does
  not stop the gateway: the failure is logged (type and message, no traceback; the CLI's
  log filter masks secrets) and the same connector is started again in the background
  with doubling delays, `start_backoff` = (first delay, cap). A connector's `start` must
  therefore clean up after itself when it raises. `/readyz` stays 503 meanwhile.
- `stop(drain_seconds)` spends at most about `drain_seconds` in total: turns in flight get
  the budget minus a small reserve (a quarter of it, at most 1 s) and are cancelled after;
  then connectors, agents, state and the HTTP server are closed, in that order, each
  bounded by what is left of the budget (never less than the reserve).
- The agents' LLM calls share one CallStore of the state backend (default policy), so
  `/loop circuits` and `/loop reopen` see them, and with sqlite or redis so do other
  replicas, the proxy and `loopwarden circuits`. Their `policy.spend` budgets are counted
  there too, their periods reckoned on `wall_clock` (the call store's clock of record),
  and each call is written to its request log (`request_log`, priced by the config's
  `proxy.prices` as the proxy prices), drained by `stop` before the state store closes.
- The Activity feed (gateway/observability/activity.py) is recorded only with `http.admin_token` set
  (without it no one may read it); it flushes from `start` on; `stop` closes it
  after the agents and before the state store, so its last batch is kept and the live
  streams end while the HTTP server still runs.
- Connectors are created through `connector_factory(bot, services)`; by default that is
  `connectors.<platform>.create`, imported only for the platforms configured. Tests and
  embedders inject their own factory.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, cast

from gateway.admin.access import AdminAccess
from gateway.admin.activity import activity_routes
from gateway.admin.api import admin_api_routes
from gateway.admin.calls import calls_admin_routes
from gateway.admin.console.app import add_console
from gateway.admin.console.links import ConsoleLinks
from gateway.admin.console.sessions import ConsoleSessions
from gateway.admin.rooms import room_routes
from gateway.admin.service import AdminService
from gateway.admin.spend import spend_routes
from gateway.agents.factory import build_agent
from gateway.agents.spend import AgentBudgets
from gateway.app.connector import Connector, ConnectorServices, PeerBus
from gateway.app.context import Agent, StartingAgent, TurnContext
from gateway.app.errors import ConfigError, GatewayStopping
from gateway.app.http import HttpServer, Readiness, create_app
from gateway.app.refusals import RecentRefusals
from gateway.app.stages import build_gateway_pipeline
from gateway.app.types import InboundMessage, Reply
from gateway.calls.factory import build_call_store
from gateway.calls.store import CallStore
from gateway.config import BotConfig, Config
from gateway.delivery.sender import Delivery
from gateway.observability.activity import ActivityFeed
from gateway.observability.metrics import Metrics, watch_pending
from gateway.proxy.pricing import PriceTable
from gateway.proxy.request_log import RequestLog
from gateway.state.base import StateStore
from gateway.state.factory import build_state

log = logging.getLogger("loopwarden.runtime")

ConnectorFactory = Callable[[BotConfig, ConnectorServices], Connector]
"""Creates the connector of one bot; it may add webhook routes to `services.http`."""

PLATFORM_EXTRAS = frozenset({"discord", "telegram", "slack", "matrix"})
"""Platforms whose SDK comes with the extra of the same name (`loopwarden[discord]`)."""


def load_connector_factory(platform: str, *, field: str) -> ConnectorFactory:
    """`connectors.<platform>.create`; a missing connector or SDK is a ConfigError on `field`."""
    module_name = f"connectors.{platform}"
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            raise ConfigError(
                field, f"no connector for platform {platform!r} in this installation"
            ) from None
        fix = (
            f"pip install 'loopwarden[{platform}]'"
            if platform in PLATFORM_EXTRAS
            else f"install {exc.name}"
        )
        raise ConfigError(
            field, f"the {platform} connector needs the {exc.name} package: {fix}"
        ) from None
    return cast(ConnectorFactory, module.create)


@dataclass(frozen=True, slots=True)
class HostedBot:
    """One configured bot with its connector and agent."""

    bot: BotConfig
    connector: Connector
    agent: Agent


class Gateway:
    """Hosts the configured bots: one pipeline, one state store, one HTTP server."""

    def __init__(
        self,
        config: Config,
        *,
        state: StateStore | None = None,
        calls: CallStore | None = None,
        clock: Callable[[], float] | None = None,
        wall_clock: Callable[[], float] = time.time,
        connector_factory: ConnectorFactory | None = None,
        connect_timeout: float = 30.0,
        start_backoff: tuple[float, float] = (1.0, 60.0),
        sock: socket.socket | None = None,
    ) -> None:
        self.config = config
        self.metrics = Metrics()
        self.state = (
            state
            if state is not None
            else build_state(config.state, clock=clock, metrics=self.metrics.state)
        )
        self.calls = calls if calls is not None else build_call_store(config.state, clock=clock)
        self.metrics.watch_state(self.state)
        watch_pending(self.metrics.registry, self.calls)
        recent = RecentRefusals(clock=clock)
        budgets = AgentBudgets.from_config(config, wall_clock=wall_clock)
        prices = PriceTable.for_config(config.proxy)
        self.request_log = RequestLog(
            self.calls, prices, wall_clock=wall_clock, metrics=self.metrics.model_calls
        )
        admin = self._admin = AdminService(
            config, self.state, recent=recent, calls=self.calls, spend=budgets
        )
        # The console's sessions: the admin API accepts them beside the bearer token.
        self.console = ConsoleSessions(
            hours=config.http.console_session_hours,
            clock=clock or time.monotonic,
            links=ConsoleLinks.of("gateway", config.http.port, clock=wall_clock),
        )
        access = AdminAccess(
            config.http.admin_token, self.console, public_url=config.http.public_url
        )
        self.app = create_app(readiness=self.readiness, metrics=self.metrics)
        self.app.add_routes(admin_api_routes(admin, self.state, access))
        add_console(
            self.app,
            access=access,
            product="gateway",
            state=self.state,
            trusted_proxies=config.http.trusted_proxies,
        )
        # The Rooms page lists the rooms the activity feed has seen, too.
        rooms_seen = (self.state.activity_rooms,)
        self.app.add_routes(room_routes(admin, self.state, config, access, sources=rooms_seen))
        self.app.add_routes(
            calls_admin_routes(admin, self.state, access, store=self.calls, proxy=config.proxy)
        )
        self.app.add_routes(spend_routes(admin, self.state, access))
        self.activity = ActivityFeed(self.state)
        self.app.add_routes(activity_routes(admin, self.activity, self.state, access))
        # `sock`: one of `--workers`' processes serves the socket the workers share.
        self._http = HttpServer(self.app, config.http.host, config.http.port, sock=sock)
        self._agents = {
            name: build_agent(
                name, agent, calls=self.calls, budgets=budgets, request_log=self.request_log
            )
            for name, agent in config.agents.items()
        }
        services = ConnectorServices(
            http=self.app,
            peers=PeerBus(),
            metrics=self.metrics,
            http_host=config.http.host,
            forget_room=admin.forget,  # the web room forgets the rooms it reclaims
            cursors=self.state,  # Matrix resumes its sync where the last run left off
        )
        self._hosted: dict[str, HostedBot] = {}
        for index, bot in enumerate(config.bots):
            create = connector_factory or load_connector_factory(
                bot.platform, field=f"bots.{index}.platform"
            )
            connector = create(bot, services)
            self._hosted[bot.id] = HostedBot(bot, connector, self._agents[bot.agent])
        self._pipeline = build_gateway_pipeline(
            config,
            state=self.state,
            admin=admin,
            delivery=Delivery(self.metrics),
            recent=recent,
            # Only a console or admin client can read the feed: without an admin token
            # nobody can, and the pipeline does not pay for recording it.
            activity=self.activity if config.http.admin_token is not None else None,
        )
        self._connect_timeout = connect_timeout
        self._backoff = start_backoff
        self._turns: set[asyncio.Task[Reply | None]] = set()
        self._retries: set[asyncio.Task[None]] = set()
        self._started = False
        self._stopping = False

    @property
    def port(self) -> int:
        """The HTTP server's bound port (useful with port 0)."""
        return self._http.port

    @property
    def hosted(self) -> dict[str, HostedBot]:
        """The configured bots by id, with their connectors and agents."""
        return self._hosted

    @property
    def admin(self) -> AdminService:
        """What `/loop` commands and the admin API run (the demo's rerun resets through it)."""
        return self._admin

    def readiness(self) -> Readiness:
        """Which bots are not connected, and whether the gateway is stopping."""
        return Readiness(
            stopping=self._stopping or not self._started,
            not_connected=tuple(
                bot_id for bot_id, hosted in self._hosted.items() if not hosted.connector.connected
            ),
        )

    @property
    def agents(self) -> Mapping[str, Agent]:
        """The configured agents by name (read-only)."""
        return MappingProxyType(self._agents)

    @property
    def ready(self) -> bool:
        """True once started, while every configured bot is connected and not stopping."""
        return self.readiness().ready

    async def start(self) -> None:
        """Open state, serve HTTP, connect every bot (failures retried in the background)."""
        await self.state.start()
        await self.calls.start()
        self.activity.start()
        await self._http.start()
        self._started = True
        log.info("http server on %s:%d", self.config.http.host, self.port)
        hosted = list(self._hosted.values())
        started = await asyncio.gather(*(self._connect(h, attempt=1) for h in hosted))
        for each, ok in zip(hosted, started, strict=True):
            if not ok:
                task = asyncio.create_task(self._keep_connecting(each))
                self._retries.add(task)
                task.add_done_callback(self._retries.discard)
        await asyncio.gather(
            *(agent.start() for agent in self._agents.values() if isinstance(agent, StartingAgent))
        )

    async def _connect(self, hosted: HostedBot, *, attempt: int) -> bool:
        """One bounded attempt to start a connector; False (logged) when it failed."""
        bot = hosted.bot
        try:
            async with asyncio.timeout(self._connect_timeout):
                await hosted.connector.start(self._sink)
        except Exception as exc:  # any failure of a platform must not take the gateway down
            log.warning(
                "bot %s (%s) failed to connect, attempt %d: %s: %s",
                bot.id,
                bot.platform,
                attempt,
                type(exc).__name__,
                exc,
            )
            return False
        log.info("bot %s (%s) connected", bot.id, bot.platform)
        # Lets `reset <bot>` and `status` name this bot before it has seen a message.
        self._admin.register_bot(bot.id, hosted.connector.bot_user_id)
        return True

    async def _keep_connecting(self, hosted: HostedBot) -> None:
        """Retry a connector's start with doubling delays until it connects."""
        delay, cap = self._backoff
        attempt = 1
        while True:
            await asyncio.sleep(delay)
            attempt += 1
            if await self._connect(hosted, attempt=attempt):
                return
            delay = min(delay * 2, cap)

    async def _sink(self, message: InboundMessage) -> Reply | None:
        """Run one inbound message through the pipeline as a tracked task; await its end."""
        if self._stopping:
            log.debug("stopping: refused message %s for bot %s", message.message_id, message.bot_id)
            raise GatewayStopping(f"gateway stopping; message {message.message_id} not taken")
        hosted = self._hosted.get(message.bot_id)
        if hosted is None:
            log.warning("message for unknown bot %r dropped", message.bot_id)
            return None
        turn = TurnContext(
            message=message,
            policy=self.config.policy,
            state=self.state,
            config=self.config,
            bot=hosted.bot,
            connector=hosted.connector,
            agent=hosted.agent,
        )
        task = asyncio.create_task(self._run_turn(turn))
        self._turns.add(task)
        task.add_done_callback(self._turns.discard)
        # Shielded: the turn belongs to the gateway (drained on stop), not to the connector
        # task that handed it over, which a platform may cancel on a reconnect.
        return await asyncio.shield(task)

    async def _run_turn(self, turn: TurnContext) -> Reply | None:
        """Run the pipeline; the errors stage handles failures, this is the last resort."""
        try:
            return await self._pipeline(turn)
        except Exception:
            log.exception("turn of bot %s failed outside the pipeline", turn.bot.id)
            return None

    async def stop(self, drain_seconds: float = 10.0) -> None:
        """Stop taking messages, drain turns in flight (bounded), then close everything."""
        if self._stopping:
            return
        self._stopping = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + drain_seconds
        reserve = min(1.0, drain_seconds / 4)
        await _cancel(self._retries, reserve)
        await self._drain(max(deadline - reserve - loop.time(), 0.0), reserve)
        for phase, closers in (
            ("connector", {h.bot.id: h.connector.aclose for h in self._hosted.values()}),
            ("agent", {name: agent.aclose for name, agent in self._agents.items()}),
            ("activity", {"feed": self.activity.aclose}),
            ("request log", {"calls": lambda: self._drain_log(deadline - loop.time(), reserve)}),
            ("state", {self.config.state.backend: self.state.aclose, "calls": self.calls.aclose}),
            ("http", {"server": self._http.aclose} if self._started else {}),
        ):
            budget = max(deadline - loop.time(), reserve)
            await asyncio.gather(
                *(_close(f"{phase} {name}", close, budget) for name, close in closers.items())
            )
        log.info("gateway stopped")

    async def _drain_log(self, seconds: float, reserve: float) -> None:
        """Write the queued request-log entries within half the time left (at least `reserve`).

        Half: what `drain` cannot write in time it cancels, within the phase's bound.
        """
        await self.request_log.drain(max(seconds, reserve) / 2)

    async def _drain(self, seconds: float, grace: float) -> None:
        """Wait for turns in flight up to `seconds`, then cancel the rest."""
        if not self._turns:
            return
        log.info("draining %d turn(s) in flight", len(self._turns))
        _, pending = await asyncio.wait(set(self._turns), timeout=seconds)
        if pending:
            log.warning("%d turn(s) still running after %.1fs: cancelled", len(pending), seconds)
            await _cancel(pending, grace)


async def _cancel(tasks: Iterable[asyncio.Task[Any]], grace: float) -> None:
    """Cancel tasks and give them `grace` seconds to unwind."""
    pending = set(tasks)
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.wait(pending, timeout=grace)


async def _close(name: str, close: Callable[[], Awaitable[None]], seconds: float) -> None:
    """Close one component within `seconds`; a failure is logged, never raised."""
    try:
        async with asyncio.timeout(seconds):
            await close()
    except Exception:  # closing must go on for every other component
        log.warning("closing %s failed", name, exc_info=True)
