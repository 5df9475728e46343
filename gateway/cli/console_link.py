"""`loopwarden console-link`: a one-time sign-in link for a console running on this host.

The way back in for an operator whose address is locked out of sign-in (or who has no
token at hand): it writes a code into the running server's links folder
(`gateway.admin.console.links`) and prints the link that redeems it, as `loopwarden demo` does.

Decisions where DESIGN.md is silent:
- The gateway's console by default (`http`: its host, port, admin token, public URL);
  `--proxy` for the proxy's (`proxy`). The link starts with the `public_url`'s origin when
  there is one, else `http://<host>:<port>` (a wildcard host is reached on loopback).
- The link alone is printed on stdout, so a script can take it; what it is good for on
  stderr. Exit 2 when the config cannot have a console there (no admin token, no
  `proxy:` section, port 0), naming the field; 1 when the links folder is missing or not
  safe (the server has not started as this user).
"""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

from gateway.admin.console.links import LINK_TTL, ConsoleLinks, LinkFolderError
from gateway.app.errors import ConfigError
from gateway.cli.command import Subcommands, add_parser, config_option, with_config
from gateway.config import Config
from gateway.config.urls import browser_host, origin


def add(subcommands: Subcommands) -> None:
    """The `console-link` subcommand."""
    parser = add_parser(
        subcommands,
        "console-link",
        help="print a one-time sign-in link for the console running on this host",
        description="Print a sign-in link for the console of the gateway (or, with --proxy, "
        "the proxy) running on this host with this config: valid once, for 10 minutes, even "
        "while sign-in is locked out for your address. Run it as the server's user.",
    )
    parser.add_argument("--proxy", action="store_true", help="the LLM-call proxy's console")
    config_option(parser)
    parser.set_defaults(handler=with_config(_console_link))


def _console_link(args: argparse.Namespace, config: Config) -> int:
    return console_link(config, proxy=args.proxy, out=sys.stdout, err=sys.stderr)


def console_link(config: Config, *, proxy: bool, out: TextIO, err: TextIO) -> int:
    """Print a sign-in link for the console on this host (on `out`); the exit code."""
    try:
        links, base = _console(config, proxy=proxy)
        code = links.issue()
    except ConfigError as exc:
        print(f"config error: {exc}", file=err)
        return 2
    except (LinkFolderError, OSError) as exc:
        print(f"error: {exc}", file=err)
        return 1
    print(f"{base}/console/login?code={code}", file=out)
    minutes = int(LINK_TTL // 60)
    print(f"sign-in link: valid once, for {minutes} minutes, even while locked out", file=err)
    return 0


def _console(config: Config, *, proxy: bool) -> tuple[ConsoleLinks, str]:
    """The links folder and the base URL of the chosen console, or the ConfigError why not."""
    if proxy:
        if config.proxy is None:
            raise ConfigError("proxy", "required for the proxy's console (--proxy)")
        section, host, port = "proxy", config.proxy.host, config.proxy.port
        token, public_url = config.proxy.admin_token, config.proxy.public_url
    else:
        section, host, port = "http", config.http.host, config.http.port
        token, public_url = config.http.admin_token, config.http.public_url
    if token is None:
        raise ConfigError(f"{section}.admin_token", "not set, so the console is off")
    links = ConsoleLinks.of("proxy" if proxy else "gateway", port)
    if links is None:
        raise ConfigError(
            f"{section}.port", "0 is a new port each run: give the port the server runs on"
        )
    base = origin(public_url) if public_url else f"http://{browser_host(host)}:{port}"
    return links, base
