"""`loopwarden proxy --config FILE`: the LLM-call proxy, until SIGINT/SIGTERM.

Decisions where DESIGN.md is silent: on SIGINT or SIGTERM the requests in flight
(streams included) finish within `proxy.drain_seconds`, then alert deliveries and
request-log writes, then it exits 0. A config without a `proxy:` section is a config
error (exit 2); a proxy that fails to start exits 1.
"""

from __future__ import annotations

import asyncio
import logging

from gateway.app.errors import ConfigError
from gateway.cli.command import Subcommands, print_config_error
from gateway.cli.serving import add_serving, stop_on_signals
from gateway.cli.workers import Worker
from gateway.config import Config
from gateway.observability.telemetry import setup_telemetry
from gateway.proxy.app import ProxyServer

log = logging.getLogger("loopwarden")


def add(subcommands: Subcommands) -> None:
    """The `proxy` subcommand."""
    add_serving(
        subcommands,
        "proxy",
        serve_proxy,
        address=_address,
        bots=False,
        help="run the LLM-call proxy until SIGINT/SIGTERM",
        description="Serve the OpenAI-, Anthropic- and Gemini-compatible proxy routes; on "
        "SIGINT/SIGTERM drain requests in flight and exit 0.",
    )


def _address(config: Config) -> tuple[str, int] | None:
    return None if config.proxy is None else (config.proxy.host, config.proxy.port)


async def serve_proxy(config: Config, worker: Worker | None = None) -> int:
    """Run the proxy for `config` (as `worker`, if one) until SIGINT/SIGTERM; the exit code."""
    try:
        server = ProxyServer(config, sock=None if worker is None else worker.sock)
        telemetry = setup_telemetry(config.telemetry, "loopwarden-proxy", server.metrics)
    except ConfigError as exc:
        print_config_error(exc)
        return 2
    if worker is not None:
        worker.attach(server.app, server.metrics.render)
    with stop_on_signals("stopping the proxy") as stop:
        fresh: asyncio.Task[None] | None = None
        try:
            await server.start()
            fresh = asyncio.create_task(telemetry.keep_fresh(server.refresh_budget_gauges))
            if worker is not None:
                worker.serving()
            await stop.wait()
        except Exception:
            log.exception("the proxy failed to start")
            return 1
        finally:
            if fresh is not None:
                fresh.cancel()
            await server.stop()
            telemetry.shutdown()
    return 0
