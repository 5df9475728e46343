"""What every subcommand is built from: its parser's type, its handler, `--config` and its load.

A subcommand module has `add(subcommands)`, which adds its parser (with `HELP_FORMAT`)
and sets `handler` to a function of the parsed arguments returning the exit code.

Decisions where DESIGN.md is silent:
- Every option's `--help` line ends with its default (`(default: 7d)`) when it has one; a
  flag's default (off) and an option without a default say nothing, and an option whose
  default comes from elsewhere (`--log-level`) says where in its own words.
- A config with several errors (unset variables, refused fields) gets all of them in one
  run, a line each, so a newcomer fixes them together rather than one per run.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import TypeAlias

from gateway.app.errors import ConfigError
from gateway.config import Config, load_config

Subcommands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
Handler = Callable[[argparse.Namespace], int]
ConfigCommand = Callable[[argparse.Namespace, Config], int]


class HelpFormat(argparse.HelpFormatter):
    """argparse's help, each option that has a default ending with `(default: …)`."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help
        if text is None or "%(default)" in text or not action.option_strings:
            return text
        if action.default in (None, False, [], argparse.SUPPRESS):
            return text
        return f"{text} (default: %(default)s)"


def add_parser(
    subcommands: Subcommands, name: str, *, help: str, description: str | None = None
) -> argparse.ArgumentParser:
    """A subcommand's (or an action's) parser, its `--help` showing every default."""
    return subcommands.add_parser(
        name, help=help, description=description, formatter_class=HelpFormat
    )


def print_config_error(exc: ConfigError) -> None:
    """Each error `exc` holds on stderr, a `config error: path: reason` line each."""
    for error in exc.errors:
        print(f"config error: {error}", file=sys.stderr)


def load(path: str) -> Config | None:
    """Load a config, printing its errors (None) when it is invalid."""
    try:
        return load_config(path)
    except ConfigError as exc:
        print_config_error(exc)
        return None


def config_option(parser: argparse.ArgumentParser) -> None:
    """The required `--config FILE`."""
    parser.add_argument("--config", required=True, metavar="FILE", help="the YAML config")


def with_config(command: ConfigCommand) -> Handler:
    """A handler that loads `--config` and runs `command` with it (exit 2 when invalid)."""

    def handler(args: argparse.Namespace) -> int:
        config = load(args.config)
        if config is None:
            return 2
        return command(args, config)

    return handler
