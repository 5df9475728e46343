"""What the long-running subcommands (`run`, `proxy`) share: their options, logging, signals.

Decisions where DESIGN.md is silent:
- They take `--loop auto|asyncio|uvloop` (gateway/app/eventloop.py: uvloop when installed).
- SIGINT and SIGTERM alike stop them: the server drains what is in flight, then exits 0.
- They take `--workers N`: N processes on the one port (gateway/cli/workers.py).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager

from gateway.app import eventloop
from gateway.cli import workers
from gateway.cli.command import Handler, Subcommands, add_parser, config_option, with_config
from gateway.cli.workers import Port, Supervisor, Worker
from gateway.config import Config
from gateway.observability.logs import configure_logging, secret_values

log = logging.getLogger("loopwarden")

Serve = Callable[[Config, Worker | None], Coroutine[object, object, int]]
# Where a command serves (host, port), or None when its config has no such section.
Address = Callable[[Config], tuple[str, int] | None]

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def add_serving(
    subcommands: Subcommands,
    name: str,
    serve: Serve,
    *,
    address: Address,
    bots: bool,
    help: str,
    description: str,
) -> None:
    """Add a long-running subcommand: `--config`, `--log-level`, `--loop`, `--workers`.

    `serve` runs one process's server (a worker's, given its `Worker`); `address` is where
    the workers listen; `bots` whether the command hosts the config's bots.
    """
    parser = add_parser(subcommands, name, help=help, description=description)
    parser.add_argument(
        "--log-level",
        type=str.upper,
        choices=("DEBUG", "INFO", "WARNING", "ERROR"),
        help="log level (default: $LOOPWARDEN_LOG_LEVEL or INFO)",
    )
    parser.add_argument(
        "--loop",
        choices=eventloop.LOOP_CHOICES,
        default="auto",
        help="event loop (auto: uvloop when installed, else asyncio's)",
    )
    workers.add_workers_option(parser)
    config_option(parser)
    parser.set_defaults(handler=_serving(serve, address, bots=bots))


def _serving(serve: Serve, address: Address, *, bots: bool) -> Handler:
    """A long-running subcommand's handler: load `--config`, set up logging, run `serve`."""

    def run(args: argparse.Namespace, config: Config) -> int:
        try:
            configure_logging(args.log_level, secret_values(config))
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        try:
            loop = eventloop.loop_name(args.loop)
        except eventloop.LoopUnavailableError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        listen = address(config)
        if args.workers == 1 or listen is None:  # without the section `serve` says what is missing
            return eventloop.run(serve(config, None), choice=loop)
        problem = workers.refusal(config, args.workers, bots=bots)
        if problem is not None:
            print(f"config error: {problem}", file=sys.stderr)
            return 2
        try:
            port = Port(*listen)
        except OSError as exc:
            print(f"error: cannot listen on {listen[0]}:{listen[1]}: {exc}", file=sys.stderr)
            return 1

        def work(worker: Worker) -> int:
            return eventloop.run(serve(config, worker), choice=loop)

        return Supervisor(args.workers, port, work).run()

    return with_config(run)


@contextmanager
def stop_on_signals(note: str) -> Iterator[asyncio.Event]:
    """An event that SIGINT/SIGTERM set (logging `note`) while the block runs."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def on_signal(signum: signal.Signals) -> None:
        log.info("%s received: %s", signum.name, note)
        stop.set()

    for signum in _STOP_SIGNALS:
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        yield stop
    finally:
        for signum in _STOP_SIGNALS:
            loop.remove_signal_handler(signum)
