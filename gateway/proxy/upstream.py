"""Forwarding a request to its upstream and relaying the answer: whole, or chunk by chunk.

The upstream gets the canonical path (encoded once, never re-normalised by the HTTP
client), the client's headers without credentials and our own, and the upstream's own
key. Upstream failures (429, 408, 5xx, a timeout, a dropped connection, before or during
a stream) are uncounted as soon as they are known, so a retry is not taken for a repeat.
A connection failure answers 502 and a timeout 504, in the provider's format, without
`x-should-retry` (the SDK may retry them). A stream the upstream drops midway is cut off
for the client too (the connection is closed), never ended as if complete. Bodies are
decoded, masked and read for usage by `relay`: streams and large or compressed answers
chunk by chunk as they come, other answers whole (`relay.WHOLE_BODY_MAX`; one that breaks
off is cut off before any of it is sent); the status line carries the standard
reason phrase, never the upstream's (it may quote the key it was sent). A client that
hangs up mid-reply is one INFO line naming the circuit, never a traceback; the call's
usage, when the upstream sent it, is still charged to its budgets (`budgets.settle`).
"""

from __future__ import annotations

import logging

import aiohttp
from aiohttp import web
from yarl import URL

from gateway.calls.entry import CallOutcome
from gateway.calls.store import CallStore
from gateway.config.proxy import ProxyConfig, Upstream
from gateway.observability import tracing
from gateway.proxy import messages
from gateway.proxy.budgets import ProxyBudgets
from gateway.proxy.calls import ProxiedCall
from gateway.proxy.metrics import ProxyMetrics
from gateway.proxy.paths import upstream_path
from gateway.proxy.provider import (
    ErrorKind,
    Provider,
    error_response,
    forward_headers,
    response_headers,
)
from gateway.proxy.relay import (
    WHOLE_BODY_MAX,
    BodyDecoder,
    EncodedBodyError,
    KeyMasker,
    UsageScanner,
    masked_forms,
)
from gateway.proxy.request_log import RequestLog
from guards.call_loop import is_provider_failure

log = logging.getLogger("loopwarden.proxy")

# Upstream URLs are built once per path (a yarl URL costs microseconds a request): for the
# first URL_CACHE_MAX distinct paths up to URL_CACHE_PATH_MAX characters, so a client
# sending endless distinct paths costs at most that memory, and its paths are built anew.
URL_CACHE_MAX = 256
URL_CACHE_PATH_MAX = 256


class Upstreams:
    """The configured upstreams, their keys' masked forms, and one HTTP session to them."""

    def __init__(
        self,
        config: ProxyConfig,
        store: CallStore,
        request_log: RequestLog,
        budgets: ProxyBudgets,
        metrics: ProxyMetrics,
    ) -> None:
        self._metrics = metrics
        self._upstreams: dict[str, Upstream] = {
            name: upstream
            for name, upstream in (
                ("openai", config.upstreams.openai),
                ("anthropic", config.upstreams.anthropic),
                ("gemini", config.upstreams.gemini),
            )
            if upstream is not None
        }
        self._secrets = {
            name: masked_forms(upstream.api_key.get_secret_value()) if upstream.api_key else []
            for name, upstream in self._upstreams.items()
        }
        self._store = store
        self._log = request_log
        self._budgets = budgets
        self._timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=config.connect_timeout, sock_read=config.read_timeout
        )
        self._session: aiohttp.ClientSession | None = None
        self._urls: dict[tuple[str, str], URL] = {}

    def get(self, provider: Provider) -> Upstream | None:
        """The upstream configured for a provider's routes, if any."""
        return self._upstreams.get(provider.name)

    def start(self) -> None:
        """Open the HTTP session (inside the running event loop)."""
        # No pool limit: each stream in flight holds one upstream connection.
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),
            auto_decompress=False,
            timeout=self._timeout,
            # One session serves every client: a cookie one upstream answer sets must not
            # ride along on another client's calls.
            cookie_jar=aiohttp.DummyCookieJar(),
        )

    async def aclose(self) -> None:
        """Close the HTTP session."""
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    async def forward(
        self,
        request: web.Request,
        provider: Provider,
        upstream: Upstream,
        *,
        tail: str,
        body: bytes,
        call: ProxiedCall | None,
    ) -> web.StreamResponse:
        """Send the request upstream with the upstream's key and relay the answer.

        A guarded call's time before this point and its time upstream (up to its answer's
        end, the charge's start included) are counted in the proxy's metrics.
        """
        session = self._session
        if session is None:
            raise web.HTTPServiceUnavailable(text=messages.NOT_STARTED)
        api_key = upstream.api_key.get_secret_value() if upstream.api_key else None
        headers = forward_headers(request.headers)
        headers.update(provider.upstream_auth(api_key, request.headers))
        tracing.tracer().inject(headers)  # the `chat` span's traceparent, tracing on
        url = self._url(provider, upstream, tail)
        query = provider.upstream_query(request.query) if request.query else None
        sent = self._log.started()
        try:
            try:
                answer = await session.request(
                    request.method,
                    url,
                    params=query,
                    data=body or None,
                    headers=headers,
                    allow_redirects=False,
                )
            except TimeoutError:
                return await self._failed(provider, call, "timeout", "upstream_timeout", "timeout")
            except aiohttp.ClientError as exc:
                reason = type(exc).__name__
                return await self._failed(
                    provider, call, "unreachable", "upstream_unreachable", reason
                )
            async with answer:
                return await self._relay(request, provider, answer, call)
        finally:
            if call is not None:
                waited = self._log.started() - sent
                self._metrics.forwarded(provider.name, added=sent - call.started, upstream=waited)

    def _url(self, provider: Provider, upstream: Upstream, tail: str) -> URL:
        """The upstream URL of a canonical path, built once for the paths seen first."""
        urls = self._urls
        url = urls.get((provider.name, tail))
        if url is None:
            # Encoded already: the client must not re-normalise the canonical path.
            url = URL(provider.upstream_url(upstream.base_url, upstream_path(tail)), encoded=True)
            if len(urls) < URL_CACHE_MAX and len(tail) <= URL_CACHE_PATH_MAX:
                urls[provider.name, tail] = url
        return url

    async def _failed(
        self, provider: Provider, call: ProxiedCall | None, kind: ErrorKind, code: str, reason: str
    ) -> web.Response:
        """The upstream gave no answer: uncount the call, log it, answer 502/504."""
        log.warning("%s upstream failed: %s", provider.name, reason)
        if call is not None and call.decision is not None:
            await self._store.record_outcome(call.decision, None, reason)
            entry = self._log.record(call, "upstream_error", None, None)
            await self._budgets.settle(call, entry, None, status=None, error=reason)
        if kind == "timeout":
            text = messages.UPSTREAM_TIMEOUT.format(provider=provider.name)
        else:
            text = messages.UPSTREAM_UNREACHABLE.format(provider=provider.name, reason=reason)
        return error_response(provider, kind, code, text)

    async def _relay(
        self,
        request: web.Request,
        provider: Provider,
        answer: aiohttp.ClientResponse,
        call: ProxiedCall | None,
    ) -> web.StreamResponse:
        """Relay status, headers and body, masking keys and reading usage; then log and charge.

        An answer that is no stream, in identity encoding, with a Content-Length up to
        `WHOLE_BODY_MAX` is relayed whole (`_send_whole`); any other chunk by chunk.
        """
        status = answer.status
        if call is not None and call.decision is not None and is_provider_failure(status):
            # Known before the body: uncount now, so a prompt retry is not a repeat.
            await self._store.record_outcome(call.decision, status)
        try:
            decoder = BodyDecoder(answer.headers.get("Content-Encoding", ""))
        except EncodedBodyError as exc:
            return await self._unreadable(provider, call, status, str(exc))
        secrets = self._secrets[provider.name]
        headers = response_headers(answer.headers, secrets)
        length = answer.content_length
        sse = answer.content_type == "text/event-stream"
        masker = KeyMasker(secrets)
        scanner = UsageScanner(provider.usage, sse=sse) if call is not None else None
        small = length is not None and length <= WHOLE_BODY_MAX
        response: web.StreamResponse
        broken: str | None = None
        try:
            if small and decoder.encoding is None and not sse:
                # Kept as the upstream sent it: the masked body is as long, and a HEAD
                # answer's length is the resource's.
                headers["Content-Length"] = str(length)
                response = web.Response(status=status, headers=headers)
                broken = await _send_whole(request, answer, response, masker, scanner)
            else:
                if decoder.encoding is not None:
                    headers.popall("Content-Encoding", None)
                response = web.StreamResponse(status=status, headers=headers)
                if decoder.encoding is None and length is not None:
                    response.content_length = length
                broken = await _stream(request, answer, response, masker, scanner, decoder=decoder)
        except ConnectionError:
            # The client went away (every `wrk` run ends so): one line, no traceback. The
            # call did reach the provider: it stays counted, and is charged.
            circuit = call.circuit if call is not None else "an unguarded request"
            log.info("%s client disconnected during the response on %s", provider.name, circuit)
        if broken is not None:
            log.warning("%s upstream response broke off midway: %s", provider.name, broken)
            # Cut the client off too: ending the body normally would pass it as complete.
            if request.transport is not None:
                request.transport.close()
        if call is not None and call.decision is not None:
            if broken is not None and not is_provider_failure(status):
                await self._store.record_outcome(call.decision, None, broken)
            usage = scanner.finish() if scanner is not None else None
            outcome: CallOutcome = (
                "forwarded" if status < 400 and broken is None else "upstream_error"
            )
            entry = self._log.record(call, outcome, status, usage)
            await self._budgets.settle(call, entry, usage, status=status, error=broken)
        return response

    async def _unreadable(
        self, provider: Provider, call: ProxiedCall | None, status: int, reason: str
    ) -> web.Response:
        """An answer that cannot be checked for keys: a 502 instead, logged, never retried."""
        log.warning("%s upstream answered in an unreadable encoding: %s", provider.name, reason)
        if call is not None:
            entry = self._log.record(call, "upstream_error", status, None)
            await self._budgets.settle(call, entry, None, status=status)
        text = messages.UPSTREAM_UNREADABLE.format(provider=provider.name, reason=reason)
        # The upstream answers every retry the same way.
        headers = {"x-should-retry": "false"}
        return error_response(provider, "unreachable", "upstream_unreadable", text, headers)


async def _send_whole(
    request: web.Request,
    answer: aiohttp.ClientResponse,
    response: web.Response,
    masker: KeyMasker,
    scanner: UsageScanner | None,
) -> str | None:
    """Read the whole body, then send it masked with the headers in one write.

    Returns why the upstream broke off, if it did; then nothing has been sent.
    """
    try:
        body = await answer.read()
    except (aiohttp.ClientError, TimeoutError) as exc:
        return type(exc).__name__
    if scanner is not None:
        scanner.whole(body)
    response.body = masker.whole(body)
    await response.prepare(request)
    await response.write_eof()
    return None


async def _stream(
    request: web.Request,
    answer: aiohttp.ClientResponse,
    response: web.StreamResponse,
    masker: KeyMasker,
    scanner: UsageScanner | None,
    *,
    decoder: BodyDecoder,
) -> str | None:
    """Relay the body chunk by chunk as it comes, decoded and masked.

    Returns why the upstream broke off, if it did; then the body is left unended.
    """
    await response.prepare(request)
    while True:
        try:
            chunk = await answer.content.readany()
            plain = decoder.feed(chunk) if chunk else decoder.finish()
        except (aiohttp.ClientError, TimeoutError, EncodedBodyError) as exc:
            return type(exc).__name__
        if scanner is not None:
            scanner.feed(plain)
        # Empty writes are skipped: each is a round through aiohttp's writer.
        if sendable := masker.feed(plain):
            await response.write(sendable)
        if not chunk:
            break
    if held := masker.flush():
        await response.write(held)
    await response.write_eof()
    return None
