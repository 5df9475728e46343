"""`loopwarden demo`: the embedded default, a local web room where bots loop until the guard cuts.

It runs the gateway with `connectors/room/demo.yaml` (six bots, one guard at work each:
ping and pong answer each other under a pair budget of 6 messages per 30 s and a 20 s
cooldown, echo repeats humans who mention it, finder's tool never progresses (LoopGuard),
quiet answers NO_REPLY (silence notice), oracle keeps resending one request to its model
(CallLoopGuard); admin `alice`) and the built-in model of finder and oracle
(`gateway.demo.model`, on loopback, started before the gateway and stopped after it),
prints the room's URL, and then prints the room's transcript and every guard decision to
the terminal, so the demo is readable without a browser. Runs until SIGINT/SIGTERM (or
`--exit-after`), drains, exits 0.

Decisions where DESIGN.md is silent:
- Once started, the demo kicks each scenario off by itself (`KICKOFF`), 4 s apart: the
  user `demo` says `@ping start`, `@finder find the invoice`, `@echo @quiet are you
  there?` (echo's repeat addresses quiet as a bot) and `@oracle did the auditors
  answer?` in the lobby, each after a room notice saying what to watch, so a newcomer
  sees every guard act without typing (`--no-kickoff` leaves the room quiet). The notices
  stay in the room's history, so a browser opened later reads them too.
- The scenarios run again on demand: anyone in a room may type `/demo` (or press the
  room page's "Run the scenarios again" button, which says it), and they run in that
  room after a fresh start: the room's bot pairs reset and every paused circuit reopened,
  so each guard acts again (and the console's Rooms and Calls pages fill again). One run
  at a time: a `/demo` during a run gets a notice saying so.
- A browser is opened only when one can be shown (a desktop session, or macOS/Windows)
  and `--no-browser` is not given; otherwise the URL is printed for you to open.
- Terminal lines: `[lobby] ping (bot): …` for messages, `[lobby] * …` for room notices,
  `[guard] …` for each decision logged on `loopwarden.decision` at INFO, and the silence
  guard's at DEBUG, except the routine `not_addressed` (every bot sees every message; only
  the one mentioned answers); `[model] …` for what only the model sees (the loop guard's
  warnings and blocks in tool results, a request sent again); other logs go to stderr at
  WARNING unless `--log-level` says otherwise.
- Without `http.admin_token` the demo makes one up for its run (never printed) and prints
  a one-time console sign-in link (`/console/login?code=…`, valid once, for five
  minutes) beside the room's URL.
- `--delay` sets the scripted bots' reply delay (default 0.5 s, so a human can follow).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import secrets
import signal
import sys
import webbrowser
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import TextIO

from pydantic import SecretStr

from connectors.room.connector import PLATFORM
from connectors.room.hub import DEFAULT_ROOM, RoomHub, RoomMessage, RoomNotice
from gateway.app import eventloop
from gateway.app.runtime import Gateway
from gateway.config import Config, parse_config
from gateway.config.urls import browser_host
from gateway.demo.model import DemoModel
from gateway.observability.logs import configure_logging
from gateway.state.activity import ROUTINE_CODES

DECISION_LOGGER = "loopwarden.decision"
KICKOFF_USER = "demo"
KICKOFF_TEXT = "@ping start"
RERUN_COMMAND = "/demo"
RERUN_LABEL = "Run the scenarios again"
RERUN_NOTICE = "{name} asked for the demo again: bot pairs reset, paused circuits reopened"
RERUN_BUSY = "the demo's scenarios are running already; /demo again once they are done"
QUIET_STAGES_SHOWN = frozenset({"silence"})
"""Stages whose admitted verdicts (logged at DEBUG) the terminal shows: the silence guard's."""


@dataclass(frozen=True, slots=True)
class KickoffStep:
    """One scenario the kickoff starts: what the user `demo` says, and what to watch then."""

    text: str
    watch: str


KICKOFF = (
    KickoffStep(KICKOFF_TEXT, "demo starts a ping-pong: watch the bot-loop guard cut it"),
    KickoffStep(
        "@finder find the invoice",
        "demo asks finder, whose tool never progresses: watch the loop guard warn, block, "
        "then halt it",
    ),
    KickoffStep(
        "@echo @quiet are you there?",
        "demo and echo address quiet, which answers NO_REPLY: a short notice for demo, "
        "nothing for echo",
    ),
    KickoffStep(
        "@oracle did the auditors answer?",
        "demo asks oracle, which keeps sending its model one request: watch the call guard "
        "refuse the 6th and pause oracle (/loop circuits)",
    ),
)
"""The kickoff's scenarios, one guard each, in the order they start."""


@dataclass(frozen=True, slots=True)
class DemoOptions:
    """What the command line chose."""

    host: str = "127.0.0.1"
    port: int = 8787
    open_browser: bool = True
    exit_after: float | None = None
    delay: float = 0.5
    kickoff: bool = True
    kickoff_gap: float = 4.0  # seconds between the kickoff's scenarios; not on the command line
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
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to serve on (default: %(default)s)"
    )
    parser.add_argument(
        "--port", type=_port, default=8787, help="port, 0 picks a free one (default: %(default)s)"
    )
    parser.add_argument("--no-browser", action="store_true", help="do not open a browser")
    parser.add_argument(
        "--exit-after", type=_seconds, metavar="SECONDS", help="stop by itself after SECONDS"
    )
    parser.add_argument(
        "--delay",
        type=_seconds,
        default=0.5,
        metavar="SECONDS",
        help="each bot's reply delay (default: %(default)s)",
    )
    parser.add_argument(
        "--no-kickoff", action="store_true", help="do not start the scenarios automatically"
    )
    parser.add_argument(
        "--log-level",
        type=str.upper,
        choices=("DEBUG", "INFO", "WARNING", "ERROR"),
        help="level of the other logs, on stderr (default: WARNING)",
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


def demo_config(
    *,
    host: str = "127.0.0.1",
    port: int = 8787,
    delay: float = 0.5,
    model_url: str | None = None,
) -> Config:
    """The embedded demo config (connectors/room/demo.yaml) for this host, port and delay.

    `model_url` is the built-in model's base URL (`DemoModel.url`); without it the LLM bots
    point at the file's default, where no model answers unless one is started there.
    """
    text = resources.files("connectors.room").joinpath("demo.yaml").read_text(encoding="utf-8")
    env = {
        "LOOPWARDEN_DEMO_HOST": host,
        "LOOPWARDEN_DEMO_PORT": str(port),
        "LOOPWARDEN_DEMO_DELAY": repr(delay),
    }
    if model_url is not None:
        env["LOOPWARDEN_DEMO_MODEL_URL"] = model_url
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
        if record.levelno < logging.INFO and getattr(record, "stage", None) not in (
            QUIET_STAGES_SHOWN
        ):
            return
        self.line(f"[guard] {record.getMessage()}")


class _DecisionHandler(logging.Handler):
    """Routes `loopwarden.decision` records to the terminal report."""

    def __init__(self, report: TerminalReport) -> None:
        super().__init__(logging.DEBUG)
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
    logger.setLevel(logging.DEBUG)  # the silence guard's verdicts are logged at DEBUG
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
    report = TerminalReport(out)
    model = DemoModel(report=report.line)
    config = demo_config(
        host=options.host, port=options.port, delay=options.delay, model_url=await model.start()
    )
    config = _with_admin_token(config)
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
            served = f"http://{browser_host(options.host)}:{gateway.port}"
            url = f"{served}/room"
            _banner(report, url, config)
            code = gateway.console.issue_code()
            console = f"{served}/console/login?code={code}"
            report.line(f"console: {console}  (sign-in link: valid once, for five minutes)")
            if options.open_browser and _can_show_browser():
                await asyncio.to_thread(webbrowser.open, url)
            scenarios = Scenarios(hub, gateway, KICKOFF, options.kickoff_gap)
            stop_listening = scenarios.listen()
            if options.kickoff:
                scenarios.start(DEFAULT_ROOM)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), options.exit_after)
            stop_listening()
            await scenarios.aclose()
            report.line("stopping: finishing turns in flight…")
            await gateway.stop(config.pipeline.drain_seconds)
    finally:
        unsubscribe()
        for signum in signals:
            loop.remove_signal_handler(signum)
        await model.stop()
    report.line("demo stopped")
    return 0


class Scenarios:
    """The kickoff's scenarios: run at start, and again in a room where someone says `/demo`."""

    def __init__(
        self,
        hub: RoomHub,
        gateway: Gateway,
        steps: Sequence[KickoffStep] = KICKOFF,
        gap: float = 4.0,
    ) -> None:
        self._hub = hub
        self._gateway = gateway
        self._steps = steps
        self._gap = gap
        self._run: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        """True while a run is posting its scenarios."""
        return self._run is not None and not self._run.done()

    def listen(self) -> Callable[[], None]:
        """Put the rerun button on the room page and hear `/demo`; returns how to stop hearing."""
        self._hub.offer(RERUN_LABEL, RERUN_COMMAND)
        return self._hub.subscribe(self.on_event)

    def on_event(self, event: RoomMessage | RoomNotice) -> None:
        """A hub listener: a person's `/demo` runs the scenarios again in that room."""
        if not isinstance(event, RoomMessage) or event.is_bot or event.system:
            return
        if event.text.strip().lower() != RERUN_COMMAND:
            return
        if self.running:
            self._hub.notice(event.room, RERUN_BUSY)
            return
        self._run = asyncio.create_task(self._again(event.room, event.sender_name))

    def start(self, room: str) -> None:
        """Run the scenarios in `room` now (the first run: nothing to reset)."""
        if not self.running:
            self._run = asyncio.create_task(self._kick_off(room))

    async def aclose(self) -> None:
        """Stop a run in progress."""
        if self._run is not None:
            self._run.cancel()
            await asyncio.wait([self._run])

    async def _again(self, room: str, name: str) -> None:
        """Reset the room's pairs and reopen every paused circuit, then run the scenarios."""
        admin = self._gateway.admin
        await admin.reset(f"{PLATFORM}:{room}")
        for paused in await self._gateway.calls.paused():
            await admin.reopen_circuit(paused.circuit)
        self._hub.notice(room, RERUN_NOTICE.format(name=name), keep=True)
        await self._kick_off(room)

    async def _kick_off(self, room: str) -> None:
        """Start each scenario as the user `demo`, `gap` seconds apart, after its notice."""
        for index, step in enumerate(self._steps):
            if index:
                await asyncio.sleep(self._gap)
            self._hub.notice(room, step.watch, keep=True)
            self._hub.say(room, KICKOFF_USER, step.text)


def _with_admin_token(config: Config) -> Config:
    """`config` with a random admin token for this run when it has none (never printed)."""
    if config.http.admin_token is not None:
        return config
    token = SecretStr(secrets.token_urlsafe(24))
    return config.model_copy(update={"http": config.http.model_copy(update={"admin_token": token})})


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
        f"'{RERUN_COMMAND}' runs every scenario again"
    )
    report.line(
        "finder, quiet and oracle show the loop guard, the silence notice and the call guard "
        "(their model runs here, no key); '/loop circuits' lists paused circuits, "
        "'/loop reopen <circuit>' reopens one"
    )


def run(options: DemoOptions) -> int:
    """Run the demo in the terminal until Ctrl-C (or `--exit-after`); returns the exit code."""
    configure_logging(options.log_level or "WARNING")
    return eventloop.run(run_demo(options, out=sys.stdout, handle_signals=True))


def main(argv: list[str] | None = None) -> int:
    """`loopwarden demo [--host H] [--port P] [--no-browser] [--exit-after S] …`."""
    return run(parse_args(argv))
