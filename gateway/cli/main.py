"""The `loopwarden` command line: the parser of every subcommand, and the dispatch.

Each subcommand is a module of this package with `add(subcommands)`, which adds its
parser and sets `handler` (`gateway.cli.command`): `run`, `check_config`, `demo`,
`proxy`, `circuits`, `calls`, `spend`, `replay`, `console_link`.

Exit codes: 0 success, 2 invalid configuration or usage (`config error: field.path:
reason` on stderr), 1 the gateway failed at start-up (port in use, state unreachable).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import cast

from gateway import __version__
from gateway.cli import (
    calls,
    check_config,
    circuits,
    console_link,
    demo,
    proxy,
    replay,
    run,
    spend,
)
from gateway.cli.command import Handler, HelpFormat, Subcommands

SUBCOMMANDS: tuple[Callable[[Subcommands], None], ...] = (
    run.add,
    check_config.add,
    demo.add,
    proxy.add,
    circuits.add,
    calls.add,
    spend.add,
    replay.add,
    console_link.add,
)


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every subcommand."""
    parser = argparse.ArgumentParser(
        prog="loopwarden",
        description="A chat-bot gateway for multi-bot rooms that stops bot loops.",
        formatter_class=HelpFormat,
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
