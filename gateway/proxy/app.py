"""The LLM-call proxy: an aiohttp reverse proxy that stops repeated calls before the provider.

Routes: `/openai/v1/{path}`, `/anthropic/{path}` and `/gemini/{path}` (any method),
`/healthz`, `/metrics` (Prometheus, `gateway.proxy.metrics`; open like the gateway's),
and the admin API's `GET /admin/circuits`, `POST /admin/circuits/reopen`,
`GET /admin/spend`, `POST /admin/spend/limit`, `POST /admin/spend/reset` (bearer
`proxy.admin_token`; `spend`), `GET /admin/calls`, `/admin/calls.csv`,
`/admin/calls/series` and `/admin/rules` (`gateway.admin.calls`) and
`GET /admin/audit`, and the console at `/console`
(`gateway.admin.console`; signed in with `proxy.admin_token`, its sessions lasting
`http.console_session_hours`). `ProxyServer` routes and composes; each step is a module:
`auth` (the proxy key names the agent), `paths` (the one canonical path), the provider
module (`openai`, `anthropic`, `gemini`: is it an LLM call, of which model and
conversation), `calls` (circuit, rule fields, fingerprint), the CallStore's decision
with the budgets (`budgets`: a `budget_exceeded` refusal, the charge after the call),
then `refusal` (the answer to a refused call, and its alert) or `upstream` (forwarding,
relaying with `relay`), and `request_log` (the entry, written after the response). A
refusal of a guard in shadow mode is forwarded instead, marked (`shadow`). Admission,
the shadow waiver and the refusal's log entry are the guarded call's (`guarded`), the
same steps the gateway's `openai` agents take.

Decisions where DESIGN.md is silent:
- A request without a known proxy key is a 401, before anything else is read. A path
  with no canonical form under the upstream's `base_url` is a 400 `invalid_path`; an LLM
  call whose body is not acceptable JSON (`gateway.app.jsonbody`) is a 400 `invalid_json`;
  neither is forwarded; nor is a call whose rule field (a header, the model name) is
  not valid Unicode text: 400 `invalid_field`. A provider with no upstream configured
  is a 404 `no_upstream`.
- Requests that are not LLM calls (model lists, files) are forwarded unguarded, still
  behind the proxy key, and not logged.
- On stop: no new connections; requests in flight get `proxy.drain_seconds`; then spend
  charges, log writes and alert deliveries in flight get what is left of it (at least a
  second each).
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable

from aiohttp import web

from gateway.admin.access import AdminAccess
from gateway.admin.api import audit_admin_routes, circuit_admin_routes
from gateway.admin.calls import calls_admin_routes
from gateway.admin.console.app import add_console
from gateway.admin.console.links import ConsoleLinks
from gateway.admin.console.sessions import ConsoleSessions
from gateway.admin.service import AdminService
from gateway.app.errors import ConfigError
from gateway.app.eventloop import running
from gateway.app.http import HttpServer
from gateway.app.jsonbody import JsonBodyError
from gateway.calls.factory import build_call_store
from gateway.calls.store import ENFORCED, CallStore
from gateway.config import Config
from gateway.config.proxy import ProxyConfig, Upstream
from gateway.observability.metrics import BudgetFigure
from gateway.proxy import messages
from gateway.proxy.alerts import Alerter
from gateway.proxy.anthropic import AnthropicProvider
from gateway.proxy.auth import Authenticator
from gateway.proxy.budgets import ProxyBudgets
from gateway.proxy.calls import CallFieldError, ProxiedCall, build_call
from gateway.proxy.gemini import GeminiProvider
from gateway.proxy.guarded import GuardedCalls, OverBudget, shadow_code
from gateway.proxy.metrics import ProxyMetrics
from gateway.proxy.openai import OpenAIProvider
from gateway.proxy.paths import PathError, canonical_path
from gateway.proxy.pricing import PriceTable
from gateway.proxy.provider import Provider, error_response
from gateway.proxy.refusal import Refusals
from gateway.proxy.request_log import RequestLog
from gateway.proxy.shadow import SHADOW_CODE, add_shadow_header, shadow_guards
from gateway.proxy.spend import spend_admin_routes, spend_rows
from gateway.proxy.upstream import Upstreams
from gateway.state.base import StateStore
from gateway.state.factory import build_state

log = logging.getLogger("loopwarden.proxy")

MAX_REQUEST_BYTES = 64 * 1024 * 1024
_MIN_DRAIN = 1.0


class ProxyServer:
    """The proxy: the aiohttp app, its CallStore, the alerter and the upstreams."""

    def __init__(
        self,
        config: Config,
        *,
        store: CallStore | None = None,
        state: StateStore | None = None,
        alerter: Alerter | None = None,
        wall_clock: Callable[[], float] = time.time,
        clock: Callable[[], float] = time.monotonic,
        sock: socket.socket | None = None,
    ) -> None:
        proxy = config.proxy
        if proxy is None:
            raise ConfigError("proxy", "required to run the proxy (keys, upstreams, ...)")
        self.config: ProxyConfig = proxy
        upstreams = proxy.upstreams
        self.metrics = ProxyMetrics(
            name for name in type(upstreams).model_fields if getattr(upstreams, name) is not None
        )
        self.store = (
            store
            if store is not None
            else build_call_store(
                config.state, proxy.call_loop.policy(), proxy.rules, log_keep=proxy.log_keep
            )
        )
        self.state = (
            state if state is not None else build_state(config.state, metrics=self.metrics.state)
        )
        self.metrics.watch_state(self.state)
        self.metrics.watch_calls(self.store)
        self.alerter = alerter if alerter is not None else Alerter.from_config(proxy.alerts)
        self._auth = Authenticator(proxy.keys)
        prices = PriceTable(proxy.prices, proxy.default_output_tokens)
        self._log = RequestLog(self.store, prices, wall_clock=wall_clock, metrics=self.metrics)
        self._refusals = Refusals(self.alerter, clock=clock)
        self._guarded = GuardedCalls(self.store, self._log, log=log)
        shadow = shadow_guards(proxy)
        self._budgets = ProxyBudgets(
            proxy,
            self.store,
            prices,
            self.alerter,
            guarded=self._guarded,
            shadow=shadow,
            wall_clock=wall_clock,
            metrics=self.metrics,
        )
        self._upstreams = Upstreams(proxy, self.store, self._log, self._budgets, self.metrics)
        self._wall_clock = wall_clock
        admin = AdminService(config, self.state, calls=self.store)
        # The console's sessions: the admin API accepts them beside the bearer token.
        self.console = ConsoleSessions(
            hours=config.http.console_session_hours,
            clock=clock,
            links=ConsoleLinks.of("proxy", proxy.port, clock=wall_clock),
        )
        access = AdminAccess(proxy.admin_token, self.console, public_url=proxy.public_url)
        self.app = web.Application(client_max_size=MAX_REQUEST_BYTES)
        if shadow != ENFORCED:  # only a guard in shadow mode marks a response
            self.app.on_response_prepare.append(add_shadow_header)
        self.app.add_routes(
            [
                web.get("/healthz", _healthz),
                web.get("/metrics", self._prometheus),
                *circuit_admin_routes(admin, self.state, access),
                *audit_admin_routes(admin, self.state, access),
                *spend_admin_routes(
                    admin,
                    self.state,
                    access,
                    budgets=self._budgets,
                    store=self.store,
                    clock=wall_clock,
                ),
                *calls_admin_routes(
                    admin,
                    self.state,
                    access,
                    store=self.store,
                    proxy=proxy,
                    clock=wall_clock,
                ),
                self._route("/openai/v1/{tail:.*}", OpenAIProvider()),
                self._route("/anthropic/{tail:.*}", AnthropicProvider()),
                self._route("/gemini/{tail:.*}", GeminiProvider()),
            ]
        )
        add_console(
            self.app,
            access=access,
            product="proxy",
            state=self.state,
            trusted_proxies=config.http.trusted_proxies,
        )
        # `sock`: one of `--workers`' processes serves the socket the workers share.
        self._http = HttpServer(
            self.app, proxy.host, proxy.port, shutdown_timeout=proxy.drain_seconds, sock=sock
        )

    @property
    def port(self) -> int:
        """The bound port (useful with port 0)."""
        return self._http.port

    def _route(self, path: str, provider: Provider) -> web.RouteDef:
        async def handle(request: web.Request) -> web.StreamResponse:
            return await self._handle(request, provider)

        return web.route("*", path, handle)

    async def start(self) -> None:
        """Open the stores and the upstream session, then serve."""
        await self.state.start()
        await self.store.start()
        self._upstreams.start()
        await self._http.start()
        log.info("proxy listening on %s:%d, on %s", self.config.host, self.port, running())

    async def stop(self) -> None:
        """Stop taking connections, drain requests, charges, log writes and alerts, close."""
        clock = time.monotonic
        deadline = clock() + self.config.drain_seconds
        await self._http.aclose()
        await self._budgets.drain(max(deadline - clock(), _MIN_DRAIN))
        await self._log.drain(max(deadline - clock(), _MIN_DRAIN))
        await self.alerter.drain(max(deadline - clock(), _MIN_DRAIN))
        await self._upstreams.aclose()
        await self.store.aclose()
        await self.state.aclose()
        log.info("proxy stopped")

    async def settle(self) -> None:
        """Wait for the charges, log writes and alert deliveries started so far."""
        await self._budgets.wait()
        await self._log.settle()
        await self.alerter.settle()

    async def refresh_budget_gauges(self) -> None:
        """Read the budget groups' spend and limits from the call store into the gauges.

        Before each `/metrics` scrape, and every export interval when metrics go over OTLP
        (`Telemetry.keep_fresh`). A failed read keeps the last figures.
        """
        budgets = self._budgets
        if not budgets.budgets:
            return
        try:
            rows = await spend_rows(
                self.store, budgets.budgets, budgets.periods, self._wall_clock()
            )
        except Exception:  # a scrape still answers; the gauges keep their last figures
            log.exception("reading the budget groups for the budget gauges failed")
        else:
            self.metrics.budget_figures(
                BudgetFigure(row.budget, row.group, row.spent_usd, row.limit_usd) for row in rows
            )

    async def _prometheus(self, request: web.Request) -> web.Response:
        """`/metrics`: the budget gauges read from the call store, then every series."""
        await self.refresh_budget_gauges()
        return web.Response(
            body=self.metrics.render(), headers={"Content-Type": self.metrics.content_type}
        )

    async def _handle(self, request: web.Request, provider: Provider) -> web.StreamResponse:
        """Authenticate, canonicalise, decide; then refuse, or forward and relay."""
        started = self._log.started()
        client = self._auth.client(provider, request.headers, request.query)
        if client is None:
            return error_response(provider, "unauthorized", "invalid_api_key", messages.UNKNOWN_KEY)
        upstream = self._upstreams.get(provider)
        if upstream is None:
            text = messages.NO_UPSTREAM.format(provider=provider.name)
            return error_response(provider, "not_found", "no_upstream", text)
        try:
            tail = canonical_path(request.match_info["tail"])
        except PathError as exc:
            text = messages.BAD_PATH.format(reason=exc, provider=provider.name)
            return error_response(provider, "bad_request", "invalid_path", text)
        body = await request.read()
        try:
            described = provider.describe(request.method, tail, body)
        except JsonBodyError as exc:
            text = messages.BAD_BODY.format(reason=exc)
            return error_response(provider, "bad_request", "invalid_json", text)
        if described is None:
            return await self._upstreams.forward(
                request, provider, upstream, tail=tail, body=body, call=None
            )
        try:
            call = build_call(
                provider, client, request.headers, described, size=len(body), started=started
            )
        except CallFieldError as exc:
            text = messages.BAD_FIELD.format(reason=exc)
            return error_response(provider, "bad_request", "invalid_field", text)
        with self._guarded.chat(call, parent=request.headers):
            return await self._decide(request, provider, upstream, call, tail=tail, body=body)

    async def _decide(
        self,
        request: web.Request,
        provider: Provider,
        upstream: Upstream,
        call: ProxiedCall,
        *,
        tail: str,
        body: bytes,
    ) -> web.StreamResponse:
        """Admit the call on its budgets and the call guard; refuse it, or forward and relay."""
        admitted = await self._budgets.admit(call)
        if isinstance(admitted, OverBudget):
            self._guarded.refused(call, None, unavailable=admitted.spend.unavailable)
            return self._budgets.refusal(call, admitted.spend)
        decision = call.decision = admitted.decision
        if not admitted.sent:
            response, answered = self._refusals.answer(call, decision)
            self._guarded.refused(call, answered)
            return response
        if admitted.waived:
            request[SHADOW_CODE] = shadow_code(decision)
        return await self._upstreams.forward(
            request, provider, upstream, tail=tail, body=body, call=call
        )


async def _healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok")
