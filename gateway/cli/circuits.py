"""`loopwarden circuits list|reopen`: the LLM-call circuits paused after a likely loop.

They are read from the state a running proxy or gateway shares (`gateway.cli.shared_state`).

Decisions where DESIGN.md is silent: `circuits reopen` exits 0 when it lifted a pause and
1 when the circuit was not paused (its repeat counts are cleared either way).
"""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

from gateway.app.messages import format_duration
from gateway.cli.command import Subcommands, add_parser, config_option, with_config
from gateway.cli.shared_state import run_command, using
from gateway.config import Config


def add(subcommands: Subcommands) -> None:
    """The `circuits` subcommand and its `list` and `reopen` actions."""
    parser = add_parser(
        subcommands,
        "circuits",
        help="list or reopen paused LLM-call circuits (sqlite or redis state)",
        description="List the LLM-call circuits and rule groups paused after a likely loop, "
        "or reopen one before its pause ends.",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = add_parser(actions, "list", help="the paused circuits, with time left")
    config_option(listing)
    listing.set_defaults(handler=with_config(_list))
    reopen = add_parser(actions, "reopen", help="lift one circuit's pause")
    reopen.add_argument("circuit", metavar="CIRCUIT", help="e.g. billing-bot/session=run-42")
    config_option(reopen)
    reopen.set_defaults(handler=with_config(_reopen))


def _list(args: argparse.Namespace, config: Config) -> int:
    return run_command(list_circuits(config, sys.stdout))


def _reopen(args: argparse.Namespace, config: Config) -> int:
    return run_command(reopen_circuit(config, args.circuit, sys.stdout))


async def list_circuits(config: Config, out: TextIO) -> int:
    """Print the paused circuits and rule groups, one per line."""
    paused = await using(config, lambda store: store.paused())
    if not paused:
        print("no circuit is paused", file=out)
        return 0
    width = max(len(p.circuit) for p in paused)
    print(f"{'CIRCUIT':<{width}}  {'LEFT':>12}  {'REFUSED':>7}  REASON", file=out)
    for p in paused:
        left = format_duration(p.remaining)
        print(f"{p.circuit:<{width}}  {left:>12}  {p.count:>7}  {p.reason}", file=out)
    return 0


async def reopen_circuit(config: Config, circuit: str, out: TextIO) -> int:
    """Lift one circuit's (or rule group's) pause."""
    if await using(config, lambda store: store.reopen(circuit)):
        print(f"reopened {circuit}", file=out)
        return 0
    print(f"{circuit} was not paused (its repeat counts start afresh)", file=out)
    return 1
