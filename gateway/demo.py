"""`loopwarden demo`: the embedded default, a local web room where bots loop until the guard cuts.

It runs the gateway with `connectors/room/demo.yaml` (three scripted bots: ping and pong
answer each other, echo repeats humans who mention it; a pair budget of 6 messages per
30 s, a 20 s cooldown; admin `alice`), prints the room's URL, and then prints the room's
transcript and every guard decision to the terminal, so the demo is readable without a
browser. Runs until SIGINT/SIGTERM (or `--exit-after`), drains, exits 0.

Decisions where DESIGN.md is silent:
- Once started, the demo kicks the ping-pong off by itself: the user `demo` says
  `@ping start` in the lobby, so a newcomer sees a loop being cut without typing
  (`--no-kickoff` leaves the room quiet).
- A browser is opened only when one can be shown (a desktop session, or macOS/Windows)
  and `--no-browser` is not given; otherwise the URL is printed for you to open.
- Terminal lines: `[lobby] ping (bot): …` for messages, `[lobby] * …` for room notices,
  `[guard] …` for each decision logged on `loopwarden.decision` at INFO, except the
  routine `not_addressed` (every bot sees every bot message; only the one mentioned
  answers); other logs go to stderr at WARNING unless `--log-level` says otherwise.
- `--delay` sets the scripted bots' reply delay (default 0.5 s, so a human can follow).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
import webbrowser
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import TextIO

from connectors.room.hub import DEFAULT_ROOM, RoomHub, RoomMessage, RoomNotice
from gateway.config import Config, parse_config
from gateway.logs import configure_logging
from gateway.runtime import Gateway

DECISION_LOGGER = "loopwarden.decision"
KICKOFF_USER = "demo"
KICKOFF_TEXT = "@ping start"
ROUTINE_CODES = frozenset({"not_addressed"})


@dataclass(frozen=True, slots=True)
class DemoOptions:
    """What the command line chose."""

    host: str = "127.0.0.1"
    port: int = 8787
    open_browser: bool = True
    exit_after: float | None = None
    delay: float = 0.5
    kickoff: bool = True
    log_level: str | None = None


DESCRIPTION = (
    "Run a local web room where scripted bots talk until the loop guard cuts them. Open the "
    "printed URL; as 'alice' (the admin) type /loop status or /loop reset."
)


def _port(text: str) -> int:
    port = int(text)
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError("a port is 0 (any free port) to 65535")
    return port


def _seconds(text: str) -> float:
    seconds = float(text)
    if not seconds >= 0:
        raise argparse.ArgumentTypeError("a number of seconds, 0 or more")
    return seconds


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `loopwarden demo` options, for this module's parser and the CLI's subcommand."""
    parser.add_argument("--host", default="127.0.0.1", help="address to serve on")
    parser.add_argument("--port", type=_port, default=8787, help="port (0 picks a free one)")
    parser.add_argument("--no-browser", action="store_true", help="do not open a browser")
    parser.add_argument(
        "--exit-after", type=_seconds, metavar="SECONDS", help="stop by itself after SECONDS"
    )
    parser.add_argument(
        "--delay", type=_seconds, default=0.5, metavar="SECONDS", help="each bot's reply delay"
    )
    parser.add_argument(
        "--no-kickoff", action="store_true", help="do not start the ping-pong automatically"
    )
    parser.add_argument(
        "--log-level",
        type=str.upper,
        choices=("DEBUG", "INFO", "WARNING", "ERROR"),
        help="level of the other logs, on stderr (default WARNING)",
    )


def options_from(args: argparse.Namespace) -> DemoOptions:
    """The options parsed by a parser that `add_arguments` filled."""
    return DemoOptions(
        host=args.host,
        port=args.port,
        open_browser=not args.no_browser,
        exit_after=args.exit_after,
        delay=args.delay,
        kickoff=not args.no_kickoff,
        log_level=args.log_level,
    )


def parse_args(argv: Sequence[str] | None) -> DemoOptions:
    """Parse `loopwarden demo` options (argv without the `demo` word)."""
    parser = argparse.ArgumentParser(prog="loopwarden demo", description=DESCRIPTION)
    add_arguments(parser)
    return options_from(parser.parse_args(argv))


def demo_config(*, host: str = "127.0.0.1", port: int = 8787, delay: float = 0.5) -> Config:
    """The embedded demo config (connectors/room/demo.yaml) for this host, port and delay."""
    text = resources.files("connectors.room").joinpath("demo.yaml").read_text(encoding="utf-8")
    env = {
        "LOOPWARDEN_DEMO_HOST": host,
        "LOOPWARDEN_DEMO_PORT": str(port),
        "LOOPWARDEN_DEMO_DELAY": repr(delay),
    }
    return parse_config(text, env=env)


class TerminalReport:
    """Prints the room's transcript and the guard's decisions as they happen."""

    def __init__(self, out: TextIO) -> None:
        self._out = out

    def line(self, text: str) -> None:
        """Print one entry now, continuation lines indented (the output may be a pipe: flush)."""
        print(text.replace("\n", "\n    "), file=self._out, flush=True)

    def room_event(self, event: RoomMessage | RoomNotice) -> None:
        """One transcript line per message or notice."""
        if isinstance(event, RoomMessage):
            who = f"{event.sender_name} (bot)" if event.is_bot else event.sender_name
            self.line(f"[{event.room}] {who}: {event.text}")
        else:
            self.line(f"[{event.room}] * {event.text}")

    def decision(self, record: logging.LogRecord) -> None:
        """One `[guard]` line per decision worth telling (routine ones are skipped)."""
        if getattr(record, "decision", None) in ROUTINE_CODES:
            return
        self.line(f"[guard] {record.getMessage()}")


class _DecisionHandler(logging.Handler):
    """Routes `loopwarden.decision` records to the terminal report."""

    def __init__(self, report: TerminalReport) -> None:
        super().__init__(logging.INFO)
        self._report = report

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._report.decision(record)
        except Exception:  # logging must never break the gateway
            self.handleError(record)


@contextlib.contextmanager
def _decisions_to(report: TerminalReport) -> Iterator[None]:
    """Send decision records to the report (only there) for the duration of the demo."""
    logger = logging.getLogger(DECISION_LOGGER)
    handler = _DecisionHandler(report)
    saved = (logger.level, logger.propagate)
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(saved[0])
        logger.propagate = saved[1]


def _can_show_browser() -> bool:
    """True when a browser window could appear (not on a headless server or in CI)."""
    if sys.platform in ("darwin", "win32"):
        return True
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


async def run_demo(
    options: DemoOptions,
    *,
    out: TextIO,
    stop: asyncio.Event | None = None,
    handle_signals: bool = False,
) -> int:
    """Run the demo until `stop` is set, a signal arrives or `exit_after` passes.

    Returns the exit code: 0 after a clean stop, 1 when the port cannot be served.
    """
    config = demo_config(host=options.host, port=options.port, delay=options.delay)
    report = TerminalReport(out)
    stop = stop or asyncio.Event()
    gateway = Gateway(config)
    hub = RoomHub.for_app(gateway.app)
    unsubscribe = hub.subscribe(report.room_event)
    loop = asyncio.get_running_loop()
    signals = (signal.SIGINT, signal.SIGTERM) if handle_signals else ()
    for signum in signals:
        loop.add_signal_handler(signum, stop.set)
    try:
        with _decisions_to(report):
            try:
                await gateway.start()
            except OSError as exc:
                report.line(
                    f"cannot serve the demo on {options.host} port {options.port}: "
                    f"{exc.strerror or exc}; try --port 0 for a free port"
                )
                await gateway.stop(config.pipeline.drain_seconds)
                return 1
            url = f"http://{_url_host(options.host)}:{gateway.port}/room"
            _banner(report, url, config)
            if options.open_browser and _can_show_browser():
                await asyncio.to_thread(webbrowser.open, url)
            if options.kickoff:
                hub.notice(
                    DEFAULT_ROOM,
                    f"{KICKOFF_USER} starts a ping-pong with '{KICKOFF_TEXT}'; "
                    "watch the loop guard cut it",
                )
                hub.say(DEFAULT_ROOM, KICKOFF_USER, KICKOFF_TEXT)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), options.exit_after)
            report.line("stopping: finishing turns in flight…")
            await gateway.stop(config.pipeline.drain_seconds)
    finally:
        unsubscribe()
        for signum in signals:
            loop.remove_signal_handler(signum)
    report.line("demo stopped")
    return 0


def _url_host(host: str) -> str:
    """A host for a URL a browser can open (a wildcard bind is reached on loopback)."""
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def _banner(report: TerminalReport, url: str, config: Config) -> None:
    loop_policy = config.policy.bot_loop
    bots = ", ".join(bot.id for bot in config.bots)
    admins = ", ".join(config.admins.room)
    report.line(f"loopwarden demo: open {url}  (Ctrl-C to stop)")
    report.line(
        f"bots: {bots}; pair budget {loop_policy.max_events_per_window} messages per "
        f"{loop_policy.window_seconds:g} s, cooldown {loop_policy.cooldown_seconds:g} s"
    )
    report.line(
        f"join as {admins} (the admin) and type '/loop status' or '/loop reset'; "
        f"'{KICKOFF_TEXT}' starts another round"
    )


def run(options: DemoOptions) -> int:
    """Run the demo in the terminal until Ctrl-C (or `--exit-after`); returns the exit code."""
    configure_logging(options.log_level or "WARNING")
    return asyncio.run(run_demo(options, out=sys.stdout, handle_signals=True))


def main(argv: list[str] | None = None) -> int:
    """`loopwarden demo [--host H] [--port P] [--no-browser] [--exit-after S] …`."""
    return run(parse_args(argv))
