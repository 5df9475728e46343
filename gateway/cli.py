"""The `loopwarden` command line: `run`, `check-config` and `demo`.

Each subcommand is one `_add_<name>(subcommands)` function listed in `SUBCOMMANDS`, which
adds its parser and sets `handler` to a function of the parsed arguments returning the
exit code; a later subcommand (`proxy`, `circuits`, `calls`) is one more such function.

`demo` hands its arguments to `gateway.demo.main`, which owns its options.

Exit codes: 0 success, 2 invalid configuration or usage (`config error: field.path:
reason` on stderr), 1 the gateway failed at start-up (port in use, state unreachable).

Decisions where DESIGN.md is silent:
- `check-config` validates the file and also that every configured platform's connector
  and the state backend can be imported, so a missing extra (`pip install
  'loopwarden[discord]'`) fails the check rather than the first `run`. It connects to
  nothing and imports no agent code.
- `run` handles SIGINT and SIGTERM alike: stop taking messages, drain the turns in flight
  for up to `pipeline.drain_seconds` (default 10), close, exit 0. A signal that arrives
  while bots are still connecting stops the start-up the same way.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Callable, Sequence
from typing import TypeAlias, cast

from gateway import __version__
from gateway.config import Config, load_config
from gateway.errors import ConfigError
from gateway.logs import configure_logging, secret_values
from gateway.runtime import Gateway, load_connector_factory
from gateway.state.factory import require_backend

log = logging.getLogger("loopwarden")

Subcommands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
Handler = Callable[[argparse.Namespace], int]


def _print_config_error(exc: ConfigError) -> None:
    print(f"config error: {exc}", file=sys.stderr)


def _load(path: str) -> Config | None:
    """Load a config, printing the error (None) when it is invalid."""
    try:
        return load_config(path)
    except ConfigError as exc:
        _print_config_error(exc)
        return None


def _logging_options() -> argparse.ArgumentParser:
    """The `--log-level` option shared by long-running subcommands."""
    options = argparse.ArgumentParser(add_help=False)
    options.add_argument(
        "--log-level",
        type=str.upper,
        choices=("DEBUG", "INFO", "WARNING", "ERROR"),
        help="log level (default: $LOOPWARDEN_LOG_LEVEL or INFO)",
    )
    return options


def _add_run(subcommands: Subcommands) -> None:
    parser = subcommands.add_parser(
        "run",
        parents=[_logging_options()],
        help="run the gateway until SIGINT/SIGTERM",
        description="Run the gateway; on SIGINT/SIGTERM drain turns in flight and exit 0.",
    )
    parser.add_argument("--config", required=True, metavar="FILE", help="the YAML config")
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    config = _load(args.config)
    if config is None:
        return 2
    try:
        configure_logging(args.log_level, secret_values(config))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return asyncio.run(serve(config))


async def serve(config: Config) -> int:
    """Run a Gateway for `config` until SIGINT/SIGTERM; return the exit code."""
    try:
        gateway = Gateway(config)
    except ConfigError as exc:
        _print_config_error(exc)
        return 2
    except Exception:  # logged, not printed raw: the log filter masks any secret in it
        log.exception("the gateway could not be built")
        return 1
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def on_signal(signum: signal.Signals) -> None:
        log.info("%s received: stopping", signum.name)
        stop.set()

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, on_signal, signum)
    starting = asyncio.create_task(gateway.start())
    stopping = asyncio.create_task(stop.wait())
    code = 0
    try:
        await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if starting.done():
            starting.result()
            log.info("loopwarden running, %d bot(s), http port %d", len(config.bots), gateway.port)
            await stopping
    except Exception:
        log.exception("the gateway failed to start")
        code = 1
    finally:
        for task in (starting, stopping):
            task.cancel()
        await asyncio.wait({starting, stopping})
        await gateway.stop(config.pipeline.drain_seconds)
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
    return code


def _add_check_config(subcommands: Subcommands) -> None:
    parser = subcommands.add_parser(
        "check-config",
        help="validate a config file (exit 0, or 2 with field.path: reason)",
        description="Validate a config file without connecting anything.",
    )
    parser.add_argument("file", metavar="FILE", help="the YAML config")
    parser.set_defaults(handler=_check_config)


def _check_config(args: argparse.Namespace) -> int:
    config = _load(args.file)
    if config is None:
        return 2
    try:
        for index, bot in enumerate(config.bots):
            load_connector_factory(bot.platform, field=f"bots.{index}.platform")
        require_backend(config.state)
    except ConfigError as exc:
        _print_config_error(exc)
        return 2
    platforms = ", ".join(sorted({bot.platform for bot in config.bots})) or "none"
    print(
        f"ok: {len(config.bots)} bots ({platforms}), {len(config.agents)} agents, "
        f"state={config.state.backend}"
    )
    return 0


def _add_demo(subcommands: Subcommands) -> None:
    # The demo owns its options (gateway.demo.parse_args, with its own --help): everything
    # after `demo` is handed over untouched. No prefix characters makes argparse treat
    # `--port 9` as plain words for the remainder instead of unknown options of ours.
    parser = subcommands.add_parser(
        "demo",
        help="run the embedded demo room: scripted bots in a local web chat "
        "(loopwarden demo --help for its options)",
        add_help=False,
        prefix_chars="\0",
    )
    parser.add_argument("demo_args", nargs=argparse.REMAINDER)
    parser.set_defaults(handler=_demo)


def _demo(args: argparse.Namespace) -> int:
    from gateway.demo import main as demo_main

    return demo_main(list(args.demo_args))


SUBCOMMANDS: tuple[Callable[[Subcommands], None], ...] = (_add_run, _add_check_config, _add_demo)


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every subcommand."""
    parser = argparse.ArgumentParser(
        prog="loopwarden",
        description="A chat-bot gateway for multi-bot rooms that stops bot loops.",
    )
    parser.add_argument("--version", action="version", version=f"loopwarden {__version__}")
    subcommands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add in SUBCOMMANDS:
        add(subcommands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse `argv` (default: sys.argv[1:]) and run the chosen subcommand."""
    args = build_parser().parse_args(argv)
    return cast(Handler, args.handler)(args)
