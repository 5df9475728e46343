"""`loopwarden spend --config FILE [--by FIELD] [--period PERIOD]`: each budget group's spend.

The table and its reading of the shared state are `gateway.proxy.spend`'s; this module
is the subcommand's parser.
"""

from __future__ import annotations

import argparse
import sys

from gateway.calls.budgets import PER_FIELDS, PERIODS
from gateway.cli.command import Subcommands, add_parser, config_option, with_config
from gateway.cli.shared_state import run_command
from gateway.config import Config
from gateway.proxy.spend import spend_command


def add(subcommands: Subcommands) -> None:
    """The `spend` subcommand."""
    parser = add_parser(
        subcommands,
        "spend",
        help="what each budget group of the proxy has spent this period (sqlite or redis state)",
        description="Print each proxy.budgets group's spend, limit, share and period end.",
    )
    parser.add_argument("--by", choices=PER_FIELDS, help="only the budgets grouped by this field")
    parser.add_argument("--period", choices=PERIODS, help="only the budgets of this period")
    config_option(parser)
    parser.set_defaults(handler=with_config(_spend))


def _spend(args: argparse.Namespace, config: Config) -> int:
    return run_command(spend_command(config, args.by, args.period, sys.stdout))
