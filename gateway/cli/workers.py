"""`--workers N` of `proxy` and `run`: N processes serving one port, and their supervisor.

The command's process becomes a supervisor: it binds the port (resolving port 0), forks N
workers and waits on them. Each worker runs the whole server (its own event loop, stores
and upstream sessions) on a listening socket of its own bound with SO_REUSEPORT, so the
kernel spreads connections over the workers; where the OS has no SO_REUSEPORT the
supervisor listens once and the forked workers accept on that one socket. State the
workers must agree on (circuits, budgets, receipts, the request log) is in sqlite or
Redis, never in a worker: `state.backend: memory` with N > 1 is refused.

Decisions where DESIGN.md is silent:
- `--workers auto` is the number of cores this process may run on; N is 1 to 256.
- The workers listen on the host's first address (`getaddrinfo`): a name with several
  (`localhost`: 127.0.0.1 and ::1) is served on one of them, as with an address.
- With N > 1 every response carries `X-Loopwarden-Worker: <pid>` (which worker answered),
  and `/metrics` sums every worker's counters (gateway/observability/workers.py).
- SIGTERM or SIGINT to the supervisor is passed to every worker; each drains as a single
  process does, and the supervisor exits 0 when all exited 0 (else 1).
- A worker that dies while no stop was asked (a crash, a SIGKILL) is logged with its exit
  status and started again in its place. One that dies before it served (a config it
  cannot build, state it cannot open) is not: the supervisor stops the others and exits
  with that worker's status (2 for a config error, else 1), rather than restart a
  failure forever.
- `run`: only bots whose platform delivers over the gateway's HTTP server can be served by
  several processes (Telegram `mode: webhook`, Slack's Events API); a bot that keeps one
  connection of its own (Telegram polling, Slack Socket Mode, Discord, Mattermost's
  websocket, Matrix's sync, the web room) would run once per worker, so N > 1 with such a
  bot exits 2 naming it.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from aiohttp import web

from gateway.config import Config
from gateway.config.bots import BotConfig, SlackBotConfig, TelegramBotConfig
from gateway.observability.workers import SharedMetrics

log = logging.getLogger("loopwarden")

WORKER_HEADER = "X-Loopwarden-Worker"
MAX_WORKERS = 256
_BACKLOG = 1024
_PR_SET_PDEATHSIG = 1  # linux/prctl.h
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def workers_count(text: str) -> int:
    """`--workers`' value: `auto` (the cores this process may use) or 1 to MAX_WORKERS."""
    if text == "auto":
        return max(1, len(os.sched_getaffinity(0)))
    try:
        count = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number or auto, not {text[:20]!r}") from None
    if not 1 <= count <= MAX_WORKERS:
        raise argparse.ArgumentTypeError(f"must be from 1 to {MAX_WORKERS}, not {count}")
    return count


def add_workers_option(parser: argparse.ArgumentParser) -> None:
    """The `--workers N` option of a command that can serve from several processes."""
    parser.add_argument(
        "--workers",
        type=workers_count,
        default=1,
        metavar="N|auto",
        help="processes serving the one port (auto: one per core); N > 1 needs "
        "state.backend sqlite or redis",
    )


def refusal(config: Config, count: int, *, bots: bool) -> str | None:
    """Why `config` cannot be served by `count` processes (a config error line), or None.

    `bots`: the command hosts the config's bots (`run`; the proxy hosts none).
    """
    if count == 1:
        return None
    if config.state.backend == "memory":
        return (
            "state.backend: memory keeps state inside one process; --workers "
            f"{count} needs sqlite or redis so the workers share circuits and budgets"
        )
    for index, bot in enumerate(config.bots if bots else ()):
        connection = _own_connection(bot)
        if connection is not None:
            return (
                f"bots.{index} ({bot.id}): {connection} is one connection per bot; "
                f"--workers {count} serves only webhook bots (Telegram mode: webhook, "
                "Slack's Events API): run such a bot in a process of its own"
            )
    return None


def _own_connection(bot: BotConfig) -> str | None:
    """The connection a bot keeps of its own, or None when its platform calls our webhook."""
    if isinstance(bot, TelegramBotConfig):
        return None if bot.mode == "webhook" else "Telegram long polling"
    if isinstance(bot, SlackBotConfig):
        return None if bot.app_token is None else "Slack Socket Mode"
    names = {
        "discord": "Discord's gateway connection",
        "mattermost": "Mattermost's websocket",
        "matrix": "Matrix's sync",
        "room": "the web room",
    }
    return names[bot.platform]


@dataclass(frozen=True, slots=True)
class Worker:
    """One worker process's share of the port: its listening socket and its place."""

    index: int
    sock: socket.socket
    metrics: Path  # where the workers publish their figures for `/metrics`
    _ready: int  # the pipe that tells the supervisor this worker serves

    def attach(self, app: web.Application, render: Callable[[], bytes]) -> None:
        """Make `app` a worker's: responses name it, `/metrics` sums every worker's."""
        pid = str(os.getpid())

        async def name_worker(request: web.Request, response: web.StreamResponse) -> None:
            response.headers[WORKER_HEADER] = pid

        app.on_response_prepare.append(name_worker)
        shared = SharedMetrics(self.metrics, render)
        app.middlewares.append(shared.middleware)
        app.cleanup_ctx.append(shared.publishing)

    def serving(self) -> None:
        """Tell the supervisor this worker serves: from now on a death is a crash."""
        os.write(self._ready, b"1")


WorkerMain = Callable[[Worker], int]


class Port:
    """The port the workers share: bound by the supervisor, one socket per worker from it.

    With SO_REUSEPORT the supervisor's socket only holds the port (bound, not listening,
    so it takes no connections) and each worker binds and listens on a socket of its own;
    without it the supervisor's socket listens and every worker accepts on it.
    """

    def __init__(self, host: str, port: int) -> None:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        self._family, self._kind, self._proto = family, kind, proto
        self.reuse_port = hasattr(socket, "SO_REUSEPORT")
        self._held = self._socket()
        self._held.bind(address)
        self.address = self._held.getsockname()
        if not self.reuse_port:
            self._held.listen(_BACKLOG)

    def _socket(self) -> socket.socket:
        sock = socket.socket(self._family, self._kind, self._proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if self.reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        return sock

    def for_worker(self) -> socket.socket:
        """A listening socket on the port for the calling (forked) worker."""
        if not self.reuse_port:
            return self._held
        sock = self._socket()
        sock.bind(self.address)
        sock.listen(_BACKLOG)
        self._held.close()
        return sock

    def close(self) -> None:
        """Release the port (the supervisor, once every worker has exited)."""
        self._held.close()


class Supervisor:
    """Forks `count` workers on `port`, restarts those that crash, stops them on a signal."""

    def __init__(self, count: int, port: Port, work: WorkerMain) -> None:
        self._count = count
        self._port = port
        self._work = work
        self._running: dict[int, tuple[int, int]] = {}  # pid -> (index, its ready pipe)
        self._pid = os.getpid()
        self._metrics = Path(tempfile.mkdtemp(prefix="loopwarden-metrics-"))
        self._stopping = False

    def run(self) -> int:
        """Serve until a stop signal (or a worker failing at start); the exit code."""
        previous = {signum: signal.signal(signum, self._on_signal) for signum in _STOP_SIGNALS}
        code = 0
        try:
            log.info(
                "serving %s:%d from %d workers (%s)",
                *self._port.address[:2],
                self._count,
                "SO_REUSEPORT" if self._port.reuse_port else "one shared socket",
            )
            for index in range(self._count):
                self._spawn(index)
            while self._running:
                pid, status = os.wait()
                index, ready = self._running.pop(pid)
                served = _was_ready(ready)
                exit_code = os.waitstatus_to_exitcode(status)
                if self._stopping:
                    code = code or (0 if exit_code == 0 else 1)
                    continue
                if not served:
                    log.error(
                        "worker %d (pid %d) %s before serving; stopping the others",
                        index,
                        pid,
                        _ended(exit_code),
                    )
                    code = exit_code if exit_code in (1, 2) else 1
                    self._stop()
                    continue
                log.error("worker %d (pid %d) %s; starting it again", index, pid, _ended(exit_code))
                self._spawn(index)
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            self._port.close()
            shutil.rmtree(self._metrics, ignore_errors=True)
        log.info("all %d workers stopped", self._count)
        return code

    def _spawn(self, index: int) -> None:
        ready, tell = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(ready)
            os._exit(self._child(index, tell))
        os.close(tell)
        self._running[pid] = (index, ready)
        log.info("worker %d started (pid %d)", index, pid)
        if self._stopping:  # a signal came between the fork and the line above
            _signal(pid, signal.SIGTERM)

    def _child(self, index: int, ready: int) -> int:
        """The forked worker's life, its exit code (it never unwinds into the supervisor)."""
        for signum in _STOP_SIGNALS:
            signal.signal(signum, signal.SIG_DFL)
        if not _stop_with(self._pid):
            return 1
        try:
            return self._work(Worker(index, self._port.for_worker(), self._metrics, ready))
        except BaseException:
            log.exception("worker %d failed", index)
            return 1
        finally:
            logging.shutdown()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        log.info("%s received: stopping %d workers", signal.Signals(signum).name, self._count)
        self._stop()

    def _stop(self) -> None:
        self._stopping = True
        for pid in list(self._running):
            _signal(pid, signal.SIGTERM)


def _stop_with(supervisor: int) -> bool:
    """Ask for SIGTERM when the supervisor dies (Linux); False if it has died already.

    A supervisor killed with SIGKILL cannot pass the signal on: without this its workers
    would serve on, orphaned. Elsewhere they do (nothing here is worth a dependency).
    """
    if sys.platform == "linux":
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    return os.getppid() == supervisor


def _was_ready(pipe: int) -> bool:
    """Whether the worker wrote to its ready pipe before it ended (the pipe is closed)."""
    os.set_blocking(pipe, False)
    try:
        return os.read(pipe, 1) == b"1"
    except BlockingIOError:
        return False
    finally:
        os.close(pipe)


def _signal(pid: int, signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):  # exited already: os.wait() collects it
        os.kill(pid, signum)


def _ended(exit_code: int) -> str:
    """How a worker ended, as a log line says it: `exited with 1`, `was killed by SIGKILL`."""
    if exit_code < 0:
        return f"was killed by {signal.Signals(-exit_code).name}"
    return f"exited with {exit_code}"
