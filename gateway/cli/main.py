"""The `loopwarden` command line: `run`, `check-config`, `demo`, `proxy`, `circuits`, `calls`,
`replay`, `spend`, `console-link`.

Each subcommand is one `_add_<name>(subcommands)` function listed in `SUBCOMMANDS`, which
adds its parser and sets `handler` to a function of the parsed arguments returning the
exit code; a later subcommand (`proxy`, `circuits`, `calls`) is one more such function.

`demo` hands its arguments to `gateway.demo.room.main`, which owns its options.

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
- `proxy` does the same with `proxy.drain_seconds`: requests in flight (streams included)
  finish, then alert deliveries and request-log writes, then exit 0. A config without a
  `proxy:` section is a config error (exit 2).
- `run` and `proxy` take `--loop auto|asyncio|uvloop` (gateway/app/eventloop.py: uvloop
  when installed); `demo` runs on the `auto` choice.
- `circuits` and `calls` open the state backend's call store directly (gateway/calls/
  commands.py); with memory state they exit 2 and point at the admin API. So does
  `spend` (gateway/proxy/spend.py).
- `console-link` prints a one-time sign-in link for the console running on this host
  (gateway/cli/console_link.py), the way in for an operator locked out of sign-in.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Callable, Coroutine, Iterator, Sequence
from contextlib import contextmanager
from typing import TypeAlias, cast

from gateway import __version__
from gateway.app import eventloop
from gateway.app.errors import ConfigError
from gateway.app.runtime import Gateway, load_connector_factory
from gateway.calls.budgets import PER_FIELDS, PERIODS
from gateway.cli import calls as commands
from gateway.cli import replay as replay_command
from gateway.cli.console_link import console_link
from gateway.config.limits import parse_duration
from gateway.config.schema import Config, load_config
from gateway.observability.logs import configure_logging, secret_values
from gateway.proxy.app import ProxyServer
from gateway.proxy.spend import spend_command
from gateway.replay.detect import FORMATS
from gateway.state.factory import require_backend

log = logging.getLogger("loopwarden")

Subcommands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
Handler = Callable[[argparse.Namespace], int]
ConfigCommand = Callable[[argparse.Namespace, Config], int]
Serve = Callable[[Config], Coroutine[object, object, int]]

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _print_config_error(exc: ConfigError) -> None:
    print(f"config error: {exc}", file=sys.stderr)


def _load(path: str) -> Config | None:
    """Load a config, printing the error (None) when it is invalid."""
    try:
        return load_config(path)
    except ConfigError as exc:
        _print_config_error(exc)
        return None


def _config_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, metavar="FILE", help="the YAML config")


def _with_config(command: ConfigCommand) -> Handler:
    """A handler that loads `--config` and runs `command` with it (exit 2 when invalid)."""

    def handler(args: argparse.Namespace) -> int:
        config = _load(args.config)
        if config is None:
            return 2
        return command(args, config)

    return handler


def _serving(serve: Serve) -> Handler:
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
        return eventloop.run(serve(config), choice=loop)

    return _with_config(run)


@contextmanager
def _stop_on_signals(note: str) -> Iterator[asyncio.Event]:
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


def _add_serving(
    subcommands: Subcommands, name: str, serve: Serve, *, help: str, description: str
) -> None:
    """Add a long-running subcommand: `--config`, `--log-level`, `--loop`, `serve` as handler."""
    parser = subcommands.add_parser(name, help=help, description=description)
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
        help="event loop (default auto: uvloop when installed, else asyncio's)",
    )
    _config_option(parser)
    parser.set_defaults(handler=_serving(serve))


def _add_run(subcommands: Subcommands) -> None:
    _add_serving(
        subcommands,
        "run",
        serve,
        help="run the gateway until SIGINT/SIGTERM",
        description="Run the gateway; on SIGINT/SIGTERM drain turns in flight and exit 0.",
    )


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
    with _stop_on_signals("stopping") as stop:
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
                await stopping
        except Exception:
            log.exception("the gateway failed to start")
            return 1
        finally:
            for task in (starting, stopping):
                task.cancel()
            await asyncio.wait({starting, stopping})
            await gateway.stop(config.pipeline.drain_seconds)
    return 0


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
    # The demo owns its options (gateway.demo.room.parse_args, with its own --help): everything
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
    from gateway.demo.room import main as demo_main

    return demo_main(list(args.demo_args))


def _add_proxy(subcommands: Subcommands) -> None:
    _add_serving(
        subcommands,
        "proxy",
        serve_proxy,
        help="run the LLM-call proxy until SIGINT/SIGTERM",
        description="Serve the OpenAI-, Anthropic- and Gemini-compatible proxy routes; on "
        "SIGINT/SIGTERM drain requests in flight and exit 0.",
    )


async def serve_proxy(config: Config) -> int:
    """Run the proxy for `config` until SIGINT/SIGTERM; return the exit code."""
    try:
        server = ProxyServer(config)
    except ConfigError as exc:
        _print_config_error(exc)
        return 2
    with _stop_on_signals("stopping the proxy") as stop:
        try:
            await server.start()
            await stop.wait()
        except Exception:
            log.exception("the proxy failed to start")
            return 1
        finally:
            await server.stop()
    return 0


def _add_circuits(subcommands: Subcommands) -> None:
    parser = subcommands.add_parser(
        "circuits",
        help="list or reopen paused LLM-call circuits (sqlite or redis state)",
        description="List the LLM-call circuits and rule groups paused after a likely loop, "
        "or reopen one before its pause ends.",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = actions.add_parser("list", help="the paused circuits, with time left")
    _config_option(listing)
    listing.set_defaults(handler=_with_config(_circuits_list))
    reopen = actions.add_parser("reopen", help="lift one circuit's pause")
    reopen.add_argument("circuit", metavar="CIRCUIT", help="e.g. billing-bot/session=run-42")
    _config_option(reopen)
    reopen.set_defaults(handler=_with_config(_circuits_reopen))


def _circuits_list(args: argparse.Namespace, config: Config) -> int:
    return commands.run_command(commands.list_circuits(config, sys.stdout))


def _circuits_reopen(args: argparse.Namespace, config: Config) -> int:
    return commands.run_command(commands.reopen_circuit(config, args.circuit, sys.stdout))


def _duration(text: str) -> float:
    seconds = parse_duration(text)
    if seconds is None:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 30m, 24h, 7d)")
    return seconds


def _add_calls(subcommands: Subcommands) -> None:
    parser = subcommands.add_parser(
        "calls",
        help="export the LLM request log, or preview a uniqueness rule against it",
        description="Read the request log of the LLM-call proxy (sqlite or redis state).",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    export = actions.add_parser("export", help="the request log as CSV on stdout")
    export.add_argument("--csv", action="store_true", required=True, help="write CSV")
    export.add_argument(
        "--since", type=_duration, default=commands.DEFAULT_SINCE, help="e.g. 24h (default 7d)"
    )
    _config_option(export)
    export.set_defaults(handler=_with_config(_calls_export))
    preview = actions.add_parser(
        "preview-rule", help="how many logged calls a uniqueness rule would have stopped"
    )
    preview.add_argument(
        "--rule",
        required=True,
        help="a rule name from proxy.rules, or a rule as YAML/JSON, e.g. "
        "'{name: once, fields: [session, step], max_calls: 1, window_seconds: 24h}'",
    )
    preview.add_argument(
        "--since", type=_duration, default=commands.DEFAULT_SINCE, help="e.g. 24h (default 7d)"
    )
    _config_option(preview)
    preview.set_defaults(handler=_with_config(_calls_preview))


def _calls_export(args: argparse.Namespace, config: Config) -> int:
    return commands.run_command(commands.export_calls(config, args.since, sys.stdout))


def _calls_preview(args: argparse.Namespace, config: Config) -> int:
    try:
        rule = commands.resolve_rule(config, args.rule)
    except ConfigError as exc:
        _print_config_error(exc)
        return 2
    return commands.run_command(commands.preview(config, rule, args.since, sys.stdout))


def _add_replay(subcommands: Subcommands) -> None:
    parser = subcommands.add_parser(
        "replay",
        help="replay recorded chat exports or LLM calls: what would the guards have stopped?",
        description="Run a recorded history (DiscordChatExporter JSON, a Slack export folder "
        "or zip, a Telegram Desktop result.json, the proxy's calls CSV export or a JSONL of "
        "chat-completion bodies) through the config's policies offline, and report what "
        "would have been refused.",
    )
    _config_option(parser)
    parser.add_argument("inputs", nargs="+", metavar="INPUT", help="an export file or folder")
    parser.add_argument("--format", choices=FORMATS, default="auto", help="default: auto")
    parser.add_argument(
        "--bot",
        action="append",
        default=[],
        metavar="ID_OR_NAME",
        help="treat this sender as a bot (a display name, a platform id or Telegram from_id)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--report", metavar="FILE.html", help="write a self-contained HTML page")
    parser.set_defaults(handler=_with_config(_replay))


def _replay(args: argparse.Namespace, config: Config) -> int:
    return replay_command.run(
        config,
        args.inputs,
        wanted=args.format,
        bots=args.bot,
        as_json=args.json,
        report_path=args.report,
    )


def _add_spend(subcommands: Subcommands) -> None:
    parser = subcommands.add_parser(
        "spend",
        help="what each budget group of the proxy has spent this period (sqlite or redis state)",
        description="Print each proxy.budgets group's spend, limit, share and period end.",
    )
    parser.add_argument("--by", choices=PER_FIELDS, help="only the budgets grouped by this field")
    parser.add_argument("--period", choices=PERIODS, help="only the budgets of this period")
    _config_option(parser)
    parser.set_defaults(handler=_with_config(_spend))


def _spend(args: argparse.Namespace, config: Config) -> int:
    return commands.run_command(spend_command(config, args.by, args.period, sys.stdout))


def _add_console_link(subcommands: Subcommands) -> None:
    parser = subcommands.add_parser(
        "console-link",
        help="print a one-time sign-in link for the console running on this host",
        description="Print a sign-in link for the console of the gateway (or, with --proxy, "
        "the proxy) running on this host with this config: valid once, for 10 minutes, even "
        "while sign-in is locked out for your address. Run it as the server's user.",
    )
    parser.add_argument("--proxy", action="store_true", help="the LLM-call proxy's console")
    _config_option(parser)
    parser.set_defaults(handler=_with_config(_console_link))


def _console_link(args: argparse.Namespace, config: Config) -> int:
    return console_link(config, proxy=args.proxy, out=sys.stdout, err=sys.stderr)


SUBCOMMANDS: tuple[Callable[[Subcommands], None], ...] = (
    _add_run,
    _add_check_config,
    _add_demo,
    _add_proxy,
    _add_circuits,
    _add_calls,
    _add_spend,
    _add_replay,
    _add_console_link,
)


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
