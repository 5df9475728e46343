"""`loopwarden calls export|preview-rule`: the LLM-call proxy's request log.

They read the log from the state a running proxy or gateway shares
(`gateway.cli.shared_state`).

Decisions where DESIGN.md is silent:
- `calls export` writes CSV on stdout (the only format; `--csv` says so and may be left out).
- `calls preview-rule` replays the logged calls of the window (7 days by default) through
  the rule alone, as the console's Rules page does (`gateway.calls.preview`); `--rule` is
  a rule's name in `proxy.rules` or a rule written inline as YAML or JSON.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from typing import TextIO

import yaml

from gateway.app.errors import ConfigError
from gateway.app.messages import format_duration
from gateway.calls.export import write_csv
from gateway.calls.preview import PREVIEW_SECONDS
from gateway.calls.preview import preview as rule_preview
from gateway.cli.command import (
    Subcommands,
    add_parser,
    config_option,
    print_config_error,
    with_config,
)
from gateway.cli.shared_state import run_command, using
from gateway.config import Config
from gateway.config.limits import parse_duration
from gateway.config.safeyaml import YamlLimitError, load_yaml
from guards.call_loop import UniquenessRule

DEFAULT_SINCE = f"{PREVIEW_SECONDS / 86_400:g}d"
"""The window both actions read by default (the console's Rules page's), as `--since` takes it."""


def add(subcommands: Subcommands) -> None:
    """The `calls` subcommand and its `export` and `preview-rule` actions."""
    parser = add_parser(
        subcommands,
        "calls",
        help="export the LLM request log, or preview a uniqueness rule against it",
        description="Read the request log of the LLM-call proxy (sqlite or redis state).",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    export = add_parser(actions, "export", help="the request log as CSV on stdout")
    export.add_argument("--csv", action="store_true", help="CSV (the only format)")
    _since_option(export)
    config_option(export)
    export.set_defaults(handler=with_config(_export))
    preview_rule = add_parser(
        actions, "preview-rule", help="how many logged calls a uniqueness rule would have stopped"
    )
    preview_rule.add_argument(
        "--rule",
        required=True,
        help="a rule name from proxy.rules, or a rule as YAML/JSON, e.g. "
        "'{name: once, fields: [session, step], max_calls: 1, window_seconds: 24h}'",
    )
    _since_option(preview_rule)
    config_option(preview_rule)
    preview_rule.set_defaults(handler=with_config(_preview))


def _since_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--since",
        type=_duration,
        default=DEFAULT_SINCE,
        metavar="DURATION",
        help="the calls of this last while, e.g. 30m, 24h, 7d",
    )


def _duration(text: str) -> float:
    seconds = parse_duration(text)
    if seconds is None:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 30m, 24h, 7d)")
    return seconds


def _export(args: argparse.Namespace, config: Config) -> int:
    return run_command(export_calls(config, args.since, sys.stdout))


def _preview(args: argparse.Namespace, config: Config) -> int:
    try:
        rule = resolve_rule(config, args.rule)
    except ConfigError as exc:
        print_config_error(exc)
        return 2
    return run_command(preview(config, rule, args.since, sys.stdout))


async def export_calls(config: Config, since: float, out: TextIO) -> int:
    """Write the request log of the last `since` seconds as CSV."""
    write_csv(await using(config, lambda store: store.calls_since(since)), out)
    return 0


def resolve_rule(config: Config, text: str) -> UniquenessRule:
    """A rule by its name in `proxy.rules`, or written inline as YAML/JSON (ConfigError)."""
    rules = config.proxy.rules if config.proxy is not None else ()
    for rule in rules:
        if rule.name == text:
            return rule
    try:
        data = load_yaml(text)
    except (yaml.YAMLError, YamlLimitError):
        data = None
    if not isinstance(data, Mapping):
        known = ", ".join(rule.name for rule in rules) or "none configured"
        raise ConfigError(
            "--rule", f"no rule named {text[:60]!r} (rules: {known}), nor a rule mapping"
        )
    try:
        return UniquenessRule.from_dict({str(key): value for key, value in data.items()})
    except ValueError as exc:
        raise ConfigError("--rule", str(exc)) from None


async def preview(config: Config, rule: UniquenessRule, since: float, out: TextIO) -> int:
    """Print how many logged calls of the last `since` seconds the rule would have stopped."""
    entries = await using(config, lambda store: store.calls_since(since))
    pause = config.proxy.call_loop.pause_seconds if config.proxy is not None else 300.0
    stopped = rule_preview(rule, entries, pause_seconds=pause).would_refuse
    print(
        f"rule {rule.name} would have stopped {stopped} of {len(entries)} logged calls "
        f"in the last {format_duration(since)}",
        file=out,
    )
    return 0
