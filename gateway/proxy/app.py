"""The LLM-call proxy: an aiohttp reverse proxy that stops repeated calls before the provider.

Routes: `/openai/v1/{path}`, `/anthropic/{path}` and `/gemini/{path}` (any method),
`/healthz`, and the admin API's `GET /admin/circuits` and `POST /admin/circuits/reopen`
(bearer `proxy.admin_token`). Every request must carry a proxy key the way its SDK sends
its api_key; the key names the agent. An LLM call (see each provider module) is
fingerprinted and decided by the CallStore of the configured state backend before it is
forwarded with the upstream's own key; a refusal is an error in the provider's format
(429; 400 on the Gemini routes, see `gemini`) with `Retry-After`, `x-should-retry: false`
and `x-loopwarden-code`. Responses, streams included, are relayed chunk by chunk as they
arrive.

Decisions where DESIGN.md is silent:
- The path after the route prefix is canonicalised once (`paths`): the guard reads that
  form and the upstream gets exactly it; a path with no canonical form under the
  upstream's `base_url` (an encoded `?`, `#`, `;`, `%`, a backslash, a control character,
  a `..` above the route) is a 400 `invalid_path`. An LLM call whose body is not
  acceptable JSON (`gateway.jsonbody`) is a 400 `invalid_json`; neither is forwarded.
- The circuit's root is the key's agent name; when several keys name the same agent, the
  root is `agent~<6 hex digits of the key's hash>`, so each key keeps its own circuits
  and no key ever appears in a message, a log line or the request log.
- Rule fields come from the `X-Loopwarden-Session`, `-Step`, `-Agent`, `-Customer`,
  `-User` and `-Feature` headers, the model from the body; the agent field defaults to
  the key's agent. Those headers are not forwarded upstream.
- Upstream failures (429, 408, 5xx, a timeout, a dropped connection, before or during a
  stream) are uncounted as soon as they are known, so a retry is not taken for a repeat.
  A connection failure answers 502 and a timeout 504, in the provider's format, without
  `x-should-retry` (the SDK may retry them). A stream the upstream drops midway is cut
  off for the client too (the connection is closed), never ended as if complete.
- Upstream keys, in every form `relay.masked_forms` lists, are masked (same length, `*`)
  in relayed bodies, decoded first when the upstream compressed them anyway (a body in
  an encoding the proxy cannot decode is a 502 `upstream_unreadable`, not relayed);
  headers holding one are dropped; the status line carries the standard reason phrase,
  never the upstream's; `Set-Cookie` is not relayed (it is for the upstream's domain).
- A client's retry of a refused call within a few seconds gets the first refusal's code
  and message, not `loop_paused` (`retries`).
- Each guarded call is logged (the request log, written in the background so it never
  delays the next request on the connection) after its response has ended, with the
  SDK's retry number (`x-stainless-retry-count`, sent by the OpenAI and Anthropic SDKs);
  requests forwarded unguarded (model lists, files) are not logged.
- On stop: no new connections; requests in flight get `proxy.drain_seconds`; then alert
  deliveries and log writes in flight get what is left of it (at least a second).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

import aiohttp
from aiohttp import web
from yarl import URL

from gateway.admin import AdminService
from gateway.calls.factory import build_call_store
from gateway.calls.store import CallLogEntry, CallOutcome, CallStore
from gateway.calls.verdicts import rule_group, rule_key
from gateway.config import Config
from gateway.errors import ConfigError
from gateway.http import HttpServer, circuit_admin_routes
from gateway.jsonbody import JsonBodyError
from gateway.proxy import messages
from gateway.proxy.alerts import Alert, Alerter
from gateway.proxy.anthropic import AnthropicProvider
from gateway.proxy.config import ProxyConfig, ProxyKey, Upstream
from gateway.proxy.gemini import GeminiProvider
from gateway.proxy.openai import OpenAIProvider
from gateway.proxy.paths import PathError, canonical_path, upstream_path
from gateway.proxy.pricing import PriceTable
from gateway.proxy.provider import (
    ErrorKind,
    GuardedCall,
    Provider,
    Usage,
    forward_headers,
    response_headers,
)
from gateway.proxy.relay import (
    BodyDecoder,
    EncodedBodyError,
    KeyMasker,
    UsageScanner,
    masked_forms,
)
from gateway.proxy.retries import FirstRefusals
from gateway.state.base import StateStore
from gateway.state.factory import build_state
from guards.call_loop import CallDecision, circuit_key, fingerprint_call, is_provider_failure

log = logging.getLogger("loopwarden.proxy")

SESSION_HEADER = "X-Loopwarden-Session"
FIELD_HEADERS: tuple[tuple[str, str], ...] = (
    ("step", "X-Loopwarden-Step"),
    ("agent", "X-Loopwarden-Agent"),
    ("customer", "X-Loopwarden-Customer"),
    ("user", "X-Loopwarden-User"),
    ("feature", "X-Loopwarden-Feature"),
)
RETRY_HEADER = "x-stainless-retry-count"
MAX_REQUEST_BYTES = 64 * 1024 * 1024
_MIN_DRAIN = 1.0


@dataclass(frozen=True, slots=True)
class ProxyClient:
    """Who a proxy key belongs to: the agent, and the root of its circuits."""

    agent: str
    root: str


def _digest(key: str) -> bytes:
    return hashlib.blake2b(key.encode(), digest_size=32, person=b"lw-proxy-key").digest()


def client_table(keys: Sequence[ProxyKey]) -> dict[bytes, ProxyClient]:
    """The clients by the hash of their key (the raw keys are not kept in the table)."""
    agents = Counter(key.agent for key in keys)
    table: dict[bytes, ProxyClient] = {}
    for key in keys:
        digest = _digest(key.key.get_secret_value())
        root = key.agent if agents[key.agent] == 1 else f"{key.agent}~{digest.hex()[:6]}"
        table[digest] = ProxyClient(agent=key.agent, root=root)
    return table


@dataclass(slots=True)
class _Call:
    """One guarded call on its way through the proxy."""

    provider: Provider
    client: ProxyClient
    call: GuardedCall
    session: str
    circuit: str
    fingerprint: str
    fields: dict[str, str]
    request_bytes: int
    retry: int
    started: float
    decision: CallDecision | None = None


class ProxyServer:
    """The proxy: the aiohttp app, its CallStore, the alerter and the upstream session."""

    def __init__(
        self,
        config: Config,
        *,
        store: CallStore | None = None,
        state: StateStore | None = None,
        alerter: Alerter | None = None,
        wall_clock: Callable[[], float] = time.time,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        proxy = config.proxy
        if proxy is None:
            raise ConfigError("proxy", "required to run the proxy (keys, upstreams, ...)")
        self.config: ProxyConfig = proxy
        self.store = (
            store
            if store is not None
            else build_call_store(
                config.state, proxy.call_loop.policy(), proxy.rules, log_keep=proxy.log_keep
            )
        )
        self.state = state if state is not None else build_state(config.state)
        self.alerter = alerter if alerter is not None else Alerter.from_config(proxy.alerts)
        self._wall_clock = wall_clock
        self._clients = client_table(proxy.keys)
        self._upstreams: dict[str, Upstream] = {
            name: upstream
            for name, upstream in (
                ("openai", proxy.upstreams.openai),
                ("anthropic", proxy.upstreams.anthropic),
                ("gemini", proxy.upstreams.gemini),
            )
            if upstream is not None
        }
        self._secrets = {
            name: masked_forms(upstream.api_key.get_secret_value()) if upstream.api_key else []
            for name, upstream in self._upstreams.items()
        }
        self._first_refusals = FirstRefusals(clock=clock)
        self._prices = PriceTable(proxy.prices, proxy.default_output_tokens)
        self._rules = {rule.name: rule for rule in proxy.rules}
        self._timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=proxy.connect_timeout, sock_read=proxy.read_timeout
        )
        self._session: aiohttp.ClientSession | None = None
        self._background: set[asyncio.Task[None]] = set()
        admin = AdminService(config, self.state, calls=self.store)
        self.app = web.Application(client_max_size=MAX_REQUEST_BYTES)
        self.app.add_routes(
            [
                web.get("/healthz", _healthz),
                *circuit_admin_routes(admin, self.state, proxy.admin_token),
                self._route("/openai/v1/{tail:.*}", OpenAIProvider()),
                self._route("/anthropic/{tail:.*}", AnthropicProvider()),
                self._route("/gemini/{tail:.*}", GeminiProvider()),
            ]
        )
        self._http = HttpServer(
            self.app, proxy.host, proxy.port, shutdown_timeout=proxy.drain_seconds
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
        # No pool limit: each stream in flight holds one upstream connection.
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),
            auto_decompress=False,
            timeout=self._timeout,
        )
        await self._http.start()
        log.info("proxy listening on %s:%d", self.config.host, self.port)

    async def stop(self) -> None:
        """Stop taking connections, drain requests, alerts and log writes, close."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.drain_seconds
        await self._http.aclose()
        remaining = max(deadline - loop.time(), _MIN_DRAIN)
        if self._background:
            await asyncio.wait(set(self._background), timeout=remaining)
        await self.alerter.drain(max(deadline - loop.time(), _MIN_DRAIN))
        session, self._session = self._session, None
        if session is not None:
            await session.close()
        await self.store.aclose()
        await self.state.aclose()
        log.info("proxy stopped")

    async def settle(self) -> None:
        """Wait for the log writes and alert deliveries started so far."""
        if self._background:
            await asyncio.wait(set(self._background))
        await self.alerter.settle()

    def _spawn(self, work: Awaitable[None]) -> None:
        """Run `work` in the background, tracked so `stop` can wait for it."""

        async def run() -> None:
            try:
                await work
            except Exception:  # a lost log line must never take a request down
                log.exception("background work of the proxy failed")

        task = asyncio.create_task(run())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # Requests

    async def _handle(self, request: web.Request, provider: Provider) -> web.StreamResponse:
        started = time.perf_counter()
        presented = provider.credential(request.headers, request.query)
        client = self._clients.get(_digest(presented)) if presented else None
        if client is None:
            return _error(provider, "unauthorized", "invalid_api_key", messages.UNKNOWN_KEY)
        upstream = self._upstreams.get(provider.name)
        if upstream is None:
            text = messages.NO_UPSTREAM.format(provider=provider.name)
            return _error(provider, "not_found", "no_upstream", text)
        try:
            tail = canonical_path(request.match_info["tail"])
        except PathError as exc:
            text = messages.BAD_PATH.format(reason=exc, provider=provider.name)
            return _error(provider, "bad_request", "invalid_path", text)
        body = await request.read()
        try:
            described = provider.describe(request.method, tail, body)
        except JsonBodyError as exc:
            text = messages.BAD_BODY.format(reason=exc)
            return _error(provider, "bad_request", "invalid_json", text)
        if described is None:
            return await self._forward(request, provider, upstream, tail=tail, body=body, call=None)
        call = self._call(request, provider, client, described, size=len(body), started=started)
        call.decision = await self.store.decide(call.circuit, call.fingerprint, call.fields)
        if not call.decision.allowed:
            return self._refuse(call, call.decision)
        return await self._forward(request, provider, upstream, tail=tail, body=body, call=call)

    def _call(
        self,
        request: web.Request,
        provider: Provider,
        client: ProxyClient,
        described: GuardedCall,
        *,
        size: int,
        started: float,
    ) -> _Call:
        headers = request.headers
        session = headers.get(SESSION_HEADER, "")
        fields = {name: value for name, header in FIELD_HEADERS if (value := headers.get(header))}
        if session:
            fields["session"] = session
        fields.setdefault("agent", client.agent)
        fields["model"] = described.model
        try:
            retry = int(headers.get(RETRY_HEADER, "0"))
        except ValueError:
            retry = 0
        return _Call(
            provider=provider,
            client=client,
            call=described,
            session=session,
            circuit=circuit_key(client.root, session or None, fields.get("step")),
            fingerprint=fingerprint_call(described.model, described.messages),
            fields=fields,
            request_bytes=size,
            retry=retry,
            started=started,
        )

    def _refuse(self, call: _Call, refused: CallDecision) -> web.Response:
        """The answer to a refused call; an alert when it opened a pause; a log entry."""
        agent = call.client.agent
        decision = self._first_refusals.answer(call.circuit, call.fingerprint, refused)
        if decision is not refused:
            log.info("agent %s: retry on %s answered as %s", agent, refused.circuit, decision.code)
        elif decision.code == "loop_detected":
            log.warning(
                "agent %s: loop detected on %s (%d identical calls); paused %.0f s",
                agent,
                decision.circuit,
                decision.count,
                decision.retry_after,
            )
            text = messages.loop_alert(
                agent=agent,
                session=call.session,
                circuit=decision.circuit,
                count=decision.count,
                pause=decision.retry_after,
            )
            self._alert(call, decision, decision.circuit, text)
        elif decision.code == "duplicate_call" and self._pauses(decision.rule):
            rule = self._rules[str(decision.rule)]
            key = rule_key(rule, call.fingerprint, call.fields)
            group = rule_group(rule, key) if key is not None else decision.circuit
            log.warning("agent %s: rule %s paused %s", agent, rule.name, group)
            text = messages.rule_alert(
                agent=agent,
                session=call.session,
                group=group,
                rule=rule.name,
                count=decision.count,
                pause=decision.retry_after,
            )
            self._alert(call, decision, group, text)
        else:
            log.info("agent %s: %s on %s", agent, decision.code, decision.circuit)
        outcome: CallOutcome = decision.code if decision.code != "ok" else "forwarded"
        self._log(call, outcome, None, None, rule=decision.rule)
        seconds = max(0, math.ceil(decision.retry_after))
        headers = {
            "Retry-After": str(seconds),
            "x-should-retry": "false",
            "x-loopwarden-code": decision.code,
        }
        if decision.rule is not None:
            headers["x-loopwarden-rule"] = decision.rule
        text = messages.refusal(
            decision.message, code=decision.code, agent=agent, session=call.session
        )
        return _error(call.provider, "refused", decision.code, text, headers)

    def _pauses(self, rule: str | None) -> bool:
        return rule is not None and rule in self._rules and self._rules[rule].action == "pause"

    def _alert(self, call: _Call, decision: CallDecision, paused: str, text: str) -> None:
        self.alerter.notify(
            Alert(
                agent=call.client.agent,
                session=call.session,
                circuit=paused,
                count=decision.count,
                code=decision.code,
                subject=messages.alert_subject(call.client.agent, decision.code),
                text=text,
            )
        )

    async def _forward(
        self,
        request: web.Request,
        provider: Provider,
        upstream: Upstream,
        *,
        tail: str,
        body: bytes,
        call: _Call | None,
    ) -> web.StreamResponse:
        """Send the request upstream with the upstream's key and relay the answer."""
        session = self._session
        if session is None:
            raise web.HTTPServiceUnavailable(text="the proxy is not started")
        api_key = upstream.api_key.get_secret_value() if upstream.api_key else None
        headers = forward_headers(request.headers)
        headers.update(provider.upstream_auth(api_key, request.headers))
        # Encoded already: the client must not re-normalise the canonical path.
        url = URL(provider.upstream_url(upstream.base_url, upstream_path(tail)), encoded=True)
        try:
            answer = await session.request(
                request.method,
                url,
                params=provider.upstream_query(request.query),
                data=body or None,
                headers=headers,
                allow_redirects=False,
            )
        except TimeoutError:
            return await self._failed(provider, call, "timeout", "upstream_timeout", "timeout")
        except aiohttp.ClientError as exc:
            reason = type(exc).__name__
            return await self._failed(provider, call, "unreachable", "upstream_unreachable", reason)
        async with answer:
            return await self._relay(request, provider, answer, call)

    async def _failed(
        self, provider: Provider, call: _Call | None, kind: ErrorKind, code: str, reason: str
    ) -> web.Response:
        """The upstream gave no answer: uncount the call, log it, answer 502/504."""
        log.warning("%s upstream failed: %s", provider.name, reason)
        if call is not None and call.decision is not None:
            await self.store.record_outcome(call.decision, None, reason)
            self._log(call, "upstream_error", None, None)
        if kind == "timeout":
            text = messages.UPSTREAM_TIMEOUT.format(provider=provider.name)
        else:
            text = messages.UPSTREAM_UNREACHABLE.format(provider=provider.name, reason=reason)
        return _error(provider, kind, code, text)

    async def _relay(
        self,
        request: web.Request,
        provider: Provider,
        answer: aiohttp.ClientResponse,
        call: _Call | None,
    ) -> web.StreamResponse:
        """Relay status, headers and body chunk by chunk, masking keys and reading usage."""
        status = answer.status
        if call is not None and call.decision is not None and is_provider_failure(status):
            # Known before the body: uncount now, so a prompt retry is not a repeat.
            await self.store.record_outcome(call.decision, status)
        try:
            decoder = BodyDecoder(answer.headers.get("Content-Encoding", ""))
        except EncodedBodyError as exc:
            return self._unreadable(provider, call, status, str(exc))
        secrets = self._secrets[provider.name]
        headers = response_headers(answer.headers, secrets)
        if decoder.encoding is not None:
            headers.popall("Content-Encoding", None)
        # The standard reason phrase: the upstream's own may quote the key it was sent.
        response = web.StreamResponse(status=status, headers=headers)
        if decoder.encoding is None and answer.content_length is not None:
            response.content_length = answer.content_length
        masker = KeyMasker(secrets)
        scanner = (
            UsageScanner(provider.usage, sse=answer.content_type == "text/event-stream")
            if call is not None
            else None
        )
        await response.prepare(request)
        broken: str | None = None
        try:
            while True:
                try:
                    chunk = await answer.content.readany()
                    plain = decoder.feed(chunk) if chunk else decoder.finish()
                except (aiohttp.ClientError, TimeoutError, EncodedBodyError) as exc:
                    broken = type(exc).__name__
                    break
                if scanner is not None:
                    scanner.feed(plain)
                await response.write(masker.feed(plain))
                if not chunk:
                    break
            if broken is None:
                await response.write(masker.flush())
                await response.write_eof()
        except ConnectionError:
            # The client went away; the call did reach the provider and stays counted.
            log.info("%s client disconnected during the response", provider.name)
        if broken is not None:
            log.warning("%s upstream response broke off midway: %s", provider.name, broken)
            # Cut the client off too: ending the body normally would pass it as complete.
            if request.transport is not None:
                request.transport.close()
        if call is not None and call.decision is not None:
            if broken is not None and not is_provider_failure(status):
                await self.store.record_outcome(call.decision, None, broken)
            usage = scanner.finish() if scanner is not None else None
            outcome: CallOutcome = (
                "forwarded" if status < 400 and broken is None else "upstream_error"
            )
            self._log(call, outcome, status, usage)
        return response

    def _unreadable(
        self, provider: Provider, call: _Call | None, status: int, reason: str
    ) -> web.Response:
        """An answer that cannot be checked for keys: a 502 instead, logged, never retried."""
        log.warning("%s upstream answered in an unreadable encoding: %s", provider.name, reason)
        if call is not None:
            self._log(call, "upstream_error", status, None)
        text = messages.UPSTREAM_UNREADABLE.format(provider=provider.name, reason=reason)
        # The upstream answers every retry the same way.
        headers = {"x-should-retry": "false"}
        return _error(provider, "unreachable", "upstream_unreadable", text, headers)

    def _log(
        self,
        call: _Call,
        outcome: CallOutcome,
        status: int | None,
        usage: Usage | None,
        *,
        rule: str | None = None,
    ) -> None:
        """Write the call's request-log entry in the background, with its (estimated) cost."""
        model = call.call.model
        reported = usage or Usage()
        if outcome == "forwarded" and reported.output_tokens is not None:
            self._prices.observe(model, reported.output_tokens)
        guess_in, guess_out = self._prices.estimate(model, call.request_bytes)
        input_tokens = guess_in if reported.input_tokens is None else reported.input_tokens
        output_tokens = guess_out if reported.output_tokens is None else reported.output_tokens
        estimated = reported.input_tokens is None or reported.output_tokens is None
        entry = CallLogEntry(
            at=self._wall_clock(),
            provider=call.provider.name,
            agent=call.client.agent,
            session=call.session,
            circuit=call.circuit,
            model=model,
            outcome=outcome,
            status=status,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            cost=self._prices.cost(model, input_tokens, output_tokens),
            estimated=estimated,
            fingerprint=call.fingerprint,
            rule=rule,
            retry=call.retry,
            duration_ms=round((time.perf_counter() - call.started) * 1000, 3),
            fields=dict(call.fields),
        )
        log.debug(
            "%s %s %s %s status=%s tokens=%s+%s",
            call.provider.name,
            call.circuit,
            model,
            outcome,
            status,
            input_tokens,
            output_tokens,
        )
        self._spawn(self.store.log_call(entry))


async def _healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok")


def _error(
    provider: Provider,
    kind: ErrorKind,
    code: str,
    message: str,
    headers: Mapping[str, str] | None = None,
) -> web.Response:
    """An error answer in the provider's own format; never retried by the SDKs when refused."""
    extra = dict(headers or {})
    if kind in ("bad_request", "unauthorized", "not_found"):
        extra.setdefault("x-should-retry", "false")
    return web.json_response(
        provider.error_body(kind, code, message), status=provider.status(kind), headers=extra
    )
