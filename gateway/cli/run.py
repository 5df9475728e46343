"""`loopwarden run --config FILE`: the gateway, until SIGINT/SIGTERM.

Decisions where DESIGN.md is silent: on SIGINT or SIGTERM it stops taking messages,
drains the turns in flight for up to `pipeline.drain_seconds` (default 10), closes and
exits 0; a signal that arrives while bots are still connecting stops the start-up the
same way. Exit 2 for a config the gateway cannot be built from, 1 when it fails to start
(port in use, state unreachable).
"""

from __future__ import annotations

import asyncio
import logging

from gateway.app import eventloop
from gateway.app.errors import ConfigError
from gateway.app.runtime import Gateway
from gateway.cli.command import Subcommands, print_config_error
from gateway.cli.serving import add_serving, stop_on_signals
from gateway.cli.workers import Worker
from gateway.config import Config
from gateway.observability.telemetry import setup_telemetry

log = logging.getLogger("loopwarden")


def add(subcommands: Subcommands) -> None:
    """The `run` subcommand."""
    add_serving(
        subcommands,
        "run",
        serve,
        address=_address,
        bots=True,
        help="run the gateway until SIGINT/SIGTERM",
        description="Run the gateway; on SIGINT/SIGTERM drain turns in flight and exit 0.",
    )


def _address(config: Config) -> tuple[str, int]:
    return config.http.host, config.http.port


async def serve(config: Config, worker: Worker | None = None) -> int:
    """Run a Gateway for `config` (as `worker`, if one) until SIGINT/SIGTERM; the exit code."""
    try:
        gateway = Gateway(config, sock=None if worker is None else worker.sock)
        telemetry = setup_telemetry(config.telemetry, "loopwarden", gateway.metrics)
    except ConfigError as exc:
        print_config_error(exc)
        return 2
    except Exception:  # logged, not printed raw: the log filter masks any secret in it
        log.exception("the gateway could not be built")
        return 1
    if worker is not None:
        worker.attach(gateway.app, gateway.metrics.render)
    with stop_on_signals("stopping") as stop:
        starting = asyncio.create_task(gateway.start())
        stopping = asyncio.create_task(stop.wait())
        try:
            await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if starting.done():
                starting.result()
                log.info(
                    "loopwarden running, %d bot(s), http port %d, on %s",
                    len(config.bots),
                    gateway.port,
                    eventloop.running(),
                )
                if worker is not None:
                    worker.serving()
                await stopping
        except Exception:
            log.exception("the gateway failed to start")
            return 1
        finally:
            for task in (starting, stopping):
                task.cancel()
            await asyncio.wait({starting, stopping})
            await gateway.stop(config.pipeline.drain_seconds)
            telemetry.shutdown()
    return 0
