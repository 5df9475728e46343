"""The gateway's own HTTP server: health, readiness and metrics.

Connectors add their webhook routes (Slack Events API, Telegram webhook), the demo room its
page, and the composition root the admin API and console (`gateway.admin`) to the same
application before it starts; this module owns only the server and its three probes.

Decisions where DESIGN.md is silent:
- `/readyz` answers JSON either way: `{"ready": true}` or, with 503,
  `{"ready": false, "stopping": …, "not_connected": [bot ids]}`; with no bots configured
  the gateway is ready as soon as it is up. While stopping it is never ready, so a load
  balancer drains it.
- No per-request access log (probes would flood it); admin calls are audit-logged instead
  (`gateway.admin.api`).
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web

from gateway.observability.metrics import Metrics


@dataclass(frozen=True, slots=True)
class Readiness:
    """Whether the gateway takes traffic: up, not stopping, and every bot connected."""

    stopping: bool
    not_connected: tuple[str, ...]

    @property
    def ready(self) -> bool:
        """True when traffic may be routed here."""
        return not self.stopping and not self.not_connected


def create_app(
    *,
    readiness: Callable[[], Readiness],
    metrics: Metrics,
) -> web.Application:
    """The gateway's aiohttp application with its probes, before anything adds routes."""

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def readyz(request: web.Request) -> web.Response:
        state = readiness()
        if state.ready:
            return web.json_response({"ready": True})
        body = {
            "ready": False,
            "stopping": state.stopping,
            "not_connected": list(state.not_connected),
        }
        return web.json_response(body, status=503)

    async def prometheus(request: web.Request) -> web.Response:
        return web.Response(body=metrics.render(), headers={"Content-Type": metrics.content_type})

    app = web.Application()
    app.add_routes(
        [web.get("/healthz", healthz), web.get("/readyz", readyz), web.get("/metrics", prometheus)]
    )
    return app


class HttpServer:
    """Runs an application on host:port; port 0 picks a free port, exposed as `port`.

    Given `sock`, a listening socket (one of `--workers`' processes: gateway/cli/workers.py),
    it serves that socket instead of binding host:port itself.
    """

    def __init__(
        self,
        app: web.Application,
        host: str,
        port: int,
        *,
        shutdown_timeout: float = 2.0,
        sock: socket.socket | None = None,
    ) -> None:
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=shutdown_timeout)
        self._host = host
        self._port = port
        self._sock = sock

    @property
    def port(self) -> int:
        """The bound port (the configured one until started)."""
        return self._port

    async def start(self) -> None:
        """Bind and serve; the application's router is frozen from here on."""
        await self._runner.setup()
        site: web.BaseSite
        if self._sock is None:
            site = web.TCPSite(self._runner, self._host, self._port)
        else:
            site = web.SockSite(self._runner, self._sock)
        await site.start()
        address = self._runner.addresses[0]
        self._port = int(address[1])

    async def aclose(self) -> None:
        """Stop serving and release the socket."""
        await self._runner.cleanup()
