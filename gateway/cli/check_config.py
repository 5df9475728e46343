"""`loopwarden check-config FILE`: is this config one the gateway can run with?

Exit 0 with a one-line summary (`ok: 2 bots (slack, telegram), 1 agent, state=redis`),
2 with every error found on stderr, a `config error: field.path: reason` line each (every
unset variable and every refused field in one run), then how many there were.

Decisions where DESIGN.md is silent: besides the file, it checks that every configured
platform's connector and the state backend can be imported, so a missing extra (`pip
install 'loopwarden[discord]'`) fails the check rather than the first `run`. It connects
to nothing and imports no agent code.
"""

from __future__ import annotations

import argparse
import sys

from gateway.app.errors import ConfigError
from gateway.app.runtime import load_connector_factory
from gateway.cli.command import Subcommands, add_parser, print_config_error
from gateway.config import load_config
from gateway.state.factory import require_backend


def add(subcommands: Subcommands) -> None:
    """The `check-config` subcommand."""
    parser = add_parser(
        subcommands,
        "check-config",
        help="validate a config file (exit 0, or 2 with field.path: reason)",
        description="Validate a config file without connecting anything.",
    )
    parser.add_argument("file", metavar="FILE", help="the YAML config")
    parser.set_defaults(handler=check_config)


def check_config(args: argparse.Namespace) -> int:
    """Validate `args.file`: print the summary (0) or its errors (2)."""
    try:
        config = load_config(args.file)
    except ConfigError as exc:
        print_config_error(exc)
        if len(exc.errors) > 1:
            print(f"{counted(len(exc.errors), 'error')} in {args.file}", file=sys.stderr)
        return 2
    try:
        for index, bot in enumerate(config.bots):
            load_connector_factory(bot.platform, field=f"bots.{index}.platform")
        require_backend(config.state)
    except ConfigError as exc:
        print_config_error(exc)
        return 2
    platforms = ", ".join(sorted({bot.platform for bot in config.bots})) or "none"
    print(
        f"ok: {counted(len(config.bots), 'bot')} ({platforms}), "
        f"{counted(len(config.agents), 'agent')}, state={config.state.backend}"
    )
    return 0


def counted(number: int, noun: str) -> str:
    """`1 agent`, `2 agents`, `0 bots`."""
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"
