"""`loopwarden demo [OPTIONS]`: the embedded demo room (gateway.demo.room owns its options).

Everything after `demo` is handed to `gateway.demo.room.main` untouched, so `loopwarden
demo --help` is the demo's own help.
"""

from __future__ import annotations

import argparse

from gateway.cli.command import Subcommands


def add(subcommands: Subcommands) -> None:
    """The `demo` subcommand."""
    # No prefix characters makes argparse treat `--port 9` as plain words for the
    # remainder instead of unknown options of ours.
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
